"""``TrainConfig.data_order``: windows in seeded epochs (``data.EpochBatches``, ``data.KeyedPermutation``) and the
with-replacement draw of older runs (``"random"``, ``data.TokenBatches``).

* the keyed permutation is a bijection for awkward sizes and equals a scalar twin of its Feistel network;
* one epoch covers every window exactly once (the tail counted), the next one too, in another order;
* the order of global samples is the same at any world size and grad_accum split (rank slices of one global batch);
* a run stopped mid-epoch resumes exactly (losses equal to the uninterrupted run's, across the epoch boundary);
  resumed at another world size (torchrun, 2 gloo ranks) it continues the uninterrupted run's windows;
* ``"random"`` is today's draw, and a recorded config without the key reads as ``"random"``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from depthattn.data import EpochBatches, KeyedPermutation, embedded_corpus_documents, load_prepared, prepare_corpus
from depthattn.data import epochs as epochs_module
from depthattn.data.shards import TokenBatches
from depthattn.training import TrainConfig, read_metrics, resolve_model_config, train
from depthattn.training import config as config_module
from depthattn.training.loop import _training_batches
from depthattn.training.resume import keep_tokens_per_step


# ---------------------------------------------------------------------------------------------------- permutation
def _scalar_permutation(n: int, seed: int, epoch: int, i: int) -> int:
    """The obvious twin: one index at a time in Python integers (SplitMix64 mod 2**64, Feistel, cycle walking)."""
    m64 = (1 << 64) - 1

    def mix(x: int) -> int:
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & m64
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & m64
        return x ^ (x >> 31)

    keys = [int(k) for k in np.random.SeedSequence([seed, epoch, epochs_module._TAG]).generate_state(
        epochs_module.ROUNDS, np.uint64)]
    h = max(1, ((n - 1).bit_length() + 1) // 2)
    low = (1 << h) - 1
    while True:
        left, right = i >> h, i & low
        for k in keys:
            left, right = right, left ^ (mix(right ^ k) & low)
        i = (left << h) | right
        if i < n:
            return i


AWKWARD = [1, 2, 3, 4, 5, 7, 97, 1009, 15, 16, 17, 1023, 1024, 1025, 65535, 65537]


@pytest.mark.parametrize("n", AWKWARD)
def test_permutation_is_a_bijection_of_awkward_sizes(n):
    for seed, epoch in ((0, 0), (7, 3)):
        image = KeyedPermutation(n, seed, epoch)(np.arange(n))
        assert image.dtype == np.int64 and image.shape == (n,)
        assert np.array_equal(np.sort(image), np.arange(n)), (n, seed, epoch)


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000])
def test_permutation_equals_its_scalar_twin(n):
    idx = np.arange(n) if n <= 17 else np.random.default_rng(0).integers(0, n, 50)
    fast = KeyedPermutation(n, 5, 2)(idx)
    assert fast.tolist() == [_scalar_permutation(n, 5, 2, int(i)) for i in idx]


def test_permutation_depends_on_seed_and_epoch_and_is_not_the_identity():
    n = 10_000
    a = KeyedPermutation(n, 0, 0)(np.arange(n))
    assert (a == np.arange(n)).sum() < 10  # a random permutation has ~1 fixed point
    assert (a != KeyedPermutation(n, 0, 1)(np.arange(n))).mean() > 0.99
    assert (a != KeyedPermutation(n, 1, 0)(np.arange(n))).mean() > 0.99
    big = KeyedPermutation(10**9, 3, 0)(np.arange(10**9 - 64, 10**9))  # no table: a billion windows cost nothing
    assert ((big >= 0) & (big < 10**9)).all() and len(set(big.tolist())) == 64


def test_permutation_bad_input():
    with pytest.raises(ValueError, match="n >= 1"):
        KeyedPermutation(0)
    with pytest.raises(ValueError, match=r"out of \[0, 5\)"):
        KeyedPermutation(5)(np.array([5]))


# ---------------------------------------------------------------------------------------------------- epochs
def test_one_epoch_covers_every_window_exactly_once_and_counts_the_tail():
    T, N = 8, 8 * 37 + 1 + 5  # 37 windows, a 5-token tail
    tokens = np.arange(N, dtype=np.uint16)
    b = EpochBatches(tokens, batch_size=3, seq_len=T, seed=4, grad_accum=2)
    assert b.num_windows == 37 and b.tail_tokens == 5 and b.samples_per_step == 6
    rows = [b.batch(step, micro) for step in range(13) for micro in range(2)]  # 78 samples: 2 epochs and 4 more
    w = torch.cat(rows).numpy()
    assert (w[:, 1:] == w[:, :-1] + 1).all()  # each row a contiguous window of T + 1 tokens
    starts = w[:, 0]
    assert (starts % T == 0).all()
    first, second = starts[:37], starts[37:74]
    assert sorted(first.tolist()) == sorted(second.tolist()) == [k * T for k in range(37)]  # each window once
    assert first.tolist() != second.tolist()  # another order in the next epoch
    targets = np.concatenate([r[1:] for r in w[:37]])
    assert sorted(targets.tolist()) == list(range(1, 37 * T + 1))  # every token a target once...
    assert N - 1 - targets.max() == b.tail_tokens  # ...but the tail
    assert b.epoch(13) == pytest.approx(78 / 37)


LAYOUTS = [(1, 1, 8), (1, 2, 4), (2, 1, 4), (2, 2, 2), (4, 2, 1), (8, 1, 1), (1, 8, 1)]  # (world, accum, batch)


def test_the_global_order_is_the_same_at_any_world_size_and_grad_accum_split():
    tokens = np.arange(16 * 50 + 1, dtype=np.uint16)  # 50 windows of 16 + 1 tokens; 8 samples per step

    def global_starts(world, accum, batch, steps=14):  # 112 samples: more than two epochs
        ranks = [EpochBatches(tokens, batch, 16, seed=9, rank=r, world_size=world, grad_accum=accum)
                 for r in range(world)]
        return [s for step in range(steps) for m in range(accum) for b in ranks for s in b.starts(step, m).tolist()]

    reference = global_starts(1, 1, 8)
    one = EpochBatches(tokens, 8, 16, seed=9)
    assert reference == (one.windows(np.arange(112)) * 16).tolist()  # sample i is window perm_e(i mod n)
    for layout in LAYOUTS:
        assert global_starts(*layout) == reference, layout


def test_epoch_batches_bad_input():
    tokens = np.arange(100, dtype=np.uint16)
    with pytest.raises(ValueError, match="rank 2 is not in"):
        EpochBatches(tokens, 2, 8, rank=2, world_size=2)
    with pytest.raises(ValueError, match="fewer than seq_len"):
        EpochBatches(tokens, 2, 100)
    with pytest.raises(ValueError, match="micro_step 2"):
        EpochBatches(tokens, 2, 8, grad_accum=2).batch(0, 2)


# ---------------------------------------------------------------------------------------------------- random
def test_random_is_todays_draw_and_a_recorded_config_without_the_key_reads_random():
    tokens = np.arange(5000, dtype=np.uint16)
    cfg = TrainConfig(steps=4, batch_size=3, seq_len=32, seed=6, data_order="random")
    batches = _training_batches(tokens, cfg, 0, print)
    assert isinstance(batches, TokenBatches)
    for step, micro in ((0, 0), (3, 0), (7, 1)):  # the release's draw, written out
        starts = np.random.default_rng([6, step, micro, 0]).integers(0, 5000 - 32, size=3, dtype=np.int64)
        assert torch.equal(batches.batch(step, micro), torch.from_numpy(
            np.stack([tokens[s:s + 33].astype(np.int64) for s in starts])))
    assert TrainConfig().data_order == "epochs"
    assert TrainConfig.from_recorded({}).data_order == "random"
    assert TrainConfig.from_recorded({"data_order": "epochs"}).data_order == "epochs"
    with pytest.raises(ValueError, match=r"TrainConfig.data_order='shuffle' is invalid: must be one of epochs, rand"):
        TrainConfig(data_order="shuffle")


def test_resume_on_another_world_size_says_the_epoch_batches_are_the_same(tmp_path, monkeypatch):
    record = {"world_size": 1, "tokens_per_step": 2 * 2 * 32, "train": {}}
    (tmp_path / "run.json").write_text(json.dumps(record))
    cfg = TrainConfig(steps=4, batch_size=2, seq_len=32, grad_accum=2)
    monkeypatch.setattr(config_module.TrainConfig, "world_size", lambda self: 2)
    said: list[str] = []
    assert keep_tokens_per_step(tmp_path, cfg, said.append).grad_accum == 1
    assert len(said) == 1 and "the batches of the remaining steps are the same as the uninterrupted run's" in said[0]
    assert "differ" not in said[0]


# ---------------------------------------------------------------------------------------------------- training
STEPS, BATCH, SEQ, ACCUM = 16, 4, 32, 2
CFG = dict(steps=STEPS, batch_size=BATCH, seq_len=SEQ, grad_accum=ACCUM, lr=3e-3, warmup=0.1, eval_every=0,
           eval_windows=2, eval_batch_size=2, save_every=3, keep_last=10, device="cpu", tensorboard=False)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    """A train split of about a hundred 33-token windows, so a 16-step run (8 samples a step) spans epochs."""
    folder = tmp_path_factory.mktemp("epochs_corpus")
    src = folder / "slice.jsonl"
    src.write_text("".join(json.dumps({"text": text[:900]}) + "\n" for _, text in embedded_corpus_documents()[:6]),
                   encoding="utf-8")
    prepare_corpus(folder / "data", [str(src)], vocab_size=300, val_fraction=0.2, progress=False, workers=1)
    return folder / "data"


@pytest.fixture(scope="module")
def small_cfg(small_data):
    return resolve_model_config("tiny", {"cross_layer": "depth_attention"}, load_prepared(small_data).vocab_size,
                                "tokenizer.json")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, small_data, small_cfg) -> Path:
    run = tmp_path_factory.mktemp("epochs_runs") / "whole"
    lines: list[str] = []
    train(run, small_cfg, TrainConfig(**CFG), small_data, progress=False, log=lines.append)
    assert any(line.startswith("data order: epochs of ") for line in lines), lines
    return run


def test_a_run_records_epochs_and_logs_fractional_epochs(uninterrupted, small_data):
    run = json.loads((uninterrupted / "run.json").read_text())
    assert run["train"]["data_order"] == "epochs"
    n = (len(load_prepared(small_data).train) - 1) // SEQ
    rows = read_metrics(uninterrupted)
    assert [r["epoch"] for r in rows] == pytest.approx([s * BATCH * ACCUM / n for s in range(1, STEPS + 1)])
    assert rows[-1]["epoch"] > 1  # the run crosses an epoch boundary


def test_a_run_stopped_mid_epoch_resumes_exactly(uninterrupted, small_data, small_cfg, tmp_path):
    run = tmp_path / "cut"
    train(run, small_cfg, TrainConfig(**CFG), small_data, stop_after=7, progress=False)  # checkpoint at step 6
    assert 0 < read_metrics(run)[5]["epoch"] < 1
    lines: list[str] = []
    train(run, small_cfg, TrainConfig(**CFG), small_data, resume=True, progress=False, log=lines.append)
    assert f"resuming {run} from step 6 of {STEPS}" in lines
    keys = ("step", "tokens", "loss", "grad_norm", "epoch")
    assert [[r[k] for k in keys] for r in read_metrics(run)] == [[r[k] for k in keys]
                                                                 for r in read_metrics(uninterrupted)]
    last = f"checkpoints/step_{STEPS:08d}/model.safetensors"
    assert (run / last).read_bytes() == (uninterrupted / last).read_bytes()


@pytest.mark.dist
def test_resumed_on_two_ranks_it_continues_the_uninterrupted_runs_windows(uninterrupted, small_data, small_cfg,
                                                                         tmp_path):
    """One process (grad_accum 2) stopped at step 6, resumed by ``torchrun --nproc_per_node 2`` (DDP, grad_accum
    1, the same global batch): the same windows at every step, so it ends next to the uninterrupted run (measured:
    bitwise equal on CPU/gloo, as halving is exact; allowed 1e-4 for the order of the sums). With
    ``data_order="random"`` the same resume lands ~3e-3 away (tests/training/test_dist_resume.py)."""
    from helpers import torchrun

    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)
    for d in (run / "checkpoints").iterdir():
        if int(d.name.split("_")[1]) > 6:
            shutil.rmtree(d)
    (run / "summary.json").unlink()
    res = torchrun(["-m", "depthattn.cli", "train", "--resume", str(run), "--no-progress"], tmp_path, timeout_s=300)
    out = res.stdout + res.stderr
    assert "the batches of the remaining steps are the same as the uninterrupted run's" in out
    assert json.loads((run / "run.json").read_text())["train"]["grad_accum"] == 1
    ours, ref = read_metrics(run), read_metrics(uninterrupted)
    assert [r["epoch"] for r in ours] == [r["epoch"] for r in ref]
    assert [r["loss"] for r in ours] == pytest.approx([r["loss"] for r in ref], rel=1e-5, abs=1e-5)
    last = f"checkpoints/step_{STEPS:08d}/model.safetensors"
    a, b = load_file(run / last), load_file(uninterrupted / last)
    near = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert near < 1e-4, near


def test_a_compare_folder_of_an_older_release_keeps_random_unless_the_command_sets_the_order(tmp_path):
    from depthattn.training.resume import keep_recorded_behaviour

    cfg = TrainConfig(steps=4)
    said: list[str] = []
    assert keep_recorded_behaviour(tmp_path / "new", cfg, set(), said.append) is cfg and said == []  # a new folder
    (tmp_path / "old" / "runs" / "none-seed0").mkdir(parents=True)
    (tmp_path / "old" / "runs" / "none-seed0" / "run.json").write_text(json.dumps({"train": {"seed": 0}}))
    assert keep_recorded_behaviour(tmp_path / "old", cfg, set(), said.append).data_order == "random"
    assert len(said) == 1 and "its runs keep data_order=random" in said[0]
    assert keep_recorded_behaviour(tmp_path / "old", cfg, {"data_order"}, said.append) is cfg  # the command's choice
    (tmp_path / "old" / "runs" / "none-seed0" / "run.json").write_text(json.dumps({"train": {"data_order": "epochs"}}))
    assert keep_recorded_behaviour(tmp_path / "old", cfg, set(), said.append) is cfg
