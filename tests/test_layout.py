"""Package layout: the library and the light CLI commands stay free of transformers (issue 8); the package ships
its ``py.typed`` marker.

transformers is imported by the Hugging Face bridge (``depthattn.hf``) only; ``import depthattn``, ``depthattn
--help`` and ``depthattn inspect`` must not pay for it. Each check runs in a fresh interpreter.
"""

from __future__ import annotations

import importlib.resources
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import machine_timeout

IMPORTED = "import sys; print('transformers' in sys.modules, 'depthattn.hf' in sys.modules)"


def fresh_python(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=machine_timeout(120))
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("code", [
    "import depthattn",
    "import depthattn.cli",
    "from depthattn.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0",
    "from depthattn.cli import main\nassert main(['inspect', '--preset', 'tiny']) == 0",
], ids=["import", "import-cli", "help", "inspect"])
def test_library_and_light_commands_do_not_import_transformers(code):
    assert fresh_python(f"{code}\n{IMPORTED}") == "False False"


def test_the_hf_bridge_registers_itself_when_imported():
    code = ("import depthattn.hf, sys; from transformers import AutoConfig, AutoModelForCausalLM; "
            "from depthattn.hf import DepthAttnConfig, DepthAttnForCausalLM; "
            "cfg = AutoConfig.for_model('depthattn'); "
            "print(type(cfg) is DepthAttnConfig, AutoModelForCausalLM._model_mapping[DepthAttnConfig] is "
            "DepthAttnForCausalLM)")
    assert fresh_python(code) == "True True"


def test_the_package_ships_py_typed():
    """pyproject.toml declares the marker as package data; the file must exist for the wheel to carry it."""
    assert importlib.resources.files("depthattn").joinpath("py.typed").is_file()
    assert '"py.typed"' in (Path(__file__).parents[1] / "pyproject.toml").read_text()
