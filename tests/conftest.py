"""Shared fixtures and builders: tiny float32 CPU models and batches, seeding, the session's prepared corpus."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))

from depthattn import DecoderLM, ModelConfig, generate, naive_generate  # noqa: E402
from depthattn.accounting import kv_cache_bytes_per_token  # noqa: E402


def make_model(seed: int = 0, **overrides) -> DecoderLM:
    """A tiny fp32 model; default: 5 layers, stride 2, GQA group 2 (so layer 4 reads layers 0 and 2)."""
    values = dict(num_hidden_layers=5, depth_attention_stride=2, cross_layer="depth_attention")
    values.update(overrides)
    torch.manual_seed(seed)
    model = DecoderLM(ModelConfig.from_preset("tiny", **values)).eval()
    # Non-trivial norm gains so q/k norms matter in every comparison.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture
def seeded():
    torch.manual_seed(1234)
    return torch.Generator().manual_seed(1234)


def left_padded_batch(vocab: int, lengths: list[int], seed: int = 0, pad_id: int = 0):
    """Random ids left-padded to max(lengths); returns (ids [B, T], mask [B, T] bool)."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.full((len(lengths), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.bool)
    for b, n in enumerate(lengths):
        ids[b, T - n:] = torch.randint(1, vocab, (n,), generator=g)
        mask[b, T - n:] = True
    return ids, mask


def cached_logits(model, ids, mask, chunks):
    """Feed ``ids`` through a fresh KV cache in chunks of the given sizes; return (the concatenated logits, cache)."""
    cache = model.new_cache(ids.shape[0], ids.shape[1])
    outs, start = [], 0
    for n in chunks:
        with torch.no_grad():
            outs.append(model(ids[:, start:start + n], attention_mask=mask[:, :start + n], cache=cache).logits)
        start += n
    assert start == ids.shape[1] and cache.length == start
    return torch.cat(outs, dim=1), cache


# ------------------------------------------------------------- models of the tiny preset, for every method
def tiny(cross_layer: str = "none", **kw) -> ModelConfig:
    """The ``tiny`` preset with ``cross_layer`` and other fields."""
    return ModelConfig.from_preset("tiny", cross_layer=cross_layer, **kw)


def build(cfg: ModelConfig, seed: int = 0) -> DecoderLM:
    """``DecoderLM(cfg)`` initialised under ``seed``, in eval mode."""
    torch.manual_seed(seed)
    return DecoderLM(cfg).eval()


@torch.no_grad()
def perturb(model: DecoderLM, scale: float = 0.3, seed: int = 1) -> DecoderLM:
    """Move every cross-layer parameter away from its (near-vanilla) init (``+= scale * N(0, 1)``) and draw every
    learnable value-residual lambda from U(0, 1), so the mixing is non-trivial. A method's parameters are one kind
    or the other, each drawn from its own generator seeded ``seed``."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "cross_layer" in name:
            p.add_(scale * torch.randn(p.shape, generator=g))
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("value_mix.lam"):
            p.copy_(torch.rand((), generator=g))
    return model


def padded_batch(vocab: int, T: int = 11, pads: tuple[int, int] = (1, 4), seed: int = 3):
    """Two rows of ``T`` random ids, left-padded with ``pads`` pad (id 0) positions; (ids [2, T], mask [2, T] bool)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, T), generator=g)
    mask = torch.ones(2, T, dtype=torch.bool)
    for b, n in enumerate(pads):
        mask[b, :n] = False
        ids[b, :n] = 0
    return ids, mask


@torch.no_grad()
def assert_cache_matches_full(model: DecoderLM, atol: float = 1e-5) -> None:
    """Token-by-token and uneven chunked prefill on a left-padded batch equal the full forward at real positions;
    each padded row equals its unpadded run; greedy cached generation equals the cache-free reference."""
    cfg = model.config
    ids, mask = padded_batch(cfg.vocab_size)
    B, T = ids.shape
    full = model(ids, attention_mask=mask).logits
    assert torch.isfinite(full[mask]).all()
    for chunks in ([1] * T, [3, 1, 5, 2]):
        cache = model.new_cache(B, T)
        assert cache.bytes_per_token() == kv_cache_bytes_per_token(cfg, torch.float32)
        t0 = 0
        for n in chunks:
            out = model(ids[:, t0:t0 + n], attention_mask=mask[:, :t0 + n], cache=cache).logits
            real = mask[:, t0:t0 + n]
            torch.testing.assert_close(out[real], full[:, t0:t0 + n][real], atol=atol, rtol=0)
            t0 += n
        assert t0 == T and cache.length == T
    for b in range(B):
        start = int((~mask[b]).sum())
        alone = model(ids[b:b + 1, start:]).logits[0]
        torch.testing.assert_close(full[b, start:], alone, atol=atol, rtol=0)
    fast = generate(model, ids, 6, temperature=0, attention_mask=mask)
    slow = naive_generate(model, ids, 6, attention_mask=mask)
    assert torch.equal(fast, slow)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A prepared data folder of real text (``helpers.make_data``: six embedded documents, BPE vocab 512) shared
    by the training tests that do not define their own; never written to."""
    from helpers import make_data

    return make_data(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def model_cfg(data_dir):
    """The tiny depth_attention config for ``data_dir``'s vocabulary."""
    from depthattn.data import load_prepared
    from depthattn.training import resolve_model_config

    return resolve_model_config("tiny", {"cross_layer": "depth_attention"}, load_prepared(data_dir).vocab_size,
                                "tokenizer.json")


# ---------------------------------------------------------------------------------------------------- deselected
#: Tests the default ``-m`` of pyproject.toml (or the one given) deselected in this session.
_DESELECTED: list = []
#: The markers of the tests CI's second step runs (pyproject.toml's addopts leaves them out).
SECOND_STEP = ("slow", "dist", "docs", "compile")


def pytest_deselected(items) -> None:
    _DESELECTED.extend(items)


def pytest_terminal_summary(terminalreporter) -> None:
    """Say what the "N deselected" of the summary are: GPU tests, and the slower tests of CI's second step."""
    gpu = [i for i in _DESELECTED if i.get_closest_marker("gpu") is not None]
    slower = [i for i in _DESELECTED if i.get_closest_marker("gpu") is None
              and any(i.get_closest_marker(m) is not None for m in SECOND_STEP)]
    if gpu:
        terminalreporter.write_line(f"{len(gpu)} GPU tests deselected (pyproject.toml's -m; "
                                    f"-m gpu runs them on a CUDA machine)")
    if slower:
        terminalreporter.write_line(f"{len(slower)} slower tests deselected ({', '.join(SECOND_STEP)}; "
                                    f"-m \"({' or '.join(SECOND_STEP)}) and not gpu\" runs them)")
