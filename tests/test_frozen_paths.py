"""The module paths and names that shipped checkpoints import stay where they are.

Every checkpoint folder carries a copy of ``depthattn/hf/modeling.py`` and ``configuration.py`` (``trust_remote_code``);
those copies import ``depthattn`` modules by path. A restructure that moved one of them would break every checkpoint
already written, so the paths are listed here and checked against the tree: the copies in the release fixtures and in
the authors' fixtures, and the current ``hf`` files (whose imports the next checkpoints will carry).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

import depthattn

FIXTURES = Path(__file__).parent / "fixtures"
HF = Path(depthattn.__file__).parent / "hf"
#: The ``depthattn`` modules a shipped ``modeling.py`` / ``configuration.py`` may import, and the names it takes.
FROZEN = {
    "depthattn.checkpoint": {"load_config", "check_folder_shapes"},
    "depthattn.cache": {"KVCache"},
    "depthattn.checks": {"IGNORE_INDEX", "check_forward_inputs"},
    "depthattn.config": {"ModelConfig"},
    "depthattn.model": {"Backbone", "DecoderLM", "init_module_weights", "next_token_loss", "next_token_targets"},
    "depthattn.accounting": {"check_fits", "kv_cache_bytes"},
    "depthattn.fileio": {"file_states", "rewrite_manifest_entries"},
    "depthattn.functional": {"packed_document_ids"},
}


def remote_code_files() -> list[Path]:
    shipped = sorted(p for p in FIXTURES.rglob("*.py") if p.name in ("modeling.py", "configuration.py"))
    return shipped + [HF / "modeling.py", HF / "configuration.py"]


def depthattn_imports(path: Path) -> dict[str, set[str]]:
    """``{module: names}`` of every ``depthattn`` import in ``path`` (``from depthattn import checkpoint as x``
    counts as importing the module ``depthattn.checkpoint``)."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("depthattn"):
            for alias in node.names:
                if node.module == "depthattn":
                    out.setdefault(f"depthattn.{alias.name}", set())
                else:
                    out.setdefault(node.module, set()).add(alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("depthattn."):
                    out.setdefault(alias.name, set())
    return out


def test_the_shipped_files_import_only_frozen_paths():
    files = remote_code_files()
    assert len(files) >= 6  # four release checkpoints' pairs at least, and the current two
    for path in files:
        for module, names in depthattn_imports(path).items():
            assert module in FROZEN, f"{path} imports {module}, which is not in the frozen list"
            assert names <= FROZEN[module] | {"*"}, f"{path}: {sorted(names - FROZEN[module])} from {module}"


@pytest.mark.parametrize("module", sorted(FROZEN))
def test_every_frozen_path_and_name_is_still_there(module):
    mod = importlib.import_module(module)
    assert Path(mod.__file__).relative_to(Path(depthattn.__file__).parent).with_suffix("").as_posix() == (
        module.removeprefix("depthattn.").replace(".", "/"))  # a module, not a re-export under another file
    for name in FROZEN[module]:
        assert hasattr(mod, name), f"{module}.{name} is gone"


def test_a_release_checkpoints_own_modeling_py_imports_against_this_tree(tmp_path):
    """The fixture's copied ``modeling.py`` and ``configuration.py`` import as ``trust_remote_code`` would (as a
    package of their own) and define the model class over this tree's ``Backbone``."""
    from depthattn.model import Backbone

    ckpt = FIXTURES / "release-97f8652" / "run" / "checkpoints" / "step_00000004"
    package = tmp_path / "release_remote_code"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("modeling.py", "configuration.py"):
        (package / name).write_bytes((ckpt / name).read_bytes())
    sys.path.insert(0, str(tmp_path))
    try:
        modeling = importlib.import_module("release_remote_code.modeling")
        assert issubclass(modeling.DepthAttnForCausalLM, modeling.PreTrainedModel)
        assert modeling.Backbone is Backbone
        assert modeling.DepthAttnConfig.model_type == "depthattn"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("release_remote_code")]:
            del sys.modules[name]
