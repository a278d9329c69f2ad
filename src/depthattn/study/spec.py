"""A study file (TOML) and the parts it expands to.

A study is a grid of ``depthattn compare`` invocations. The file names the data, the preset, the methods, the
seeds, the budgets (multiples of one base number of optimizer steps) and any grid of ``--set`` axes (a learning-rate
grid is ``[grid] lr = [...]``)::

    name = "example"            # default: the file's stem
    out = "runs/study/example"  # the parts' folders (default runs/study/NAME); relative to the current folder
    data = "runs/data"          # a prepared data folder; default: the embedded corpus, prepared once into OUT/data
    publish = "results/study"   # where ``study publish`` writes one small file per part done (``study.publish``);
                                # with it, ``study run`` publishes each part as it finishes, and ``out`` and
                                # ``data`` must be relative (a published file names no folder of this machine)
    preset = "small"            # compare's --preset (required unless quick)
    quick = false               # compare's --quick (its tiny budget; a smoke test, not a result)
    methods = ["none", "depth_attention"]
    reference = "none"          # the method every other one is compared against (default: the first)
    seeds = [0, 1, 2]
    steps = 400                 # the 1 x budget in optimizer steps (default: compare's, 60 with quick)
    budgets = [1, 4]            # multiples of steps (each a whole number of steps)
    loops = 1                   # compare's --loops
    eval_tokens = 0             # compare's --eval-tokens (0: the whole validation split)
    per_method = false          # true: one part per method and seed (default: one per seed, every method)
    cells = [...]               # instead of [grid]: the cells as a list of tables of settings, e.g.
                                # [{depth_attention_stride = 1}, {depth_attention_window = 2}]

    [method_seeds]              # a method trained on fewer seeds than `seeds` (a subset of them)
    attnres = [0, 1]

    [set]                       # --set KEY=VALUE for every part (ModelConfig or TrainConfig keys)
    precision = "float32"

    [grid]                      # one part per combination of these values (with each budget and seed)
    lr = [1e-3, 2e-3]

    [method_set.depth_attention]  # --set KEY=VALUE for one method's parts only (needs per_method = true), e.g.
    lr = 0.004                    # each method at its own learning rate; keys as [set], none also in [set]/[grid]

    [slurm]                     # the SLURM launcher's defaults (flags win; ``runner.SLURM_KEYS``)
    partition = "gpu"

A **part** is one ``compare`` of every method with one seed (of one method with one seed with ``per_method``), in
``OUT/PART``; its name is its **cell** (the study's name, the budget and the grid values, e.g.
``example-b4-lr0.002``; the study's name alone when it has one budget and one cell) and ``-s<seed>`` (and
``-<method>`` with ``per_method``). Within a part every method trains with the same seed, so the same data order
(compare's rule); the report pairs the parts of one cell by seed. A method with ``[method_set.METHOD]`` settings
differs from the reference in those keys by design: the report pairs its runs with the reference's all the same
(``report.cell_stats``), and refuses a pair that differs in anything else.
"""

from __future__ import annotations

import itertools
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Top-level keys of a study file.
TOP_KEYS = frozenset({"name", "out", "data", "preset", "quick", "methods", "reference", "seeds", "steps", "budgets",
                      "loops", "eval_tokens", "set", "grid", "cells", "per_method", "method_seeds", "method_set",
                      "slurm", "publish"})
#: Settings a study sets with its own keys, so never through [set] or [grid].
OWN_KEYS = {"seed": "seeds", "steps": "steps and budgets", "tokens": "steps and budgets", "cross_layer": "methods",
            "num_loops": "loops"}
DEFAULT_ROOT = os.path.join("runs", "study")


@dataclass(frozen=True)
class Part:
    """One ``compare`` invocation of a study: ``methods`` (every method of the study that trains ``seed``; one with
    ``per_method``) with ``seed`` at ``budget`` x the base steps and the cell's settings ``axes`` (``(key, value)``
    pairs, in the file's order), in ``folder``."""

    name: str
    cell: str
    seed: int
    budget: float
    steps: int
    axes: tuple[tuple[str, Any], ...]
    folder: Path
    methods: tuple[str, ...] = ()


@dataclass(frozen=True)
class Study:
    """A study file, read and checked (``load_study``). Paths are absolute; ``named`` holds ``out`` and ``data`` as
    the file names them (``out`` defaulting to ``runs/study/NAME``; ``data`` absent without one)."""

    path: Path
    name: str
    out: Path
    data: Path | None
    preset: str | None
    quick: bool
    methods: tuple[str, ...]
    reference: str
    seeds: tuple[int, ...]
    steps: int
    budgets: tuple[float, ...]
    loops: int
    eval_tokens: int
    sets: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    slurm: dict[str, Any] = field(default_factory=dict)
    cell_list: tuple[tuple[tuple[str, Any], ...], ...] = ()
    per_method: bool = False
    method_seeds: dict[str, tuple[int, ...]] = field(default_factory=dict)
    publish: Path | None = None
    named: dict[str, str] = field(default_factory=dict)
    method_sets: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        """The prepared data every part trains on: ``data``, else ``OUT/data`` (the embedded corpus)."""
        from ..layout import COMPARE_DATA_DIR

        return self.data if self.data is not None else self.out / COMPARE_DATA_DIR

    def cells(self) -> list[tuple[tuple[str, Any], ...]]:
        """The settings of each cell of one budget: ``cells`` as listed, else the product of the grid (the file's
        order of keys, each key's order of values)."""
        if self.cell_list:
            return list(self.cell_list)
        keys = list(self.grid)
        return [tuple(zip(keys, values)) for values in itertools.product(*(self.grid[k] for k in keys))]

    def seed_methods(self, seed: int) -> tuple[str, ...]:
        """The methods that train ``seed`` (all but those whose ``method_seeds`` leave it out), in the file's order."""
        return tuple(m for m in self.methods if seed in self.method_seeds.get(m, self.seeds))

    def parts(self) -> list[Part]:
        """Every part: budgets, then cells (``cells``), then seeds, then (``per_method``) methods. A study of one
        budget and one cell names its cell after itself; else a cell is the study's name, ``b<budget>`` (with two
        budgets or more) and its settings, so part names stay unique across studies (one published folder)."""
        cells = self.cells()
        single = len(self.budgets) == 1 and len(cells) == 1
        out = []
        for budget in self.budgets:
            for axes in cells:
                cell = self.name if single else "-".join(
                    [self.name] + ([f"b{budget:g}"] if len(self.budgets) > 1 else [])
                    + [f"{k}{_word(v)}" for k, v in axes])
                for seed in self.seeds:
                    methods = self.seed_methods(seed)
                    groups = [(f"-{m}", (m,)) for m in methods] if self.per_method else [("", methods)]
                    for tail, which in groups:
                        name = f"{cell}-s{seed}{tail}"
                        out.append(Part(name, cell, seed, budget, round(self.steps * budget), axes, self.out / name,
                                        which))
        return out

    def method_set_keys(self, *methods: str) -> frozenset[str]:
        """The keys ``[method_set]`` sets for any of ``methods`` (for every method when none is named): the settings
        in which runs of those methods may differ by design and still be paired."""
        return frozenset(k for m in (methods or self.methods) for k in self.method_sets.get(m, {}))

    def compare_argv(self, part: Part) -> list[str]:
        """The ``depthattn compare`` arguments of ``part`` (without the program name): [set], the cell's settings and,
        with ``per_method``, the [method_set] settings of the part's method, each as ``--set KEY=VALUE``."""
        argv = ["compare", "--methods", ",".join(part.methods), "--seeds", str(part.seed), "--out", str(part.folder),
                "--steps", str(part.steps), "--data", str(self.data_dir), "--no-progress"]
        if self.quick:
            argv.append("--quick")
        if self.preset:
            argv += ["--preset", self.preset]
        if self.loops != 1:
            argv += ["--loops", str(self.loops)]
        if self.eval_tokens:
            argv += ["--eval-tokens", str(self.eval_tokens)]
        for key, value in self.part_settings(part).items():
            argv += ["--set", f"{key}={set_value(value)}"]
        return argv

    def part_settings(self, part: Part) -> dict[str, Any]:
        """The ``--set`` settings of ``part``, in order: [set], the cell's settings and, with ``per_method``, the
        [method_set] settings of the part's method."""
        own = self.method_sets.get(part.methods[0], {}) if self.per_method else {}
        return dict([*self.sets.items(), *part.axes, *own.items()])


def _word(value: Any) -> str:
    """A grid value as it appears in a part's name (``0.002``, ``true``, ``cuda``)."""
    text = set_value(value).strip('"')
    return "".join(c if c.isalnum() or c in "._+-" else "_" for c in text)


def set_value(value: Any) -> str:
    """A TOML value as ``--set`` reads it back (``training.config.parse_value``): booleans ``true``/``false``,
    numbers and lists as JSON (TOML reads it the same), strings quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def _need(ok: bool, path: Path, message: str) -> None:
    if not ok:
        raise ValueError(f"{path}: {message}")


def _int_list(doc: dict, key: str, path: Path, positive: bool = False) -> tuple[int, ...]:
    value = doc[key]
    _need(isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
          path, f"`{key} = {value!r}` must be a non-empty list of integers")
    _need(len(set(value)) == len(value), path, f"`{key} = {value!r}` lists a value twice")
    _need(not positive or min(value) >= 1, path, f"`{key} = {value!r}` must be >= 1")
    return tuple(value)


def load_study(path: str | os.PathLike) -> Study:
    """Read and check a study file. Raises ``FileNotFoundError`` for a missing file and ``ValueError`` in one line
    naming the file and the key for invalid TOML, an unknown key, a method not in ``cross_layer.names()``, an empty
    or repeated list, a budget that is not a whole number of steps, a [set]/[grid]/[method_set] key that is neither
    a ``ModelConfig`` nor a ``TrainConfig`` field or that the study sets itself (``OWN_KEYS``), a [method_set] table
    without ``per_method = true``, of a method not in ``methods`` or with a key also in [set]/[grid]/cells,
    settings that ``ModelConfig.from_preset`` / ``TrainConfig`` refuse, or, in a study that names ``publish``, an
    absolute ``out`` or ``data`` (``check_portable``)."""
    from ..compare.settings import DEFAULT_TRAIN, QUICK, parse_methods

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"study file {path} not found")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a TOML file (not UTF-8 text)") from None
    unknown = sorted(set(doc) - TOP_KEYS)
    _need(not unknown, path, f"unknown key(s) {unknown}; a study file has {sorted(TOP_KEYS)}")
    for key in ("methods", "seeds"):
        _need(key in doc, path, f"`{key}` is missing")
    methods_value = doc["methods"]
    _need(isinstance(methods_value, list) and all(isinstance(m, str) for m in methods_value), path,
          f"`methods = {methods_value!r}` must be a list of method names")
    try:
        methods = tuple(parse_methods(",".join(methods_value)))
    except ValueError as e:
        raise ValueError(f"{path}: {e}".replace("--methods", "methods")) from None
    reference = doc.get("reference", methods[0])
    _need(reference in methods, path, f"`reference = {reference!r}` is not one of methods {list(methods)}")
    seeds = _int_list(doc, "seeds", path)
    quick = doc.get("quick", False)
    _need(isinstance(quick, bool), path, f"`quick = {quick!r}` must be true or false")
    steps = doc.get("steps", (QUICK["train"] if quick else DEFAULT_TRAIN)["steps"])
    _need(isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1, path,
          f"`steps = {steps!r}` must be an integer >= 1")
    budgets = doc.get("budgets", [1])
    _need(isinstance(budgets, list) and budgets and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                                         and b > 0 for b in budgets), path,
          f"`budgets = {budgets!r}` must be a non-empty list of positive numbers (multiples of steps)")
    _need(len(set(budgets)) == len(budgets), path, f"`budgets = {budgets!r}` lists a value twice")
    for b in budgets:
        _need(abs(steps * b - round(steps * b)) < 1e-9 and round(steps * b) >= 1, path,
              f"budget {b} x steps {steps} is not a whole number of steps")
    loops = doc.get("loops", 1)
    _need(isinstance(loops, int) and not isinstance(loops, bool) and loops >= 1, path,
          f"`loops = {loops!r}` must be an integer >= 1")
    eval_tokens = doc.get("eval_tokens", 0)
    _need(isinstance(eval_tokens, int) and not isinstance(eval_tokens, bool) and eval_tokens >= 0, path,
          f"`eval_tokens = {eval_tokens!r}` must be an integer >= 0 (0: the whole validation split)")
    _need("preset" in doc or quick, path, "`preset` is missing (say which, e.g. preset = \"small\"; only a quick "
          "study has compare's --quick preset)")
    for key in ("name", "out", "data", "preset", "publish"):
        _need(key not in doc or (isinstance(doc[key], str) and doc[key]), path,
              f"`{key} = {doc.get(key)!r}` must be a non-empty string")
    per_method = doc.get("per_method", False)
    _need(isinstance(per_method, bool), path, f"`per_method = {per_method!r}` must be true or false")
    tables = {}
    for key in ("set", "grid", "slurm", "method_seeds", "method_set"):
        tables[key] = doc.get(key, {})
        _need(isinstance(tables[key], dict), path, f"[{key}] must be a table")
    grid = {}
    for key, values in tables["grid"].items():
        _need(isinstance(values, list) and values, path, f"[grid] `{key} = {values!r}` must be a non-empty list")
        _need(len({set_value(v) for v in values}) == len(values), path, f"[grid] `{key}` lists a value twice")
        grid[key] = tuple(values)
    cell_list = _cells(doc, path)
    _need(not (cell_list and grid), path, "`cells` and [grid] both given: list the cells, or give the grid")
    cell_keys = {k for cell in cell_list for k, _ in cell}
    both = sorted((set(grid) | cell_keys) & set(tables["set"]))
    _need(not both, path, f"{both} in both [set] and [grid]/cells")
    method_seeds = {}
    for method, values in tables["method_seeds"].items():
        _need(method in methods, path, f"[method_seeds] `{method}` is not one of methods {list(methods)}")
        chosen = _int_list(tables["method_seeds"], method, path)
        _need(set(chosen) <= set(seeds), path, f"[method_seeds] `{method} = {list(chosen)}` names a seed not in "
              f"seeds {list(seeds)}")
        method_seeds[method] = chosen
    method_sets = _method_sets(tables["method_set"], methods, per_method, set(tables["set"]) | set(grid) | cell_keys,
                               path)
    lonely = [s for s in seeds if not any(s in method_seeds.get(m, seeds) for m in methods)]
    _need(not lonely, path, f"seed {lonely[0] if lonely else ''} trains no method ([method_seeds] leave it out)")
    name = doc.get("name", path.stem)
    named = {"out": doc.get("out", os.path.join(DEFAULT_ROOT, name)),
             **({"data": doc["data"]} if "data" in doc else {})}
    study = Study(path=path.resolve(), name=name, out=Path(named["out"]).absolute(),
                  data=Path(doc["data"]).absolute() if "data" in doc else None, preset=doc.get("preset"),
                  quick=quick, methods=methods, reference=reference, seeds=seeds, steps=steps,
                  budgets=tuple(budgets), loops=loops, eval_tokens=eval_tokens, sets=dict(tables["set"]), grid=grid,
                  slurm=dict(tables["slurm"]), cell_list=cell_list, per_method=per_method,
                  method_seeds=method_seeds, method_sets=method_sets,
                  publish=Path(doc["publish"]).absolute() if "publish" in doc else None, named=named)
    if study.publish is not None:
        check_portable(study)
    _check_settings(study)
    return study


def check_portable(study: Study) -> None:
    """``ValueError`` naming the file and the key if the study's ``out`` or ``data`` is an absolute path: a
    published part names them as the file does, and must name no folder of the machine that ran it."""
    for key, value in study.named.items():
        _need(not os.path.isabs(value), study.path, f"`{key} = {value!r}` is an absolute path; a published study "
              f"names its folders relative to the current folder (its files must name no folder of this machine)")


def _method_sets(table: dict, methods: tuple[str, ...], per_method: bool, elsewhere: set[str], path: Path
                 ) -> dict[str, dict[str, Any]]:
    """The [method_set] tables of a study file, checked: ``per_method`` set, each a table of a method of
    ``methods`` whose keys are in none of [set], [grid] and cells (``elsewhere``)."""
    _need(not table or per_method, path, "[method_set] needs `per_method = true` (one part per method, so each "
          "method's runs take its own settings)")
    out = {}
    for method, settings in table.items():
        _need(method in methods, path, f"[method_set.{method}]: `{method}` is not one of methods {list(methods)}")
        _need(isinstance(settings, dict), path, f"[method_set] `{method} = {settings!r}` must be a table "
              f"([method_set.{method}] with KEY = VALUE lines)")
        both = sorted(set(settings) & elsewhere)
        _need(not both, path, f"{both} in both [method_set.{method}] and [set]/[grid]/cells")
        out[method] = dict(settings)
    return out


def _cells(doc: dict, path: Path) -> tuple[tuple[tuple[str, Any], ...], ...]:
    """The ``cells`` list of a study file as ``((key, value), ...)`` per cell (empty without one)."""
    value = doc.get("cells", [])
    _need(isinstance(value, list) and all(isinstance(c, dict) for c in value) and ("cells" not in doc or value),
          path, f"`cells = {value!r}` must be a non-empty list of tables of settings")
    cells = tuple(tuple(c.items()) for c in value)
    words = [tuple((k, set_value(v)) for k, v in c) for c in cells]
    _need(len(set(words)) == len(words), path, "`cells` lists a cell twice")
    return cells


def _check_settings(study: Study) -> None:
    """Every cell's [set] and [grid] values, with each method's [method_set], as ``compare`` would take them: known
    keys, none the study sets itself, values the configs accept (``ValueError`` naming the file)."""
    from ..compare.settings import DEFAULT_TRAIN, QUICK
    from ..config import ModelConfig
    from ..training import TrainConfig
    from ..training.config import split_overrides

    path = study.path
    for key in [*study.sets, *study.grid, *(k for cell in study.cell_list for k, _ in cell)]:
        _need(key not in OWN_KEYS, path, f"`{key}` in [set]/[grid]: the study sets it with `{OWN_KEYS.get(key)}`")
    for method, settings in study.method_sets.items():
        for key in settings:
            _need(key not in OWN_KEYS, path, f"`{key}` in [method_set.{method}]: the study sets it with "
                  f"`{OWN_KEYS.get(key)}`")
    preset = study.preset or QUICK["preset"]
    cells = {p.cell: p for p in study.parts()}
    for part in cells.values():
        for method in study.methods:
            own = study.method_sets.get(method, {})
            which = f"part {part.cell}" + (f" [method_set.{method}]" if own else "")
            try:
                model, train = split_overrides({**study.sets, **dict(part.axes), **own},
                                               f"{path} [set]/[grid]" + (f"/[method_set.{method}]" if own else ""))
                ModelConfig.from_preset(preset, **{k: v for k, v in model.items() if k != "vocab_size"},
                                        cross_layer=method, num_loops=study.loops)
                base = dict(QUICK["train"] if study.quick else DEFAULT_TRAIN)
                TrainConfig.from_dict({**base, **train, "steps": part.steps}).total_steps()
            except ValueError as e:
                message = str(e)
                raise ValueError(message if message.startswith(str(path)) else f"{path}: {which}: {message}"
                                 ) from None


def find_parts(study: Study, names: list[str]) -> list[Part]:
    """The parts named ``names`` (every part when empty), in the study's order; ``ValueError`` naming an unknown
    one."""
    parts = study.parts()
    if not names:
        return parts
    known = {p.name for p in parts}
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"{study.path}: no part {bad[0]!r} (`depthattn study status {study.path}` lists them)")
    return [p for p in parts if p.name in set(names)]
