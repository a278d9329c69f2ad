"""Golden losses: the first training losses of the default ``depthattn compare`` run (the run README.md reports) and
of every registered method on the tiny preset (``compare --quick``), retrained here and compared with the files
``scripts/readme_headline.py`` wrote under tests/golden/. A change that moves these numbers fails until the script is
rerun, so the README's result cannot silently go stale and no method's numerics drift unnoticed."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from depthattn.cross_layer import names

ROOT = Path(__file__).resolve().parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("readme_headline", ROOT / "scripts" / "readme_headline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


headline = _load_script()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The embedded corpus, prepared as ``depthattn compare`` prepares it."""
    return headline.prepared_corpus(tmp_path_factory.mktemp("compare"))


def _mismatches(got: list[float], want: list[float]) -> list[str]:
    if len(got) != len(want):
        return [f"{len(got)} losses logged, {len(want)} pinned"]
    return [f"step {i + 1}: {g!r} (pinned {w!r}, relative difference {abs(g - w) / abs(w):.2e})"
            for i, (g, w) in enumerate(zip(got, want)) if not math.isclose(g, w, rel_tol=headline.REL_TOL)]


def _golden(path: Path) -> dict:
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing: run `{headline.REGENERATE}`"
    return json.loads(path.read_text(encoding="utf-8"))


def test_default_run_first_losses_match_the_readme(corpus, tmp_path):
    golden = _golden(headline.DEFAULT_GOLDEN)
    got = headline.first_losses(tmp_path, golden["steps"], "--data", str(corpus))
    assert sorted(got) == sorted(golden["losses"]), (
        f"the default compare trains {sorted(got)}, the golden file pins {sorted(golden['losses'])}: run "
        f"`{headline.REGENERATE}`")
    problems = [f"{m} {line}" for m in got for line in _mismatches(got[m], golden["losses"][m])]
    assert not problems, (
        f"the default `depthattn compare` run no longer starts as the one README.md reports (commit "
        f"{golden['commit'][:7]}, {golden['torch']}); if the change is intended, run `{headline.REGENERATE}` to "
        f"rerun it and rewrite README.md's result, docs/img/compare_default.png and tests/golden/:\n"
        + "\n".join(problems))


@pytest.mark.parametrize("method", names())
def test_tiny_run_first_losses_match_the_golden_file(method, corpus, tmp_path):
    golden = _golden(headline.TINY_GOLDEN / f"{method}.json")
    got = headline.tiny_losses(method, corpus, tmp_path)
    problems = _mismatches(got, golden["losses"])
    assert not problems, (
        f"{method}: the first {golden['steps']} losses of `depthattn compare --quick` moved from "
        f"tests/golden/tiny/{method}.json (commit {golden['commit'][:7]}); if the change is intended, run "
        f"`{golden['regenerate']}`:\n" + "\n".join(problems))


def test_every_golden_file_names_a_registered_method():
    stale = sorted(p.stem for p in headline.TINY_GOLDEN.glob("*.json") if p.stem not in names())
    assert not stale, f"tests/golden/tiny/ pins unregistered methods {stale}: run `{headline.REGENERATE} --golden-only`"
