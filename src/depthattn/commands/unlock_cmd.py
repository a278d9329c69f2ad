"""``depthattn unlock``: remove the stale lock of a run (or compare) folder whose holder is gone."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Remove the lock file (depthattn.lock) that a trainer or compare left in RUN when it was killed on a file system
without working flock (Lustre mounted noflock). Refused while any process holds the file's flock; without flock,
refused while the holder is a live process of this host or its heartbeat is fresh: the file was written less than
5 minutes ago on the file system's own clock (its mtime against a file created beside it), whatever the clocks of
the holder's node and this one say. Where flock works (local disks, NFS, Lustre flock mounts) a killed holder's lock
is released by the kernel (on NFS, a dead client's when its lease expires) and unlock is not needed.
See docs/training-at-scale.md, "The run folder's lock".
"""


def run(args: argparse.Namespace) -> int:
    from ..run.lock import RunLock

    RunLock.unlock(args.run)  # RunFolderLocked (a ValueError: exit 2) while the holder may be alive
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("unlock", help="remove the stale lock of a run folder whose trainer is gone",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="run folder (or compare --out folder)")
    p.set_defaults(func=run)
