"""Source mixtures at prepare time (``data prepare --mix``, :mod:`depthattn.data.mixture`).

Two sources written in disjoint alphabets, so every token of the prepared train split can be traced back to its
source without meta.json: the realised token shares are measured on the .bin files and must be within ±1 % of the
weights; the upsampled source's documents repeat, the downsampled one's appear at most once; the validation split is
the unmixed one; bad weights are refused in one line before any work.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

from depthattn.cli import main
from depthattn.data import load_prepared, prepare_corpus
from depthattn.data.mixture import SUM_TOLERANCE, check_mix, mixture_targets, parse_mix, plan_source

ALPHABETS = {"a": "abcde", "b": "vwxyz"}


def _write_source(path: Path, letters: str, docs: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(docs):
        words = ["".join(rng.choice(list(letters), size=rng.integers(2, 7))) for _ in range(rng.integers(40, 160))]
        lines.append(json.dumps({"text": " ".join(words)}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("mix_sources")
    return [str(_write_source(folder / "a.jsonl", ALPHABETS["a"], 12, 0)),
            str(_write_source(folder / "b.jsonl", ALPHABETS["b"], 40, 1))]


def _prepare(out: Path, inputs: list[str], mix=None, seed=0) -> dict:
    return prepare_corpus(out, inputs, vocab_size=320, val_fraction=0.1, seed=seed, progress=False, log=None,
                          workers=1, mix=mix)


def _documents_by_source(folder: Path, split: str = "train") -> dict[str, list[tuple[int, ...]]]:
    """The split's documents (token tuples, EOS included), by the alphabet their tokens are written in."""
    data = load_prepared(folder)
    tokens = np.asarray(data.split(split), dtype=np.int64)
    eos = data.eos_token_id
    ends = np.flatnonzero(tokens == eos)
    assert len(ends) and ends[-1] == len(tokens) - 1  # every document closed by EOS
    out: dict[str, list[tuple[int, ...]]] = {"a": [], "b": []}
    for lo, hi in zip(np.concatenate([[0], ends[:-1] + 1]), ends + 1):
        doc = tokens[lo:hi]
        text = "".join(data.tokenizer.id_to_token(int(t)) for t in doc[:-1])
        kinds = {k for k, letters in ALPHABETS.items() if any(c in letters for c in text)}
        assert len(kinds) == 1, text[:80]  # never a document of both sources
        out[kinds.pop()].append(tuple(doc.tolist()))
    return out


def _shares(docs: dict[str, list[tuple[int, ...]]]) -> dict[str, float]:
    n = {k: sum(len(d) for d in v) for k, v in docs.items()}
    return {k: v / sum(n.values()) for k, v in n.items()}


@pytest.fixture(scope="module")
def plain(tmp_path_factory, sources) -> Path:
    out = tmp_path_factory.mktemp("mix_plain") / "data"
    _prepare(out, sources)
    return out


@pytest.mark.parametrize("weights", [(0.7, 0.3), (0.1, 0.9)])
def test_realised_token_shares_are_within_one_percent_of_the_weights(weights, sources, plain, tmp_path):
    natural = _documents_by_source(plain)
    assert abs(_shares(natural)["a"] - weights[0]) > 0.05  # the mixture changes the shares
    meta = _prepare(tmp_path / "mixed", sources, mix=list(weights))
    mixed = _documents_by_source(tmp_path / "mixed")
    measured = _shares(mixed)
    for k, w in zip("ab", weights):
        assert abs(measured[k] - w) <= 0.01, (measured, weights)
    recorded = meta["mixture"]
    assert recorded["weights"] == list(weights) and recorded["seed"] == 0
    for src, k in zip(recorded["sources"], "ab"):
        assert src["tokens"] == sum(len(d) for d in mixed[k])  # meta.json says what the .bin files hold
        assert src["natural_tokens"] == sum(len(d) for d in natural[k])
        assert src["share"] == pytest.approx(measured[k])
        assert src["repeats"] == pytest.approx(src["tokens"] / src["natural_tokens"])
    assert meta["splits"]["train"]["tokens"] == sum(s["tokens"] for s in recorded["sources"])
    assert meta["splits"]["train"]["documents"] == len(mixed["a"]) + len(mixed["b"])
    assert meta["splits"]["val"]["sha256"] == load_prepared(plain).meta["splits"]["val"]["sha256"]  # unmixed
    assert not list((tmp_path / "mixed").glob(".mix-*"))  # the staging files are gone


def test_upsampling_repeats_documents_and_downsampling_takes_each_at_most_once(sources, plain, tmp_path):
    _prepare(tmp_path / "mixed", sources, mix=[0.7, 0.3])
    natural, mixed = _documents_by_source(plain), _documents_by_source(tmp_path / "mixed")
    up = collections.Counter(mixed["a"])
    repeats = sum(len(d) for d in mixed["a"]) / sum(len(d) for d in natural["a"])
    assert repeats > 2
    whole = [up[d] for d in natural["a"]]
    assert min(whole) >= int(repeats) and max(whole) <= int(repeats) + 1  # every document r or r + 1 times...
    assert set(up) - set(natural["a"]) == {mixed["a"][-1]} or set(up) <= set(natural["a"])  # ...and one cut short
    down = collections.Counter(mixed["b"])
    assert max(down[d] for d in natural["b"]) <= 1 and sum(down[d] for d in natural["b"]) < len(natural["b"])
    again = _prepare(tmp_path / "again", sources, mix=[0.7, 0.3])  # deterministic
    assert again["splits"]["train"]["sha256"] == load_prepared(tmp_path / "mixed").meta["splits"]["train"]["sha256"]


def test_plan_source_hits_the_target_within_one_token():
    counts = np.random.default_rng(0).integers(5, 500, size=37)
    for target in (0, 1, 2, 100, int(counts.sum()) - 1, int(counts.sum()), 3 * int(counts.sum()) + 17):
        plan = plan_source(counts, target, seed=3, index=1)
        assert target - 1 <= plan.tokens(counts) <= target, target
        assert plan.repeats == target // int(counts.sum())
    assert mixture_targets([300, 700], [0.5, 0.5]) == [500, 500]


@pytest.mark.parametrize("mix, message", [
    ([0.7, -0.3], "weight -0.3 is negative"),
    ([0.6, 0.3], f"add up to 0.9, not 1 (tolerance {SUM_TOLERANCE:g})"),
    ([1.0], "1 weight for 2 --inputs"),
    ([0.5, 0.25, 0.25], "3 weights for 2 --inputs"),
])
def test_bad_weights_are_refused_before_any_work(mix, message, tmp_path):
    missing = [str(tmp_path / "missing-a.jsonl"), str(tmp_path / "missing-b.jsonl")]  # never read: checked first
    with pytest.raises(ValueError, match="^--mix ") as e:
        _prepare(tmp_path / "out", missing, mix=mix)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())


def test_weights_within_the_tolerance_pass_and_the_cli_says_one_line(sources, tmp_path, capsys):
    assert check_mix([0.3333, 0.3333, 0.3334], ["x", "y", "z"]) == [0.3333, 0.3333, 0.3334]
    assert parse_mix("0.7, 0.3") == [0.7, 0.3]
    assert main(["data", "prepare", "--input", *sources, "--mix", "0.7,zero", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthattn data prepare: error: --mix 0.7,zero: 'zero' is not a")
    assert main(["data", "prepare", "--input", *sources, "--mix", "0.7,0.3", "--out", str(tmp_path / "o"),
                 "--vocab-size", "320", "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    shares = [float(line.rsplit(" ", 1)[1].rstrip("%")) for line in out.splitlines() if line.startswith("mix ")]
    assert shares == pytest.approx([70.0, 30.0], abs=0.01)
