"""The comparison's report and its progress: the report says its curves and its table use other validation sets,
``compare --quick`` runs the whole job and estimates its duration, the estimate counts the runs still to go."""

from __future__ import annotations

import pytest

from depthattn.cli import main


def test_the_report_says_its_curves_and_its_table_use_other_validation_sets():
    """The plot's periodic validation (a few windows) and the table's final evaluation (the whole split) differ;
    the report says so rather than leaving two numbers that disagree."""
    from depthattn.compare import render_report

    from helpers import hand_made_results as results

    res = results()
    res["settings"]["train"]["eval_windows"] = 16
    text = render_report(res)
    assert "on at most 16 windows (" in text and "so the two need not agree" in text


@pytest.mark.slow
def test_compare_quick_runs_the_whole_job_and_estimates_its_duration(tmp_path, capsys):
    """--quick: the tiny preset and the quick budget where no flag says otherwise (here a shorter --steps and a
    prepared --data), one estimate line once the first steps are timed, the report, the plot."""
    import json

    from release_fixtures import copy_release_fixture

    copy_release_fixture("reference", tmp_path)  # brings the prepared data folder
    out = tmp_path / "quick"
    assert main(["compare", "--quick", "--steps", "13", "--data", str(tmp_path / "data"), "--out", str(out),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    estimates = [ln for ln in text.splitlines() if ln.startswith("estimate: about ")]
    assert len(estimates) == 2 and "and 1 more run" in estimates[0] and "over steps 2-11" in estimates[0]
    assert "more run" not in estimates[1] and "over steps 2-11" in estimates[1]  # measured again for the 2nd run
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["preset"] == "tiny" and res["settings"]["eval_tokens"] == 16384
    assert res["settings"]["train"]["steps"] == 13 and res["settings"]["train"]["seq_len"] == 64
    assert (out / "loss_curves.png").read_bytes()[:4] == b"\x89PNG" and (out / "report.md").is_file()


def test_the_estimate_counts_the_runs_still_to_go():
    from depthattn.compare import DurationEstimate

    lines: list[str] = []
    est = DurationEstimate(3, lines.append)
    est.next_run()
    for step in range(1, 13):
        est.on_step(step, 100)
    assert len(lines) == 1 and lines[0].startswith("estimate: about ") and "and 2 more runs" in lines[0]
    assert "over steps 2-11" in lines[0]
    est.next_run()  # the next run measures again (the machine's load changes), once
    for step in range(1, 40):
        est.on_step(step, 100)
    assert len(lines) == 2 and "and 1 more run " in lines[1] and "over steps 2-11" in lines[1]


def test_a_line_written_while_a_bar_is_drawn_starts_on_its_own_line():
    """compare's estimate was glued to the end of a progress-bar line: log lines go through write_line."""
    import io

    from depthattn.progress import progress_bar, write_line

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    with progress_bar(total=10, file=term, desc="train") as bar:
        bar.update(3)
        write_line("estimate: about 5 min", file=term)
        before = term.getvalue().split("estimate:")[0]
    assert "/10 [" in before and before.endswith("\r")  # the bar was drawn, then cleared: the line starts a line
