"""The code blocks of README.md and docs/*.md, and how the docs test treats each one.

Every fenced block carries a language tag and, on the line right above its opening fence, a marker::

    <!-- doctest: run -->                                   run as written
    <!-- doctest: run; replace "A" => "B"; replace ... -->  run with these substitutions (a tiny model, fewer steps,
                                                            a fixture in place of a long run's output)
    <!-- doctest: vllm -->                                  run in the vLLM environment (tests/serving/test_vllm.py)
    <!-- doctest: skip: REASON -->                          not run, and why (a GPU, a network, a cluster, a
                                                            separate environment, an output shown, not a command)

``bash`` blocks run with ``bash -euo pipefail``, ``python`` blocks with this interpreter; the blocks of one file run
in order in one folder (a fresh copy of the fixture below per file), so a block may use what an earlier one wrote.
In a substitution's replacement, ``$NAME`` names one of ``VARIABLES`` (expanded before the block runs, so a
``python`` block gets a literal path).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from authors_docs import SHAPE_FLAGS

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"bash", "python", "toml", "json", "yaml", "text"}
RUNNABLE = {"bash", "python"}

#: What a substitution may name: the folder fixture laid out for each file's blocks (see tests/docs/test_docs.py).
TINY_FLAGS = ("--preset tiny --set hidden_size=32 --set intermediate_size=64 --set num_attention_heads=2 "
              "--set num_key_value_heads=1 --set num_hidden_layers=3 --set depth_attention_stride=1 --steps 2 "
              "--set batch_size=2 --set seq_len=32 --set eval_every=1 --set eval_windows=2 --set eval_batch_size=2 "
              "--set tensorboard=false --no-progress")
VARIABLES = {
    "TINY": TINY_FLAGS,  # a 60k-parameter model, 2 steps: the command's path, not its result
    "DATA": "fixture/data",  # a prepared data folder (tests/fixtures/release-97f8652/data)
    "RUN": "fixture/run",  # a run folder with checkpoints (the old-release fixture, resumable)
    "CKPT": "fixture/run/checkpoints/step_00000004",  # a checkpoint folder (depth_attention)
    "NONE_RUN": "fixture/compare/runs/none-seed0",  # a finished run folder of a vanilla (cross_layer none) model
    # docs/authors-checkpoints.md: an authors'-format Depth-Attention folder (tests/authors_docs.py) whose 576-row
    # embedding pads the 512-token fixture tokenizer, and the flags of a depthattn model of its shape
    "AUTHORS_DA": "fixture/authors-da",
    "AUTHORS_TOKENIZER": "fixture/data/tokenizer.json",
    "AUTHORS_DA_FLAGS": SHAPE_FLAGS + " --set vocab_size=576 " + TINY_FLAGS.split(" --steps 2 ")[1],
    "NONE_CKPT": "fixture/compare/runs/none-seed0/checkpoints/step_00000006",  # its checkpoint
}

_FENCE = re.compile(r"^(\s*)```(.*)$")
_MARKER = re.compile(r"^\s*<!-- doctest: (run|vllm|skip)(.*?)-->\s*$")
_REPLACE = re.compile(r'^\s*replace "((?:[^"\\]|\\.)*)" => "((?:[^"\\]|\\.)*)"\s*$')


@dataclass
class Block:
    file: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    action: str | None  # run, vllm, skip; None: no marker
    detail: str  # the skip reason, or the raw substitutions
    replacements: list[tuple[str, str]]

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"

    def prepared(self) -> str:
        """The code with the marker's substitutions applied at once (``$NAME`` in a replacement expanded)."""
        table = {}
        for old, new in self.replacements:
            if old not in self.code:
                raise AssertionError(f"{self.where}: the marker replaces {old!r}, which the block does not contain")
            for name, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
                new = new.replace(f"${name}", value)
            table[old] = new
        if not table:
            return self.code
        # one pass, longest match first: a replacement's text is never replaced again
        pattern = re.compile("|".join(re.escape(o) for o in sorted(table, key=len, reverse=True)))
        return pattern.sub(lambda m: table[m.group(0)], self.code)


def _unescape(s: str) -> str:
    return s.replace('\\"', '"').replace("\\\\", "\\")


def parse_marker(text: str, where: str) -> tuple[str, str, list[tuple[str, str]]]:
    m = _MARKER.match(text)
    if not m:
        raise AssertionError(f"{where}: not a doctest marker: {text!r}")
    action, rest = m.group(1), m.group(2).strip()
    if action == "skip":
        reason = rest.removeprefix(":").strip()
        if not reason:
            raise AssertionError(f"{where}: a skip marker must give its reason (<!-- doctest: skip: REASON -->)")
        return action, reason, []
    replacements = []
    for part in filter(None, (p.strip() for p in rest.split(";"))):
        r = _REPLACE.match(part)
        if not r:
            raise AssertionError(f'{where}: cannot read {part!r}; write replace "OLD" => "NEW"')
        replacements.append((_unescape(r.group(1)), _unescape(r.group(2))))
    return action, rest, replacements


def blocks(file: Path) -> list[Block]:
    """The fenced blocks of ``file`` in order, with their markers (``AssertionError`` for an unclosed fence or a
    marker that does not parse)."""
    lines = file.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, language = m.group(1), m.group(2).strip()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        if j == len(lines):
            raise AssertionError(f"{file.relative_to(ROOT)}:{i + 1}: unclosed code fence")
        where = f"{file.relative_to(ROOT)}:{i + 1}"
        above = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        action, detail, repl = (parse_marker(above, where) if "<!-- doctest" in above else (None, "", []))
        code = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:j]) + "\n"
        out.append(Block(file, i + 1, language, code, action, detail, repl))
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for f in DOC_FILES for b in blocks(f)]
