"""Training the paper authors' models (issue 26, item 5): a model vocabulary larger than the tokenizer's (their
50,304-row embedding for GPT-NeoX-20B's 50,277 tokens) trains with ``--init-from`` and is refused smaller; their
zero ``padding_idx`` row is an ordinary row; their weight-decay split (``weight_decay_method_params``); the
``authors-3b`` preset's shape, parameter count and dry run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from depthattn import DecoderLM, ModelConfig
from depthattn import checkpoint as ckpt
from depthattn.cli import main
from depthattn.data import load_prepared
from depthattn.training import TrainConfig, train
from depthattn.training.optim import AUTHORS_DECAY_RULE, DECAY_RULE, build_optimizer, param_groups

TOKENIZER_ROWS = 512  # conftest's data_dir: BPE vocabulary 512
PADDED = TOKENIZER_ROWS + 64
STEPS = 6
SETS = dict(batch_size=4, seq_len=64, lr=3e-3, warmup=0.1, eval_every=STEPS, eval_windows=4, eval_batch_size=4,
            weight_decay=0.0, tensorboard="false")


def _sets(**extra) -> list[str]:
    return [a for k, v in {**SETS, **extra}.items() for a in ("--set", f"{k}={v}")]


def _val_windows(data_dir, n: int = 4, T: int = 64) -> torch.Tensor:
    val = np.asarray(load_prepared(data_dir).val[: n * T], dtype=np.int64)
    return torch.from_numpy(val).view(n, T)


def _extra_mass(model: DecoderLM, ids: torch.Tensor) -> float:
    """Mean probability the model puts on the rows beyond the tokenizer's vocabulary."""
    with torch.no_grad():
        return model(ids).logits.float().softmax(-1)[..., TOKENIZER_ROWS:].sum(-1).mean().item()


@pytest.fixture(scope="module")
def padded_start(data_dir, tmp_path_factory):
    """A tiny depth_attention checkpoint with vocab_size = tokenizer + 64 (the extra rows random, like the authors'
    padding), and the authors' zero padding_idx row at an id of the tokenizer that the data never holds."""
    prepared = load_prepared(data_dir)
    seen = np.union1d(np.unique(np.asarray(prepared.train)), np.unique(np.asarray(prepared.val)))
    pad = int(np.setdiff1d(np.arange(TOKENIZER_ROWS), seen)[0])
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention", vocab_size=PADDED))
    with torch.no_grad():
        model.model.embed_tokens.weight[pad].zero_()
    folder = tmp_path_factory.mktemp("padded") / "start"
    ckpt.save_model(model, folder, tokenizer_file=data_dir / "tokenizer.json")
    return folder, pad, model


def test_init_from_a_padded_vocabulary_trains_and_the_extra_rows_are_never_targets(padded_start, data_dir,
                                                                                    tmp_path, capsys):
    start, pad, initial = padded_start
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--cross-layer", "depth_attention", "--data", str(data_dir),
                 "--init-from", str(start), "--set", f"vocab_size={PADDED}", "--steps", str(STEPS), "--out", str(run),
                 "--no-progress", *_sets()]) == 0
    out = capsys.readouterr().out
    assert "note: the new model differs" not in out  # same config: nothing to say
    loss = float(out.rsplit("final val loss ", 1)[1].split()[0])
    assert math.isfinite(loss) and loss < math.log(TOKENIZER_ROWS)
    assert json.loads((run / "run.json").read_text())["model"]["vocab_size"] == PADDED
    trained = ckpt.load_model(ckpt.latest_checkpoint(run))
    before = initial.state_dict()
    after = trained.state_dict()
    embed0, embed1 = before["model.embed_tokens.weight"], after["model.embed_tokens.weight"]
    # never an input: the extra rows and the zero padding row are exactly as imported (weight_decay 0)
    assert torch.equal(embed1[TOKENIZER_ROWS:], embed0[TOKENIZER_ROWS:])
    assert torch.count_nonzero(embed1[pad]) == 0
    assert not torch.equal(embed1[:TOKENIZER_ROWS], embed0[:TOKENIZER_ROWS])  # it did train
    # never a target: the loss only pushes the extra rows' probability down
    ids = _val_windows(data_dir)
    assert _extra_mass(trained, ids) < 0.95 * _extra_mass(initial.eval(), ids)  # measured 0.095 vs 0.110


def test_init_from_another_vocabulary_says_which_setting_fits(padded_start, data_dir, tmp_path, capsys):
    start, _, _ = padded_start
    assert main(["train", "--preset", "tiny", "--cross-layer", "depth_attention", "--data", str(data_dir),
                 "--init-from", str(start), "--steps", "1", "--out", str(tmp_path / "r"), "--no-progress",
                 *_sets()]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"has vocab_size={PADDED}" in err and f"the new model {TOKENIZER_ROWS}" in err
    assert f"--set vocab_size={PADDED}" in err


def test_init_from_says_which_config_fields_differ(padded_start, data_dir, tmp_path, capsys):
    """The weights load into any model of their shapes; a field that changes the function they compute (here the
    q/k-norm order) is said in one line, so a continued authors' model is not silently another one."""
    start, _, _ = padded_start
    assert main(["train", "--preset", "tiny", "--cross-layer", "denseformer", "--data", str(data_dir),
                 "--init-from", str(start), "--set", f"vocab_size={PADDED}", "--set", "qk_norm_position=k_after_rope",
                 "--set", "denseformer_period=2", "--steps", "1", "--out", str(tmp_path / "r"), "--no-progress",
                 *_sets()]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: the new model")]
    # another method starts from its own knobs (denseformer_period is not a difference)
    assert notes == [f"note: the new model differs from {start}/config.json in qk_norm_position 'k_after_rope' "
                     f"(checkpoint: 'before_rope')"]


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused_in_one_line(data_dir, tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--data", str(data_dir), "--set", "vocab_size=500", "--steps", "1",
                 "--out", str(tmp_path / "r"), "--no-progress", *_sets()]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"vocab_size=500 is smaller than the tokenizer's vocabulary of {TOKENIZER_ROWS} tokens" in err
    assert not (tmp_path / "r").exists()
    # the library's boundary (a ModelConfig built by hand) says the same
    with pytest.raises(ValueError, match=f"vocab_size=500 is smaller than the tokenizer's vocabulary of "
                                         f"{TOKENIZER_ROWS} tokens"):
        train(tmp_path / "lib", ModelConfig.from_preset("tiny", vocab_size=500), TrainConfig(steps=1), data_dir,
              progress=False)


def test_the_padding_row_is_an_ordinary_row():
    """Decision (docs/authors-checkpoints.md): no ``padding_idx``. The authors' zero row is imported as is, gives a
    finite forward as an input, and would get a gradient like any other row if the data ever held its id."""
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig.from_preset("tiny", vocab_size=PADDED))
    assert model.model.embed_tokens.padding_idx is None
    with torch.no_grad():
        model.model.embed_tokens.weight[1].zero_()
    ids = torch.tensor([[5, 1, 7, 1, 9]])
    out = model(ids, labels=ids)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    out.loss.backward()
    grad = model.model.embed_tokens.weight.grad
    assert grad[1].abs().sum() > 0 and grad[2].abs().sum() == 0  # fed: a gradient; never fed: none


# ---------------------------------------------------------------------------------------------------- weight decay
#: The parameters that the authors' split decays and ours exempts, per method (tiny preset, 4 layers).
MOVED = {
    "denseformer": {f"model.layers.{i}.cross_layer.alpha" for i in range(4)},
    "mhc": ({f"model.layers.{i}.cross_layer.connectors.{c}.{p}" for i in range(4) for c in (0, 1)
             for p in ("alpha", "bias")} | {"model.cross_layer.readout"}),
    "attnres": {f"model.layers.{i}.cross_layer.query" for i in range(4)} | {"model.cross_layer.query"},
}


@pytest.mark.parametrize("method", ["none", "depth_attention", "denseformer", "mhc", "attnres"])
def test_authors_split_decays_exactly_the_methods_mixing_parameters(method):
    extra = {"attnres_recency_bias": 3.0} if method == "attnres" else {}
    model = DecoderLM(ModelConfig.from_preset("tiny", cross_layer=method, **extra))
    ours = param_groups(model, 0.1)[1]
    theirs = param_groups(model, 0.1, method_params=True)[1]
    moved = MOVED.get(method, set())
    assert moved <= {n for n, _ in model.named_parameters()}
    assert set(theirs["decay"]) == set(ours["decay"]) | moved
    assert set(theirs["no_decay"]) == set(ours["no_decay"]) - moved
    assert not any(n.endswith("norm.weight") for n in theirs["decay"])  # norm gains never decay
    if method == "attnres":
        kept = {n for n in theirs["no_decay"] if n.endswith(("key_gain", "recency_bias"))}
        assert len(kept) == 2 * 5  # per layer and the final aggregator: g (a norm gain there) and b (*bias* there)


def test_authors_split_shrinks_a_mixing_scalar_by_lr_times_decay():
    """One AdamW step with zero gradients: only decay moves a parameter; DWA α shrinks by exactly (1 − lr·λ) with
    the authors' split and stays put with ours."""
    for method_params, factor in ((False, 1.0), (True, 1.0 - 1e-2 * 0.1)):
        torch.manual_seed(0)
        model = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="denseformer"))
        alpha = model.model.layers[2].cross_layer.alpha
        with torch.no_grad():
            alpha.add_(0.5)
        before = alpha.detach().clone()
        opt, _ = build_optimizer(model, 1e-2, 0.1, method_params=method_params)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        torch.testing.assert_close(alpha.detach(), before * factor, rtol=0, atol=1e-7)


def test_the_run_records_the_authors_split(data_dir, tmp_path):
    cfg = ModelConfig.from_preset("tiny", cross_layer="denseformer", vocab_size=TOKENIZER_ROWS)
    for flag, rule in ((False, DECAY_RULE), (True, AUTHORS_DECAY_RULE)):
        run = tmp_path / str(flag)
        train(run, cfg, TrainConfig(steps=1, batch_size=2, seq_len=32, eval_windows=2, eval_batch_size=2,
                                    tensorboard=False, weight_decay_method_params=flag), data_dir, progress=False)
        groups = json.loads((run / "param_groups.json").read_text())
        assert groups["rule"] == rule
        assert ("model.layers.0.cross_layer.alpha" in groups["decay"]) is flag
        assert json.loads((run / "run.json").read_text())["train"]["weight_decay_method_params"] is flag
    with pytest.raises(ValueError, match=r"TrainConfig.weight_decay_method_params='yes' is invalid"):
        TrainConfig(weight_decay_method_params="yes")
    # a run recorded before the key existed reads today's split
    assert TrainConfig.from_recorded({"steps": 1}).weight_decay_method_params is False


# ---------------------------------------------------------------------------------------------------- the preset
#: hyq718/Depth-Attention llama_config/released/3b_depth_attention_qknorm_gqa4x/config.json@749d983.
RELEASED = dict(vocab_size=50304, hidden_size=2048, head_dim=64, intermediate_size=6912, num_hidden_layers=48,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048, initializer_range=0.01,
                rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=10000.0, depth_attention_stride=24,
                depth_attention_window=0)


def _released_params() -> int:
    """The parameters of the released Llama + q/k-norm shape, counted from its config: per layer q, k, v, o, the
    SwiGLU MLP, two RMSNorm gains and the q/k-norm gains; the embedding, an untied LM head, the final norm."""
    C, D, H, K, F = (RELEASED[k] for k in ("hidden_size", "head_dim", "num_attention_heads", "num_key_value_heads",
                                          "intermediate_size"))
    layer = C * H * D + 2 * C * K * D + H * D * C + 3 * C * F + 2 * C + 2 * D
    return RELEASED["num_hidden_layers"] * layer + 2 * RELEASED["vocab_size"] * C + C


def test_authors_3b_preset_is_the_released_shape():
    cfg = ModelConfig.from_preset("authors-3b")
    assert {k: getattr(cfg, k) for k in RELEASED} == RELEASED
    assert (cfg.cross_layer, cfg.qk_norm_position, cfg.num_loops) == ("depth_attention", "k_after_rope", 1)
    with torch.device("meta"):
        n = DecoderLM(cfg).num_params()
    assert n == _released_params()


def test_authors_3b_dry_run(capsys):
    args = ["train", "--dry-run", "--preset", "authors-3b", "--set", "seq_len=2048", "--set", "batch_size=4",
            "--set", "grad_accum=8", "--set", "weight_decay_method_params=true", "--set", "precision=bfloat16",
            "--nproc", "32", "--steps", "1000"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"dry run: depth_attention, {_released_params():,d} parameters" in out
    assert f"{32 * 4 * 8 * 2048:,d} per step" in out  # the authors' global batch: 1,024 sequences of 2,048 tokens
