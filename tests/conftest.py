"""Shared fixtures: tiny float32 CPU configs and seeding."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))

from depthattn import DecoderLM, ModelConfig  # noqa: E402


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
