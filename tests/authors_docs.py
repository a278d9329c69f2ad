"""An authors'-format Depth-Attention folder whose embedding has more rows than a given tokenizer (as their 50,304
rows pad GPT-NeoX-20B's 50,277 tokens), for the documented path of docs/authors-checkpoints.md: the tiny fixture
``tests/fixtures/authors/da_new_bf16`` with its embedding and LM head padded by seeded random rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

AUTHORS_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "authors"
SOURCE = "da_new_bf16"
#: The padded folder's max_position_embeddings (the fixture's 64 is shorter than some zero-shot continuations).
MAX_POSITIONS = 256
#: ``--preset``/``--set`` flags of a depthattn model of that folder's shape and options (vocab_size appended).
SHAPE_FLAGS = ("--preset tiny --cross-layer depth_attention --set hidden_size=32 --set intermediate_size=64 "
               "--set num_hidden_layers=4 --set num_attention_heads=4 --set num_key_value_heads=2 --set head_dim=8 "
               "--set max_position_embeddings=256 --set rope_theta=500.0 --set rms_norm_eps=1e-5 "
               "--set depth_attention_stride=2 --set qk_norm_position=k_after_rope")


def padded_authors_folder(dest: Path, vocab_size: int) -> Path:
    """Write ``dest``: the fixture folder with ``vocab_size`` rows (≥ its own 64) in ``embed_tokens`` and
    ``lm_head`` and ``MAX_POSITIONS`` positions (RoPE: no weights depend on it); returns ``dest``."""
    src = AUTHORS_FIXTURES / SOURCE
    config = json.loads((src / "config.json").read_text())
    state = load_file(str(src / "model.safetensors"))
    extra = vocab_size - config["vocab_size"]
    assert extra >= 0, (vocab_size, config["vocab_size"])
    gen = torch.Generator().manual_seed(vocab_size)
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = (torch.randn(extra, state[key].shape[1], generator=gen) * 0.02).to(state[key].dtype)
        state[key] = torch.cat([state[key], rows]).contiguous()
    config["vocab_size"] = vocab_size
    config["max_position_embeddings"] = MAX_POSITIONS
    dest.mkdir(parents=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def copy_tokenizer(tokenizer_json: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_json, dest)
    return dest
