"""Training loop, optimizer, schedule, checkpoints/resume and perplexity, on a slice of the embedded corpus."""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from depthattn import DecoderLM, ModelConfig, fileio
from depthattn.checkpoint import checkpoint_dirs
from depthattn.data import embedded_corpus_documents, load_prepared, prepare_corpus
from depthattn.eval.perplexity import evaluate_perplexity, token_byte_lengths
from depthattn.training import (TrainConfig, init_from_checkpoint, load_toml, read_metrics, resolve_model_config,
                                train)
from depthattn.training.optim import build_optimizer, lr_factor

TRAIN = dict(steps=8, batch_size=4, seq_len=64, lr=3e-3, warmup=0.1, eval_every=4, eval_windows=4, save_every=4,
             keep_last=3)


@pytest.fixture(scope="module")
def tiny_cfg(data_dir) -> ModelConfig:
    return resolve_model_config("tiny", {"cross_layer": "depth_attention"}, load_prepared(data_dir).vocab_size,
                                "tokenizer.json")


@pytest.fixture(scope="module")
def run_a(tmp_path_factory, data_dir, tiny_cfg):
    run = tmp_path_factory.mktemp("runs") / "a"
    train(run, tiny_cfg, TrainConfig(**TRAIN), data_dir, progress=False)
    return run


def tree_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------ optimizer
def _expected_no_decay(cfg: ModelConfig) -> set[str]:
    """docs/specs/spec-baselines.md §8, written out by hand: norm gains, DWA alpha, mHC alpha / bias / readout / norm
    gain, AttnRes query / key_gain / recency_bias never decay."""
    out = {"model.norm.weight"}
    for i in range(cfg.num_hidden_layers):
        layer = f"model.layers.{i}"
        out |= {f"{layer}.{n}" for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                         "self_attn.q_norm.weight", "self_attn.k_norm.weight")}
        if cfg.cross_layer == "denseformer" and (i + 1) % cfg.denseformer_period == 0:
            out.add(f"{layer}.cross_layer.alpha")
        if cfg.cross_layer == "mhc":
            out |= {f"{layer}.cross_layer.connectors.{c}.{n}" for c in (0, 1) for n in ("alpha", "bias", "norm.weight")}
        if cfg.cross_layer == "attnres":
            out |= {f"{layer}.cross_layer.query", f"{layer}.cross_layer.key_gain"}
            if cfg.attnres_recency_bias is not None:
                out.add(f"{layer}.cross_layer.recency_bias")
    if cfg.cross_layer == "mhc":
        out.add("model.cross_layer.readout")
    if cfg.cross_layer == "attnres":
        out |= {"model.cross_layer.query", "model.cross_layer.key_gain"}
        if cfg.attnres_recency_bias is not None:
            out.add("model.cross_layer.recency_bias")
    return out


@pytest.mark.parametrize("method, extra", [("none", {}), ("depth_attention", {}), ("denseformer", {}), ("mhc", {}),
                                           ("attnres", {}), ("attnres", {"attnres_recency_bias": 3.0})],
                         ids=["none", "depth_attention", "denseformer", "mhc", "attnres", "attnres_recency"])
def test_weight_decay_groups_per_method(method, extra):
    cfg = ModelConfig.from_preset("tiny", cross_layer=method, **extra)
    model = DecoderLM(cfg)
    opt, names = build_optimizer(model, lr=1e-3, weight_decay=0.1)
    params = dict(model.named_parameters())
    no_decay = _expected_no_decay(cfg)
    assert no_decay <= set(params)
    assert set(names["no_decay"]) == no_decay
    assert set(names["decay"]) == set(params) - no_decay  # projections, embedding, LM head, mHC phi
    assert all(params[n].ndim == 2 for n in names["decay"])
    assert "model.embed_tokens.weight" in names["decay"] and "lm_head.weight" in names["decay"]
    if method == "mhc":
        assert "model.layers.0.cross_layer.connectors.0.phi.weight" in names["decay"]
    if method == "attnres":  # stacked [A, C] matrices, yet w and g must not decay
        assert params["model.layers.0.cross_layer.query"].ndim == 2
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert [sum(p.numel() for p in g["params"]) for g in opt.param_groups] == \
        [sum(params[n].numel() for n in names[k]) for k in ("decay", "no_decay")]
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["eps"] == 1e-8


def test_lr_schedule_warmup_then_cosine_to_floor():
    warm, total = 10, 110
    f = [lr_factor(s, warm, total, 0.1) for s in range(total)]
    assert f[:warm] == pytest.approx([(s + 1) / warm for s in range(warm)])
    assert f[warm] == pytest.approx(1.0) and f[-1] == pytest.approx(0.1)
    mid = warm + (total - 1 - warm) // 2
    assert f[mid] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (mid - warm) / (total - 1 - warm))))
    assert all(a >= b for a, b in zip(f[warm:], f[warm + 1:]))


# ------------------------------------------------------------------------------------------------ training
def test_loss_decreases_on_real_text(run_a):
    rows = read_metrics(run_a)
    assert [r["step"] for r in rows] == list(range(1, 9))
    losses = [r["loss"] for r in rows]
    assert losses[0] > math.log(512) - 0.3  # starts near uniform over the vocabulary
    assert np.mean(losses[-2:]) < losses[0] - 0.25
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(val) == 2 and val[1] < val[0]
    peak = TRAIN["lr"]
    assert rows[0]["lr"] == pytest.approx(peak * lr_factor(0, 1, 8, 0.1))
    run = json.loads((run_a / "run.json").read_text())
    assert run["train"]["steps"] == 8 and run["model"]["vocab_size"] == 512
    assert set(run["versions"]) >= {"torch", "transformers", "tokenizers", "depthattn"}
    summary = json.loads((run_a / "summary.json").read_text())
    assert summary["final_val_loss"] == val[-1] and summary["tokens"] == 8 * 4 * 64
    groups = json.loads((run_a / "param_groups.json").read_text())
    assert set(groups) == {"decay", "no_decay", "rule"} and "model.norm.weight" in groups["no_decay"]
    assert "spec-baselines.md" in groups["rule"]


def test_resume_repeats_uninterrupted_run_exactly(run_a, tmp_path, data_dir, tiny_cfg):
    run = tmp_path / "b"
    shutil.copytree(run_a, run)
    before = read_metrics(run)
    shutil.rmtree(run / "checkpoints" / "step_00000008")  # "crash" after step 8 was logged but before its save
    train(run, tiny_cfg, TrainConfig(**TRAIN), data_dir, resume=True, progress=False)
    after = read_metrics(run)
    keys = ("step", "tokens", "loss", "lr", "grad_norm", "val_loss")
    assert [[r.get(k) for k in keys] for r in after] == [[r.get(k) for k in keys] for r in before]
    a = torch.load(run_a / "checkpoints/step_00000008/trainer_state.pt", weights_only=True)
    b = torch.load(run / "checkpoints/step_00000008/trainer_state.pt", weights_only=True)
    assert a["step"] == b["step"] == 8 and a["tokens_seen"] == b["tokens_seen"]
    assert (run_a / "checkpoints/step_00000008/model.safetensors").read_bytes() == \
        (run / "checkpoints/step_00000008/model.safetensors").read_bytes()


def test_same_seed_same_losses_other_seed_differs(run_a, tmp_path, data_dir, tiny_cfg):
    ref = [r["loss"] for r in read_metrics(run_a)][:3]
    train(tmp_path / "s", tiny_cfg, TrainConfig(**TRAIN), data_dir, stop_after=3, progress=False)
    assert [r["loss"] for r in read_metrics(tmp_path / "s")] == ref
    assert not (tmp_path / "s" / "summary.json").exists()
    train(tmp_path / "t", tiny_cfg, TrainConfig(**{**TRAIN, "seed": 1}), data_dir, stop_after=2, progress=False)
    assert [r["loss"] for r in read_metrics(tmp_path / "t")] != ref[:2]


def test_init_from_other_method_copies_weights(run_a):
    model = DecoderLM(ModelConfig.from_dict({**json.loads((run_a / "run.json").read_text())["model"],
                                             "cross_layer": "none"}))
    kept = init_from_checkpoint(model, checkpoint_dirs(run_a)[-1])
    assert kept == []
    src = DecoderLM(ModelConfig.from_dict(json.loads((run_a / "run.json").read_text())["model"]))
    init_from_checkpoint(src, checkpoint_dirs(run_a)[-1])
    for (n, p), (_, q) in zip(model.state_dict().items(), src.state_dict().items()):
        assert torch.equal(p, q), n


def _strict_json(path: Path):
    def refuse(c):
        raise ValueError(f"non-JSON constant {c}")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_resume_at_last_step_keeps_or_recreates_summary(run_a, tmp_path, data_dir, tiny_cfg):
    run = tmp_path / "done"
    shutil.copytree(run_a, run)
    summary = (run / "summary.json").read_bytes()
    final_val = [r["val_loss"] for r in read_metrics(run_a) if "val_loss" in r][-1]
    # resuming a finished run changes nothing in its summary
    res = train(run, tiny_cfg, TrainConfig(**TRAIN), data_dir, resume=True, progress=False)
    assert (run / "summary.json").read_bytes() == summary
    assert res.steps == 8 and res.final_val_loss == final_val
    # crash after the final checkpoint, before summary.json: re-created from the metrics log, strict JSON
    (run / "summary.json").unlink()
    res = train(run, tiny_cfg, TrainConfig(**TRAIN), data_dir, resume=True, progress=False)
    got = _strict_json(run / "summary.json")
    old = json.loads(summary)
    assert got["final_val_loss"] == old["final_val_loss"] == final_val == res.final_val_loss
    assert got["steps"] == 8 and got["tokens"] == old["tokens"] and got["checkpoint"] == str(checkpoint_dirs(run)[-1])
    assert isinstance(got["train_tokens_per_s"], float) and got["train_tokens_per_s"] > 0
    # ... and without a logged final validation: measured now on the restored weights
    rows = read_metrics(run)
    rows[-1].pop("val_loss")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").unlink()
    res = train(run, tiny_cfg, TrainConfig(**TRAIN), data_dir, resume=True, progress=False)
    got = _strict_json(run / "summary.json")
    assert got["final_val_loss"] == pytest.approx(final_val, rel=1e-6) and res.final_val_loss == got["final_val_loss"]
    # a summary with NaN (written by an older version) is replaced by strict JSON
    (run / "summary.json").write_text('{"steps": 8, "final_val_loss": null, "train_tokens_per_s": NaN}')
    train(run, tiny_cfg, TrainConfig(**TRAIN), data_dir, resume=True, progress=False)
    assert _strict_json(run / "summary.json")["final_val_loss"] == pytest.approx(final_val, rel=1e-6)


def test_resume_refuses_other_data_with_the_same_tokenizer(run_a, tmp_path, data_dir, tiny_cfg):
    from depthattn.data.shards import data_fingerprint

    data = load_prepared(data_dir)
    assert json.loads((run_a / "run.json").read_text())["data_fingerprint"] == data.fingerprint
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy)
    assert load_prepared(copy).fingerprint == data.fingerprint  # paths do not count
    other = tmp_path / "other"
    prepare_corpus(other, [str(data_dir.parent / "slice.jsonl")], tokenizer=data_dir / "tokenizer.json",
                   val_fraction=0.4, seed=5, progress=False)
    assert load_prepared(other).meta["tokenizer_sha256"] == data.meta["tokenizer_sha256"]
    assert load_prepared(other).fingerprint != data.fingerprint
    meta = dict(data.meta, splits={k: dict(v) for k, v in data.meta["splits"].items()})
    meta["splits"]["val"]["sha256"] = "0" * 64  # same counts, other tokens
    assert data_fingerprint(meta) != data.fingerprint
    run = tmp_path / "r"
    shutil.copytree(run_a, run)
    shutil.rmtree(run / "checkpoints" / "step_00000008")
    before = tree_hashes(run)
    with pytest.raises(ValueError, match=rf"cannot resume .*data folder {re.escape(str(other))} holds other data"):
        train(run, tiny_cfg, TrainConfig(**TRAIN), other, resume=True, progress=False)
    assert tree_hashes(run) == before


def test_resume_refuses_another_resolved_precision(run_a, tmp_path, data_dir, tiny_cfg):
    assert json.loads((run_a / "run.json").read_text())["resolved_precision"] == "float32"
    run = tmp_path / "p"
    shutil.copytree(run_a, run)
    shutil.rmtree(run / "checkpoints" / "step_00000008")
    record = json.loads((run / "run.json").read_text())
    # as if the run had trained on CUDA under precision "auto" (bf16 autocast); this session is on CPU (float32)
    for fake in ({**record, "resolved_precision": "bfloat16", "device": "cuda"},
                 {k: v for k, v in {**record, "autocast": "torch.bfloat16"}.items() if k != "resolved_precision"}):
        (run / "run.json").write_text(json.dumps(fake))
        before = tree_hashes(run)
        with pytest.raises(ValueError, match=r"trained in bfloat16 .* this session would train in float32"):
            train(run, tiny_cfg, TrainConfig(**{**TRAIN, "device": "cpu"}), data_dir, resume=True, progress=False)
        assert tree_hashes(run) == before


# ------------------------------------------------------------------------------------------------ bad inputs
def test_budget_shorter_than_one_step(tmp_path, data_dir, tiny_cfg):
    with pytest.raises(ValueError, match="shorter than one optimizer step of 256 tokens"):
        train(tmp_path / "x", tiny_cfg, TrainConfig(**{**TRAIN, "steps": None, "tokens": 100}), data_dir)
    assert not (tmp_path / "x").exists()


def test_vocab_smaller_than_the_tokenizer_names_both(data_dir):
    with pytest.raises(ValueError, match=r"vocab_size=500 is smaller than the tokenizer's vocabulary of 512 tokens"):
        resolve_model_config("tiny", {"vocab_size": 500}, 512, str(data_dir / "tokenizer.json"))
    assert resolve_model_config("tiny", {"vocab_size": 1000}, 512, "t.json").vocab_size == 1000  # padded: allowed


def test_unknown_toml_key(tmp_path):
    cfg = tmp_path / "x.toml"
    cfg.write_text('preset = "tiny"\n[train]\nsteps = 3\nlearning_rate = 1e-3\n')
    with pytest.raises(ValueError, match=r"x\.toml: unknown \[train\] key\(s\) \['learning_rate'\]"):
        load_toml(cfg)
    cfg.write_text('[model]\nhidden = 3\n')
    with pytest.raises(ValueError, match=r"unknown \[model\] key\(s\) \['hidden'\]"):
        load_toml(cfg)


def test_shipped_configs_parse():
    root = Path(__file__).resolve().parents[2] / "configs"
    files = sorted(root.glob("*.toml"))
    assert {"tiny.toml", "small.toml", "3b_depth_attention.toml"} <= {f.name for f in files}
    for f in files:
        doc = load_toml(f)
        ModelConfig.from_preset(doc["preset"], **doc["model"])
        TrainConfig.from_dict(doc["train"]).total_steps()


def test_truncated_checkpoint_and_other_config_leave_run_untouched(run_a, tmp_path, data_dir, tiny_cfg):
    run = tmp_path / "c"
    shutil.copytree(run_a, run)
    # every checkpoint truncated (one of them alone: resume takes the previous, test_reliability_train.py)
    weights = [run / f"checkpoints/step_0000000{s}/model.safetensors" for s in (4, 8)]
    data = [w.read_bytes() for w in weights]
    for w, d in zip(weights, data):
        w.write_bytes(d[:len(d) // 2])
    before = tree_hashes(run)
    with pytest.raises(ValueError, match=r"no readable checkpoint .*step_00000008/model\.safetensors"):
        train(run, tiny_cfg, TrainConfig(**TRAIN), data_dir, resume=True, progress=False)
    assert tree_hashes(run) == before
    for w, d in zip(weights, data):
        w.write_bytes(d)
    with pytest.raises(ValueError, match=r"differs from the recorded one \(hidden_size: 64 vs 32"):
        train(run, tiny_cfg.replace(hidden_size=32), TrainConfig(**TRAIN), data_dir, resume=True, progress=False)
    # a checkpoint of another architecture dropped into the run folder
    other = json.loads((run / "checkpoints/step_00000008/config.json").read_text())
    other["num_hidden_layers"] = 2
    sealed = fileio.file_states(run / "checkpoints/step_00000008")
    (run / "checkpoints/step_00000008/config.json").write_text(json.dumps(other))
    # a whole checkpoint of another run carries its own consistent checksums.json (issue 24: else it is damage)
    fileio.rewrite_manifest_entries(run / "checkpoints/step_00000008", sealed)
    before = tree_hashes(run)
    with pytest.raises(ValueError, match=r"step_00000008 was written for another model config "
                                         r"\(num_hidden_layers: 2 vs 4\)"):
        train(run, tiny_cfg, TrainConfig(**TRAIN), data_dir, resume=True, progress=False)
    assert tree_hashes(run) == before
    with pytest.raises(ValueError, match="already holds checkpoints"):
        train(run, tiny_cfg, TrainConfig(**TRAIN), data_dir, progress=False)
    assert tree_hashes(run) == before


# ------------------------------------------------------------------------------------------------ perplexity
def test_byte_lengths_match_meta(data_dir):
    data = load_prepared(data_dir)
    lengths = token_byte_lengths(data.tokenizer)
    assert int(lengths[data.val].sum()) == data.num_bytes("val")
    assert int(lengths[data.train].sum()) == data.num_bytes("train")
    assert lengths[data.eos_token_id] == 0


def test_perplexity_matches_slow_twin(run_a, data_dir):
    from depthattn.checkpoint import load_model

    data = load_prepared(data_dir)
    model = load_model(checkpoint_dirs(run_a)[-1])
    tokens = np.asarray(data.val[:1000])
    res = evaluate_perplexity(model, tokens, data.tokenizer, seq_len=64, batch_size=5, progress=False)
    # slow twin: one window at a time, per-token loss, the tail window included
    nats, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(tokens) - 1, 64):
            w = torch.from_numpy(tokens[s:s + 65].astype(np.int64))[None]
            nats += float(F.cross_entropy(model(w[:, :-1]).logits[0].double(), w[0, 1:], reduction="sum"))
            n += w.shape[1] - 1
    assert res.tokens == n == len(tokens) - 1
    assert res.nats == pytest.approx(nats, rel=1e-5)
    assert res.perplexity == pytest.approx(math.exp(res.loss), rel=1e-12)
    nbytes = int(token_byte_lengths(data.tokenizer)[tokens[1:]].sum())
    assert res.bytes == nbytes
    assert res.bits_per_byte == pytest.approx(res.nats / (math.log(2) * nbytes), rel=1e-12)


def _metaspace_tokenizer(texts: list[str], vocab_size: int):
    """A SentencePiece-style BPE (Metaspace pre-tokenizer, ``▁`` for spaces) trained with ``tokenizers``: not
    byte-level, so its tokens' symbols do not spell the text's bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                       show_progress=False))
    return tok


def test_perplexity_checks_bytes_of_a_whole_split(run_a, data_dir):
    from depthattn.checkpoint import load_model

    data = load_prepared(data_dir)
    model = load_model(checkpoint_dirs(run_a)[-1])
    val = np.asarray(data.val)
    res = evaluate_perplexity(model, val, data.tokenizer, seq_len=64, batch_size=8, progress=False,
                              expected_bytes=data.num_bytes("val"))
    assert res.bytes + int(token_byte_lengths(data.tokenizer)[val[0]]) == data.num_bytes("val")
    # the same ids read through a non-byte-level vocabulary of the same size: bits per byte would be wrong
    other = _metaspace_tokenizer([t[:24000] for _, t in embedded_corpus_documents()[:6]], data.vocab_size)
    assert other.get_vocab_size() == data.vocab_size
    with pytest.raises(ValueError, match="byte-level BPE without normalizer"):
        evaluate_perplexity(model, val, other, seq_len=64, batch_size=8, progress=False,
                            expected_bytes=data.num_bytes("val"))
    # a prefix is not the whole split: no check
    evaluate_perplexity(model, val, other, seq_len=64, batch_size=8, max_tokens=100, progress=False,
                        expected_bytes=data.num_bytes("val"))


def test_small_config_is_the_compare_default_budget():
    """configs/small.toml is `depthattn compare`'s default budget for `depthattn train` (its comment says so)."""
    from depthattn.commands.compare_cmd import DEFAULT_TRAIN

    path = Path(__file__).resolve().parents[2] / "configs" / "small.toml"
    doc = load_toml(path)
    assert doc["preset"] == "small"
    assert TrainConfig.from_dict(doc["train"]) == TrainConfig.from_dict(DEFAULT_TRAIN)
    t = DEFAULT_TRAIN
    comment = path.read_text(encoding="utf-8")
    assert f"{t['steps']} steps x {t['batch_size']} x {t['seq_len']} tokens" in comment
    assert f"every {t['eval_every']} steps on {t['eval_windows']} windows" in comment


def test_trainer_verifies_the_shards_unless_verify_data_is_false(data_dir, tiny_cfg, tmp_path):
    """A same-size bit flip in a train shard stops ``train`` (one line naming the shard) before anything is written;
    ``verify_data=false`` (``--no-verify``) skips the hash and trains."""
    import shutil
    import time

    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    shard = sorted(copy.glob("train-*.bin"))[0]
    time.sleep(0.05)
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    cfg = TrainConfig(steps=1, batch_size=2, seq_len=32, eval_every=1, eval_windows=1, device="cpu")
    with pytest.raises(ValueError) as e:
        train(tmp_path / "run", tiny_cfg, cfg, copy, progress=False)
    assert str(shard) in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()
    res = train(tmp_path / "run", tiny_cfg, cfg.replace(verify_data=False), copy, progress=False)
    assert res.steps == 1
