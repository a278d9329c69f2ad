"""The record of a part's starts (``study.invocations``): one JSON line per start, appended durably."""

from __future__ import annotations

import json

from depthattn.study.invocations import Invocation


def test_a_start_after_a_torn_line_is_its_own_line(tmp_path):
    file = tmp_path / "logs" / "part.jsonl"
    first = Invocation(file, "depthattn compare --methods none", "cpu", 2, commit="0123abcd").record()
    with open(file, "a", encoding="utf-8") as f:
        f.write('{"started_utc": "2026-')  # a launcher killed while writing its line
    second = Invocation(file, "depthattn compare --methods none", "cpu", 1, commit="4567ef01").record()
    lines = file.read_text(encoding="utf-8").split("\n")
    assert lines[1] == '{"started_utc": "2026-' and lines[-1] == ""
    assert [json.loads(line) for line in (lines[0], lines[2])] == [first, second]
    assert (second["commit"], second["jobs"]) == ("4567ef01", 1) and second["hardware"].endswith(
        f"torch {__import__('torch').__version__}")
