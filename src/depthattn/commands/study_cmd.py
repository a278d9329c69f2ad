"""``depthattn study run | status | report | publish FILE``: a grid of compares described by one TOML file
(docs/study.md)."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from ..fileio import atomic_write_text

#: The published small-scale study: its study files and the report ``--published`` writes by default.
PUBLISHED_STUDIES = "studies/small-scale"
PUBLISHED_OUT = "docs/results.md"

DESCRIPTION = """A study file (TOML; docs/study.md, studies/example.toml) names the data, preset, methods, seeds,
budgets (multiples of a number of steps) and any grid of --set axes; it expands to parts, one `depthattn compare`
each (every method with one seed). `run` trains the parts not done (a part interrupted is resumed, finished runs are
reused: compare's own rules), here or as a SLURM job array; `status` lists done / running / incomplete / missing
parts; `report` writes the paired statistics against the reference method and the trends as markdown; `publish`
writes one small file per part done, to commit (with `publish = "DIR"` in the file, `run` publishes each part as it
finishes)."""


def _study(args: argparse.Namespace):
    from ..study import load_study

    return load_study(args.file)


def run_cmd(args: argparse.Namespace) -> int:
    """Train the study's parts that are not done (or the PART names given)."""
    from ..study import partfile
    from ..study.runner import prepare_data, run_local, todo
    from ..study.spec import find_parts

    study = _study(args)
    parts = find_parts(study, args.parts)
    skipped = 0
    if args.skip_published:
        if study.publish is None:
            raise ValueError(f"--skip-published: {study.path} names no `publish` folder (add publish = \"DIR\")")
        kept = [p for p in parts if not partfile.path(study.publish, p.name).is_file()]
        parts, skipped = kept, len(parts) - len(kept)
    if args.slurm:
        flags = {"partition": args.partition, "gpus_per_node": args.gpus, "timeout_min": args.time,
                 "cpus_per_task": args.cpus, "array_parallelism": args.jobs_at_once}
        try:
            from ..study import slurm
        except ImportError:
            raise ValueError("--slurm needs submitit: pip install 'depthattn[cluster]'") from None
        slurm.slurm_parameters(study, flags)  # a bad [slurm] key before any data work
    prepare_data(study, progress=not args.no_progress)
    pending = todo(study, parts)
    if not pending:
        print(f"{study.path}: every part is done ({len(parts)}" + (f"; {skipped} more published" if skipped else "")
              + f"); `depthattn study report {args.file}` writes the tables")
        return 0
    if args.slurm:
        jobs = slurm.submit(study, pending, flags, commit=args.commit)
        print(f"submitted {len(jobs)} part(s) as SLURM job array {jobs[0].job_id.split('_')[0]} (logs under "
              f"{study.out / slurm.SUBMITIT_DIR})")
        return 0
    print(f"{len(pending)} part(s) to train, {args.jobs} at once; output under {study.out}/logs")
    on_done = None if study.publish is None else functools.partial(_publish_one, study)
    failed = run_local(study, pending, args.jobs, commit=args.commit, on_done=on_done)
    if failed:
        print(f"depthattn study run: {len(failed)} of {len(pending)} part(s) failed: {', '.join(failed)}; run the "
              f"study again to resume them", file=sys.stderr)
        return 1
    return 0


def _publish_one(study, part) -> str:
    """Publish a part that just finished to the study's ``publish`` folder; returns the line saying where."""
    from ..study.publish import publish_part

    return f"published to {publish_part(study, part, study.publish)}"


def _publish_dir(study, given: str | None) -> Path:
    """Where a study's parts are published: ``--to``, else the file's ``publish``; ``ValueError`` without either."""
    if given is not None:
        return Path(given)
    if study.publish is None:
        raise ValueError(f"{study.path} names no `publish` folder; give --to DIR (or add publish = \"DIR\" to it)")
    return study.publish


def publish_cmd(args: argparse.Namespace) -> int:
    """Write TO/PART.json for every part that is done (or the PART names given, each of which must be done): its
    compare results, settings, curves, depth statistics, and the commits and machines it ran on."""
    from ..study.publish import not_done, publish_part, target
    from ..study.spec import check_portable, find_parts

    study = _study(args)
    check_portable(study)
    to = _publish_dir(study, args.to)
    parts = find_parts(study, args.parts)
    waiting = not_done(study, parts)
    if args.parts and waiting:
        raise ValueError(f"{study.path}: part(s) not done: {', '.join(f'{p.name} ({state})' for p, state in waiting)}"
                         f"; `depthattn study status {args.file}` lists them")
    done = [p for p in parts if p.name not in {w.name for w, _ in waiting}]
    for part in done:  # every target checked before any is written
        target(study, part, to)
    for part in done:
        print(f"{part.name}: published to {publish_part(study, part, to)}")
    print(f"published {len(done)} of {len(parts)} part(s) to {to}" + (f"; not done: {len(waiting)}" if waiting
                                                                        else ""))
    return 0


def status_cmd(args: argparse.Namespace) -> int:
    """List every part: done, running, incomplete (interrupted: `run` resumes it) or missing."""
    from ..study.status import render_status, study_status

    print(render_status(study_status(_study(args))))
    return 0


def report_cmd(args: argparse.Namespace) -> int:
    """Write the study's tables (markdown) to --out (default OUT/report.md of the study); with --published, the
    report of a published study (docs/results.md) from its study files and published parts."""
    from ..layout import REPORT_FILE
    from ..study.report import render

    if args.readme and args.published is None:
        raise ValueError("study report: --readme goes with --published (the lead of a published study)")
    if (args.file is None) == (args.published is None):
        raise ValueError("study report: give a study FILE, or --published FOLDER (a published study), not both")
    if args.published is not None:
        from ..study.results_page import aggregate

        out = Path(args.out or PUBLISHED_OUT)
        text = aggregate(Path(args.studies), Path(args.published), out)
        print(f"wrote {out}")
        if args.readme:
            from ..study.lead import replace_block

            readme = Path(args.readme)
            try:
                old = readme.read_text(encoding="utf-8")
            except OSError as e:
                raise ValueError(f"--readme {readme}: cannot read it: {e}") from None
            atomic_write_text(readme, replace_block(old, text, f"--readme {readme}"))
            print(f"wrote the lead of {readme}")
        return 0
    study = _study(args)
    out = Path(args.out) if args.out else study.out / REPORT_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    text = render(study, figure=out.with_name(f"{out.stem}_delta.png"))
    atomic_write_text(out, text)
    print(f"wrote {out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("study", help="a grid of compares from one TOML file: run, status, report",
                              description=DESCRIPTION)
    sub = p.add_subparsers(dest="study_command", metavar="SUBCOMMAND")
    sub.required = True
    r = sub.add_parser("run", help=run_cmd.__doc__, description=run_cmd.__doc__)
    r.add_argument("file", metavar="FILE", help="the study file (TOML)")
    r.add_argument("parts", nargs="*", metavar="PART", help="only these parts (default: every part not done)")
    r.add_argument("--jobs", type=int, default=1, help="parts trained at once on this machine (default 1)")
    r.add_argument("--slurm", action="store_true", help="submit the parts as one SLURM job array (submitit)")
    r.add_argument("--partition", default=None, help="SLURM partition (default: the file's [slurm] partition)")
    r.add_argument("--gpus", type=int, default=None, help="GPUs per part (SLURM gpus_per_node)")
    r.add_argument("--time", type=int, default=None, metavar="MINUTES", help="time limit per part (SLURM); a part "
                   "that reaches it checkpoints and is requeued")
    r.add_argument("--cpus", type=int, default=None, help="CPUs per part (SLURM cpus_per_task)")
    r.add_argument("--jobs-at-once", type=int, default=None, help="SLURM array parallelism (default: the file's, "
                   "else every part)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar while preparing the data")
    r.add_argument("--commit", default=None, help="the code's commit, recorded with each part's start where this "
                   "checkout has no git history (a copy); default: git rev-parse HEAD")
    r.add_argument("--skip-published", action="store_true", help="leave out the parts already published in the "
                   "file's `publish` folder (a fresh machine: no run folders, the published files)")
    r.set_defaults(func=run_cmd)
    s = sub.add_parser("status", help=status_cmd.__doc__, description=status_cmd.__doc__)
    s.add_argument("file", metavar="FILE", help="the study file (TOML)")
    s.set_defaults(func=status_cmd)
    o = sub.add_parser("report", help=report_cmd.__doc__, description=report_cmd.__doc__)
    o.add_argument("file", metavar="FILE", nargs="?", help="the study file (TOML)")
    o.add_argument("--out", default=None, help=f"the markdown file to write (default OUT/report.md; with --published "
                   f"{PUBLISHED_OUT})")
    o.add_argument("--published", default=None, metavar="FOLDER", help="report a published study instead: its parts' "
                   "files in FOLDER (e.g. results/small-scale) and its study files in --studies")
    o.add_argument("--studies", default=PUBLISHED_STUDIES, metavar="FOLDER", help="with --published: the study "
                   f"files, one per group (default {PUBLISHED_STUDIES})")
    o.add_argument("--readme", default=None, metavar="FILE", help="with --published: also replace the lead block "
                   "(<!-- lead:start --> … <!-- lead:end -->) of FILE, e.g. README.md, with the report's")
    o.set_defaults(func=report_cmd)
    b = sub.add_parser("publish", help=publish_cmd.__doc__, description=publish_cmd.__doc__)
    b.add_argument("file", metavar="FILE", help="the study file (TOML)")
    b.add_argument("parts", nargs="*", metavar="PART", help="only these parts (each must be done; default: every "
                   "part that is done)")
    b.add_argument("--to", default=None, metavar="DIR", help="the folder of the published files (default: the "
                   "file's `publish`)")
    b.set_defaults(func=publish_cmd)
