"""depthattn.bench: the order of interleaved rounds, paired ratios from known times, pooling of processes' records
and the JSON record read back. No real timing: the cases advance a fake clock or return their own durations."""

from __future__ import annotations

import json
import math

import pytest

from depthattn import bench


def fake_cases(names, seconds, calls):
    """Cases that log their name and advance a fake clock by ``seconds[name]`` (and return None: the harness
    times them); returns ``(cases, clock)``."""
    now = [0.0]

    def case(name):
        def run():
            calls.append(name)
            now[0] += seconds[name]
        return run

    return {n: case(n) for n in names}, lambda: now[0]


def test_abba_reverses_every_other_round_counting_the_warmup_and_times_only_the_timed_rounds():
    calls, starts, lines = [], [], []
    cases, clock = fake_cases("ABC", {"A": 1.0, "B": 2.0, "C": 0.5}, calls)
    rec = bench.interleaved(cases, rounds=3, warmup=1, clock=clock, before_round=starts.append, log=lines.append)
    assert "".join(calls) == "ABC" "CBA" "ABC" "CBA"
    assert starts == [0, 1, 2, 3]
    assert lines == ["round 1/3 done", "round 2/3 done", "round 3/3 done"]
    assert rec["times"] == {"A": [1.0] * 3, "B": [2.0] * 3, "C": [0.5] * 3}
    assert (rec["cases"], rec["order"], rec["warmup"], rec["rounds"]) == (["A", "B", "C"], "abba", 1, 3)


def test_alternate_keeps_one_order_and_a_returned_duration_wins_over_the_clock():
    calls = []
    cases, clock = fake_cases("AB", {"A": 1.0, "B": 1.0}, calls)
    cases["B"] = lambda: (calls.append("B"), 0.25)[1]  # measures itself: the clock does not move
    rec = bench.interleaved(cases, rounds=2, order="alternate", warmup=0, clock=clock)
    assert "".join(calls) == "ABAB"
    assert rec["times"] == {"A": [1.0, 1.0], "B": [0.25, 0.25]}


@pytest.mark.parametrize("kwargs, message", [
    ({"rounds": 0}, "rounds=0 must be >= 1"), ({"rounds": 1, "warmup": -1}, "warmup=-1 >= 0"),
    ({"rounds": 1, "order": "abab"}, "order='abab': choose from abba, alternate")])
def test_bad_arguments_are_refused_before_any_case_runs(kwargs, message):
    calls = []
    cases, clock = fake_cases("A", {"A": 1.0}, calls)
    with pytest.raises(ValueError, match=message):
        bench.interleaved(cases, clock=clock, **kwargs)
    assert calls == []
    with pytest.raises(ValueError, match="at least one case"):
        bench.interleaved({}, rounds=1)


def test_paired_ratios_from_known_times():
    # per-round ratios e^0.1, e^0.2, e^0.3: log mean 0.2, log sd 0.1, t(0.975, 2) = 4.3027
    rec = {"times": {"da": [math.exp(0.1) * 2, math.exp(0.2) * 3, math.exp(0.3) * 5], "none": [2.0, 3.0, 5.0]}}
    r = bench.paired_ratios(rec, "da", "none")
    assert r["ratios"] == pytest.approx([math.exp(0.1), math.exp(0.2), math.exp(0.3)])
    assert (r["num"], r["den"], r["n"]) == ("da", "none", 3)
    assert r["median"] == pytest.approx(math.exp(0.2))
    assert r["geomean"] == pytest.approx(math.exp(0.2))
    half = 4.3027 * 0.1 / math.sqrt(3)  # 0.248417
    assert r["ci95"] == pytest.approx([math.exp(0.2 - half), math.exp(0.2 + half)])
    assert r["ci95"] == pytest.approx([0.95274, 1.56583], abs=1e-5)
    inverse = bench.paired_ratios(rec, "none", "da")
    assert inverse["median"] == pytest.approx(1 / r["median"])
    assert inverse["ci95"] == pytest.approx([1 / r["ci95"][1], 1 / r["ci95"][0]])


def test_paired_ratios_of_one_round_has_no_interval_and_bad_pairs_are_refused():
    one = bench.paired_ratios({"times": {"a": [3.0], "b": [2.0]}}, "a", "b")
    assert one["median"] == one["geomean"] == 1.5 and one["ci95"] is None
    with pytest.raises(KeyError, match="no case 'c' in the record"):
        bench.paired_ratios({"times": {"a": [3.0], "b": [2.0]}}, "c", "b")
    with pytest.raises(ValueError, match="'a' has 2 rounds and 'b' 1"):
        bench.paired_ratios({"times": {"a": [3.0, 1.0], "b": [2.0]}}, "a", "b")
    with pytest.raises(ValueError, match="positive ratios"):
        bench.paired_ratios({"times": {"a": [0.0], "b": [2.0]}}, "a", "b")


def record(a, b, started, finished, **extra):
    return {"cases": ["a", "b"], "order": "abba", "warmup": 0, "rounds": len(a), "times": {"a": a, "b": b},
            "started": started, "finished": finished, "load": [0.5, 0.6], **extra}


def test_pool_joins_rounds_in_process_order_and_across_records_gives_each_process_median():
    p1 = record([1.1, 2.6, 4.0], [1.0, 2.0, 4.0], "2026-12-01T10:00:00+00:00", "2026-12-01T10:05:00+00:00", meta="p1")
    p2 = record([1.8, 1.9], [2.0, 2.0], "2026-12-01T10:06:00+00:00", "2026-12-01T10:09:00+00:00", meta="p2")
    pooled = bench.pool([p1, p2])
    assert pooled["times"] == {"a": [1.1, 2.6, 4.0, 1.8, 1.9], "b": [1.0, 2.0, 4.0, 2.0, 2.0]}
    assert (pooled["rounds"], pooled["processes"], pooled["meta"]) == (5, 2, "p1")
    assert (pooled["started"], pooled["finished"]) == ("2026-12-01T10:00:00+00:00", "2026-12-01T10:09:00+00:00")
    assert p1["times"]["a"] == [1.1, 2.6, 4.0] and "processes" not in p1  # inputs untouched
    assert bench.paired_ratios(pooled, "a", "b")["ratios"] == pytest.approx([1.1, 1.3, 1.0, 0.9, 0.95])
    assert bench.paired_ratios(pooled, "a", "b")["median"] == pytest.approx(1.0)
    assert bench.pool([pooled, p1])["processes"] == 3  # a pooled record counts its processes
    across = bench.across_records([p1, p2], "a", "b")
    assert across["per_process"] == pytest.approx([1.1, 0.925])
    assert across["median"] == pytest.approx(1.0125) and across["geomean"] == pytest.approx(math.sqrt(1.1 * 0.925))
    half = 12.7062 * abs(math.log(1.1) - math.log(0.925)) / math.sqrt(2) / math.sqrt(2)  # t(0.975, 1) * s / sqrt(n)
    mid = (math.log(1.1) + math.log(0.925)) / 2
    assert across["ci95"] == pytest.approx([math.exp(mid - half), math.exp(mid + half)])
    with pytest.raises(ValueError, match="records with other cases"):
        bench.pool([p1, {"times": {"a": [1.0]}}])
    with pytest.raises(ValueError, match="at least one record"):
        bench.pool([])


def test_record_round_trips_through_json_with_its_environment(tmp_path):
    calls = []
    cases, clock = fake_cases("AB", {"A": 0.125, "B": 0.5}, calls)
    rec = dict(bench.interleaved(cases, rounds=2, clock=clock), note="ünïcode kept")
    path = tmp_path / "sub" / "record.json"
    written = bench.write_record(path, rec, device="cpu", command=["python", "scripts/x.py", "--label", "a b"])
    back = json.loads(path.read_text(encoding="utf-8"))
    assert back == written and {k: back[k] for k in rec} == rec
    env = back["environment"]
    assert env["command"] == "python scripts/x.py --label 'a b'"
    assert env["device"] == "cpu" and env["cpu"] == bench.cpu_name() and env["cpu"]
    assert set(env["versions"]) >= {"torch", "depthattn"}
    assert env["commit"] is None or len(env["commit"].removesuffix("-dirty")) == 40
    assert back["started"] <= back["finished"] <= env["written"]  # ISO 8601 UTC strings sort by time
    assert sorted(p.name for p in path.parent.iterdir()) == ["record.json"]  # no temporary file left
    assert bench.paired_ratios(back, "B", "A")["median"] == 4.0
