"""The README's default-run section, its figure and the golden-loss files, from one ``depthattn compare`` run.

    python scripts/readme_headline.py                 # run `depthattn compare` (defaults, into runs/compare), then write
    python scripts/readme_headline.py RUN_FOLDER      # read a finished default compare folder instead
    python scripts/readme_headline.py --golden-only   # rewrite only the per-method tiny golden files

Writes:

- README.md between ``<!-- headline:start -->`` and ``<!-- headline:end -->``: the run's verdict, numbers and limits
  (``depthattn.compare.conclusions``), a five-row table, the commit, torch version and CPU;
- docs/img/compare_default.png: the run's ``loss_curves.png``;
- tests/golden/compare_default_losses.json: the first ``DEFAULT_STEPS`` training losses of each method, read from the
  run's ``metrics.jsonl`` once this code has retrained them to the same values (a folder trained by other code is
  refused); ``tests/compare/test_golden_losses.py`` retrains those steps and compares;
- tests/golden/tiny/METHOD.json for every registered method: the first ``TINY_STEPS`` losses of
  ``depthattn compare --quick --methods METHOD`` (the tiny preset).

The run folder must hold a compare made with the default settings; anything else is refused with one line.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from depthattn.compare.settings import DEFAULT_OUT
from depthattn.layout import COMPARE_DATA_DIR, COMPARE_RUNS_DIR, PLOT_FILE, RESULTS_FILE, RUN_FILE

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIGURE = ROOT / "docs" / "img" / "compare_default.png"
GOLDEN = ROOT / "tests" / "golden"
DEFAULT_GOLDEN = GOLDEN / "compare_default_losses.json"
TINY_GOLDEN = GOLDEN / "tiny"
START = "<!-- headline:start: written by scripts/readme_headline.py from a `depthattn compare` run; do not edit -->"
END = "<!-- headline:end -->"

#: Logged steps of the default run pinned in the golden file (each a `small`-preset step of 1,024 tokens).
DEFAULT_STEPS = 3
#: Logged steps of each method's tiny run (`compare --quick`: 4 x 64 tokens a step).
TINY_STEPS = 8
REGENERATE = "python scripts/readme_headline.py"
#: Relative tolerance per logged loss, here and in the golden test: CPU float32 training is deterministic run to run;
#: the slack covers another thread count's summation order over a few steps, far below what a numerics change moves.
REL_TOL = 1e-4


# ----------------------------------------------------------------------------- training the first steps
def compare_args(out: Path, *flags: str) -> argparse.Namespace:
    """The parsed command line ``depthattn compare --out OUT FLAGS`` (the CLI's own parser)."""
    from depthattn.cli import build_parser

    return build_parser().parse_args(["compare", "--no-progress", "--out", str(out), *flags])


def first_losses(out: Path, steps: int, *flags: str) -> dict[str, list[float]]:
    """Per method, the first ``steps`` training losses of seed 0 of ``depthattn compare --out OUT FLAGS``: the same
    settings, model configs and data as the command (``compare_settings``, ``method_configs``), trained to ``steps``
    (``train(stop_after=...)``) under ``OUT/runs``. ``--data`` in ``flags`` reuses a prepared folder."""
    from depthattn.commands.compare_cmd import compare_settings
    from depthattn.compare.settings import method_configs, run_name
    from depthattn.run.folder import RunFolder
    from depthattn.training import train

    out, settings, data_dir = compare_settings(compare_args(out, *flags))
    seed = settings.seeds[0]
    losses = {}
    for method, cfg in method_configs(settings, data_dir).items():
        run_dir = out / COMPARE_RUNS_DIR / run_name(method, settings.loops, seed)
        train(run_dir, cfg, settings.train.replace(seed=seed), data_dir, stop_after=steps, progress=False,
              log=lambda _line: None)
        losses[method] = [r["loss"] for r in RunFolder(run_dir).read_metrics() if "loss" in r][:steps]
    return losses


def prepared_corpus(out: Path) -> Path:
    """The embedded corpus prepared as ``depthattn compare`` prepares it, into ``OUT/data``."""
    from depthattn.compare.settings import prepare_default_data

    return prepare_default_data(out, progress=False)


def tiny_losses(method: str, data_dir: Path, out: Path) -> list[float]:
    """The first ``TINY_STEPS`` losses of ``depthattn compare --quick --methods METHOD --data DATA_DIR``."""
    return first_losses(out, TINY_STEPS, "--quick", "--methods", method, "--data", str(data_dir))[method]


# ----------------------------------------------------------------------------- what the README names
def cpu_name() -> str:
    """This machine's CPU: /proc/cpuinfo's "model name", else ``platform.processor()``, else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def check_default_run(folder: Path) -> dict:
    """``folder``'s results.json, checked to be a compare made with the default settings (``SystemExit`` with one
    line otherwise)."""
    from depthattn.commands.compare_cmd import compare_settings

    results_file = folder / RESULTS_FILE
    if not results_file.is_file():
        raise SystemExit(f"{folder}: no results.json; give the folder of a finished `depthattn compare` run")
    results = json.loads(results_file.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:  # the default settings, without preparing any data
        _, settings, _ = compare_settings(compare_args(Path(tmp), "--data", str(folder / COMPARE_DATA_DIR)))
    want = {"methods": settings.methods, "seeds": settings.seeds, "loops": settings.loops, "preset": settings.preset,
            "model_overrides": settings.model_overrides,
            "train": settings.train.replace(steps=settings.train.total_steps()).to_dict(),
            "eval_tokens": settings.eval_tokens, "tasks": settings.tasks or []}
    got = {k: results["settings"].get(k) for k in want}
    diff = sorted(k for k in want if want[k] != got[k])
    if diff:
        raise SystemExit(f"{results_file}: not the default run (settings differ in {', '.join(diff)}); run "
                         f"`depthattn compare` with no flags but --out")
    return results


def run_record(folder: Path, method: str) -> dict:
    """The run.json of ``method``'s seed-0 run in a compare folder."""
    from depthattn.compare.settings import run_name

    return json.loads((folder / COMPARE_RUNS_DIR / run_name(method, 1, 0) / RUN_FILE).read_text(encoding="utf-8"))


def headline(results: dict, commit: str, torch_version: str, cpu: str) -> str:
    """The README's default-run section (markers included): three sentences, a five-row table, the figure and the
    machine line."""
    methods = results["methods"]
    names = list(methods)
    conclusion = results["conclusion"]
    verdict, limits = conclusion[0], conclusion[-1]
    first = methods[names[0]]["runs"][0]
    s = results["settings"]
    numbers = (f"Each model ({first['params']:,d} parameters, `{s['preset']}` preset) trained on {first['tokens']:,d} "
               f"tokens of the embedded public-domain corpus (seed {s['seeds'][0]}, same data order), and was "
               f"evaluated on the whole held-out split ({first['eval_tokens']:,d} tokens never trained on).")
    rows = (("validation loss (nats/token)", "val_loss", "{:.4f}"), ("perplexity", "perplexity", "{:.2f}"),
            ("bits per byte", "bits_per_byte", "{:.4f}"), ("parameters", "params", "{:,.0f}"),
            ("KV-cache bytes per token (bf16)", "kv_bytes_per_token", "{:,.0f}"))
    table = ["| | " + " | ".join(f"`{n}`" for n in names) + " |", "|---|" + "---:|" * len(names)]
    table += [f"| {label} | " + " | ".join(fmt.format(methods[n]["mean"][key]) for n in names) + " |"
              for label, key, fmt in rows]
    minutes, seconds = divmod(round(results["wall_seconds"]), 60)
    machine = (f"`depthattn compare` with no arguments: commit {commit[:7]}, torch {torch_version}, CPU {cpu}, "
               f"{minutes} min {seconds:02d} s in all (preparing the corpus, training, evaluating, sampling; wall time, so it "
               f"grows with whatever else the machine ran). "
               f"`{REGENERATE}` reruns it and rewrites this section, the figure and "
               f"`tests/golden/`; a test fails when the code changes this run's first losses and they were not "
               f"rewritten.")
    return "\n".join([
        START, "## Result of the default run", "",
        _wrap(f"**{verdict}** {numbers} {limits}"), "",
        *table, "",
        "![validation loss of the default run, its difference from none, and training loss]"
        "(docs/img/compare_default.png)", "",
        _wrap(machine), "",
        _wrap("Every study (three seeds, all seven methods, four and sixteen times the budget, another corpus) is in "
              "[docs/results.md](docs/results.md)."),
        END])


def _wrap(text: str) -> str:
    """A paragraph wrapped at the repository's line length (no word or hyphenated name broken)."""
    return textwrap.fill(text, width=118, break_long_words=False, break_on_hyphens=False)


def write_readme(section: str) -> None:
    """Replace the README's marked section with ``section`` (``SystemExit`` if the markers are missing)."""
    text = README.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{README}: no {START} ... {END} section to write")
    README.write_text(pattern.sub(lambda _m: section, text), encoding="utf-8")


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def logged_losses(folder: Path) -> dict[str, list[float]]:
    """Per method, the first ``DEFAULT_STEPS`` training losses seed 0 logged in a compare folder's metrics.jsonl."""
    from depthattn.compare.settings import run_name
    from depthattn.run.folder import RunFolder

    methods = json.loads((folder / RESULTS_FILE).read_text(encoding="utf-8"))["settings"]["methods"]
    return {m: [r["loss"] for r in RunFolder(folder / COMPARE_RUNS_DIR / run_name(m, 1, 0)).read_metrics() if "loss" in r]
            [:DEFAULT_STEPS] for m in methods}


def check_same_code(folder: Path, logged: dict[str, list[float]], work: Path) -> None:
    """``SystemExit`` (one line) unless this code retrains the run's first steps to the losses it logged: a folder
    trained by other code would put numbers in the README that the golden test cannot tie to this code."""
    again = first_losses(work, DEFAULT_STEPS, "--data", str(folder / COMPARE_DATA_DIR))
    moved = [m for m in logged if len(again.get(m, [])) != len(logged[m])
             or any(abs(a - b) > REL_TOL * abs(b) for a, b in zip(again[m], logged[m]))]
    if moved:
        raise SystemExit(f"{folder}: this code trains the first {DEFAULT_STEPS} steps of {', '.join(moved)} to other "
                         f"losses than the run logged (it was trained by other code); rerun `depthattn compare` "
                         f"into a new folder, or run this script without a folder")


def write_default_golden(losses: dict[str, list[float]], commit: str, torch_version: str, cpu: str) -> None:
    """tests/golden/compare_default_losses.json: the default run's first ``DEFAULT_STEPS`` losses per method."""
    write_json(DEFAULT_GOLDEN, {
        "what": f"the first {DEFAULT_STEPS} training losses of each method of `depthattn compare` (defaults), "
                f"the run README.md reports", "regenerate": REGENERATE, "commit": commit, "torch": torch_version,
        "cpu": cpu, "steps": DEFAULT_STEPS, "losses": losses})


def write_tiny_golden(data_dir: Path, work: Path, commit: str, torch_version: str, cpu: str) -> None:
    """tests/golden/tiny/METHOD.json for every registered method (stale files of unregistered methods removed)."""
    from depthattn.cross_layer import names

    TINY_GOLDEN.mkdir(parents=True, exist_ok=True)
    for old in TINY_GOLDEN.glob("*.json"):
        if old.stem not in names():
            old.unlink()
    for method in names():
        losses = tiny_losses(method, data_dir, work / method)
        write_json(TINY_GOLDEN / f"{method}.json", {
            "what": f"the first {TINY_STEPS} training losses of `depthattn compare --quick --methods {method}`",
            "regenerate": f"{REGENERATE} --golden-only", "commit": commit, "torch": torch_version, "cpu": cpu,
            "steps": TINY_STEPS, "losses": losses})
        print(f"wrote {(TINY_GOLDEN / f'{method}.json').relative_to(ROOT)}")


def current_commit() -> str:
    from depthattn.run.record import git_revision

    return git_revision() or "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", nargs="?", type=Path, default=None,
                   help="a finished default `depthattn compare` folder (default: run it into runs/compare)")
    p.add_argument("--golden-only", action="store_true", help="rewrite only tests/golden/tiny/")
    args = p.parse_args(argv)
    import torch

    cpu = cpu_name()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.golden_only:
            write_tiny_golden(prepared_corpus(work / "corpus"), work, current_commit(), torch.__version__, cpu)
            return 0
        folder = args.folder
        if folder is None:
            folder = ROOT / DEFAULT_OUT
            subprocess.run([sys.executable, "-m", "depthattn.cli", "compare", "--out", str(folder)], check=True)
        results = check_default_run(folder)
        logged = logged_losses(folder)
        check_same_code(folder, logged, work / "again")
        record = run_record(folder, results["settings"]["methods"][0])
        commit, torch_version = record.get("git_revision") or "unknown", record["versions"]["torch"]
        write_readme(headline(results, commit, torch_version, cpu))
        FIGURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / PLOT_FILE, FIGURE)
        write_default_golden(logged, commit, torch_version, cpu)
        print(f"wrote {README.relative_to(ROOT)}, {FIGURE.relative_to(ROOT)}, {DEFAULT_GOLDEN.relative_to(ROOT)}")
        write_tiny_golden(folder / COMPARE_DATA_DIR, work, current_commit(), torch.__version__, cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
