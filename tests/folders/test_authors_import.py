"""``depthattn convert --from-authors`` and the model-folder readers (issue 26 items 2 and 4).

Tiny folders in the authors' on-disk format are built here (``tests/authors_folders.py``: their names, both switch
generations and a loader-saved config for every method); the conversion is checked field by field and tensor by
tensor against the source, every refusal through the CLI (exit 2, one line, nothing written), and the sharded
safetensors writer against ``safetensors``' own reader. Forward parity with float64 references of their math is
the audit's (tests/fixtures/authors/).
"""

from __future__ import annotations

import json

import pytest
import torch
from authors_folders import authors_config, authors_state, write_authors_folder
from safetensors.torch import load_file

from depthattn.checkpoint import load_config, load_model, load_state, save_model
from depthattn.cli import main
from depthattn.config import ModelConfig
from depthattn.folders import folder_format, open_model
from depthattn.folders.shards import INDEX_NAME, SINGLE_NAME, stored_shapes, weight_files, write_shards
from depthattn.model import DecoderLM

GENERATIONS = ("new", "old", "loader")


def convert(src, out, *extra):
    return main(["convert", "--from-authors", str(src), "--out", str(out), *extra])


def folder_of(tmp_path, method="depth_attention", generation="new", shards=1, state=None, **changes):
    values = authors_config(method, generation, **changes)
    state = authors_state(values) if state is None else state
    return write_authors_folder(tmp_path / "src", values, state, shards), values, state


# ------------------------------------------------------------------------------------------------ the switches
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("method", ["depth_attention", "mhc", "attnres", "denseformer"])
def test_switches_resolve_as_their_code(tmp_path, capsys, method, generation):
    src, values, _ = folder_of(tmp_path, method, generation, shards=2 if generation == "old" else 1)
    assert convert(src, tmp_path / "out") == 0
    out = capsys.readouterr().out.splitlines()
    cfg = load_config(tmp_path / "out")
    assert cfg.cross_layer == method
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (96, 32, 48, 4)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 8)
    assert (cfg.rms_norm_eps, cfg.rope_theta, cfg.max_position_embeddings) == (1e-5, 10000.0, 64)
    assert cfg.tie_word_embeddings is False and cfg.initializer_range == 0.01
    expected = {"depth_attention": dict(depth_attention_stride=2, depth_attention_window=1,
                                        qk_norm_position="k_after_rope"),
                "mhc": dict(mhc_num_streams=2, mhc_sinkhorn_iters=7, mhc_sinkhorn="exp",
                            qk_norm_position="before_rope"),
                "attnres": dict(attnres_block_size=3, qk_norm_position="before_rope",
                                attnres_recency_bias=3.0 if generation == "old" else 2.5),
                "denseformer": dict(denseformer_period=2, denseformer_dilation=1,
                                    qk_norm_position="before_rope")}[method]
    assert {k: getattr(cfg, k) for k in expected} == expected
    said = [line for line in out if line.startswith("qk_norm_position=")]
    assert len(said) == 1 and said[0].startswith(f"qk_norm_position={cfg.qk_norm_position}: ")
    generation_cfg = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert (generation_cfg["bos_token_id"], generation_cfg["eos_token_id"], generation_cfg["pad_token_id"]) == (0, 0, 1)


@pytest.mark.parametrize("changes, stride, window", [
    ({}, 1, 0),  # no stride key: every earlier layer (their default), not half the layers
    ({"depth_softmax_stride": 3, "depth_recent_window": 2}, 3, 2),  # the older names alone
    ({"depth_attention_stride": 2, "depth_softmax_stride": 3}, 2, 0),  # the newer name first
    ({"depth_attention_stride": 0, "depth_attention_recent_window": -1}, 1, 0),  # <= 1: every layer; <= 0: none
])
def test_stride_and_window_fall_back_as_their_code(tmp_path, changes, stride, window):
    values = {k: v for k, v in authors_config("depth_attention").items() if "stride" not in k and "window" not in k}
    write_authors_folder(tmp_path / "src", {**values, **changes}, authors_state(values))
    cfg = open_model(tmp_path / "src").config
    assert (cfg.depth_attention_stride, cfg.depth_attention_window) == (stride, window)


def test_mhc_streams_fall_back_to_the_environment_then_four(tmp_path, monkeypatch, capsys):
    values = {k: v for k, v in authors_config("mhc").items() if "num_streams" not in k}
    write_authors_folder(tmp_path / "src", values, authors_state({**values, "mhc_num_streams": 2}))
    monkeypatch.setenv("MHC_NUM_STREAMS", "2")
    assert open_model(tmp_path / "src").config.mhc_num_streams == 2
    monkeypatch.delenv("MHC_NUM_STREAMS")  # 4 streams, but the tensors hold 2: a shape mismatch, in one line
    assert convert(tmp_path / "src", tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the shape" in err[0] and "mhc_num_streams=4) needs" in err[0], err


def test_qk_norm_position_can_be_overridden(tmp_path, capsys):
    src, _, _ = folder_of(tmp_path, "depth_attention")
    assert convert(src, tmp_path / "out", "--qk-norm-position", "before_rope") == 0
    assert load_config(tmp_path / "out").qk_norm_position == "before_rope"
    assert "qk_norm_position=before_rope: as --qk-norm-position asks" in capsys.readouterr().out


def test_vanilla_is_imported_only_when_asked(tmp_path, capsys):
    values = {k: v for k, v in authors_config("depth_attention").items() if k != "recurrent_model"}
    write_authors_folder(tmp_path / "src", values, authors_state(values))  # their released 3B DA config has none
    assert convert(tmp_path / "src", tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "recurrent_model is absent" in err[0] and "--allow-vanilla" in err[0]
    assert not (tmp_path / "out").exists()
    assert convert(tmp_path / "src", tmp_path / "out", "--allow-vanilla") == 0
    assert "importing as vanilla (cross_layer='none'): recurrent_model is absent" in capsys.readouterr().out
    assert load_config(tmp_path / "out").cross_layer == "none"


# ------------------------------------------------------------------------------------------------ the tensors
def their_tensor_for(ours: str, state: dict[str, torch.Tensor], cfg: ModelConfig) -> torch.Tensor:
    """Our tensor ``ours`` written out from their names by hand (the mapping the importer implements)."""
    parts = ours.split(".")
    if ".cross_layer." not in ours and not ours.startswith("model.cross_layer"):
        return state[ours]
    if cfg.cross_layer == "mhc":
        if ours == "model.cross_layer.readout":
            return state["model.residual_stream_projector.reduce_logits"]
        i, c, leaf = parts[2], int(parts[5]), ".".join(parts[6:])
        p = f"model.layers.{i}.{('attn', 'mlp')[c]}_residual_connector."
        return {"norm.weight": lambda: state[p + "mhc_input_norm.weight"],
                "phi.weight": lambda: state[p + "mhc_dynamic_projection.weight"],
                "alpha": lambda: torch.tensor([state[p + a].item() for a in ("alpha_pre", "alpha_post", "alpha_res")]),
                "bias": lambda: torch.cat([state[p + "pre_logits"], state[p + "post_logits"],
                                           state[p + "residual_logits"].flatten()])}[leaf]()
    if cfg.cross_layer == "attnres":
        theirs = {"query": "pseudo_query", "key_gain": "norm.weight", "recency_bias": "recency_bias"}[parts[-1]]
        if ours.startswith("model.cross_layer."):
            return state[f"model.attnres_final_aggregator.{theirs}"][None]
        i = parts[2]
        return torch.stack([state[f"model.layers.{i}.attnres_{s}_aggregator.{theirs}"] for s in ("attn", "mlp")])
    assert cfg.cross_layer == "denseformer" and parts[-1] == "alpha"
    return state[f"model.densetransformer_dwa.alphas.{parts[2]}"]


@pytest.mark.parametrize("method", ["depth_attention", "mhc", "attnres", "denseformer"])
def test_every_tensor_lands_where_it_should(tmp_path, method):
    src, values, state = folder_of(tmp_path, method, shards=3)
    assert convert(src, tmp_path / "out") == 0
    cfg, ours = load_config(tmp_path / "out"), load_state(tmp_path / "out")
    assert set(ours) == set(DecoderLM(cfg).state_dict())  # nothing dropped, nothing added
    for name, tensor in ours.items():
        assert torch.equal(tensor, their_tensor_for(name, state, cfg)), name
    used = {"lm_head_layernorm.weight"} | {k for k in state if k.startswith("model.densetransformer_dwa.")
                                           and state[k].numel() == 0}
    assert "lm_head_layernorm.weight" in state and all(k not in ours for k in used)


def test_attnres_without_recency_biases_is_the_older_form(tmp_path):
    values = authors_config("attnres")
    write_authors_folder(tmp_path / "src", values, authors_state(values, recency=False))
    assert open_model(tmp_path / "src").config.attnres_recency_bias is None


def test_load_model_opens_an_authors_folder_directly(tmp_path):
    from depthattn.hf.convert import load_any_model

    src, _, _ = folder_of(tmp_path, "mhc", shards=2)
    assert convert(src, tmp_path / "out") == 0
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(1))
    want = load_model(tmp_path / "out")(ids).logits
    assert open_model(src).format == "authors" and folder_format(tmp_path / "out") == "depthattn"
    for load in (load_model, load_any_model):
        assert torch.equal(load(src)(ids).logits, want)


def test_converted_sharded_folder_loads_with_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from depthattn.hf.convert import convert_from_authors

    src, _, _ = folder_of(tmp_path, "depth_attention")
    convert_from_authors(src, tmp_path / "out", shard_bytes=40_000)
    manifest = json.loads((tmp_path / "out" / "checksums.json").read_text())
    shards = sorted(p.name for p in (tmp_path / "out").glob("model-*.safetensors"))
    assert len(shards) > 2 and not (tmp_path / "out" / SINGLE_NAME).exists()
    assert set(shards) | {INDEX_NAME} <= set(manifest["sha256"])
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(2))
    ours = load_model(tmp_path / "out")(ids).logits
    assert torch.equal(load_model(src)(ids).logits, ours)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours, atol=1e-5, rtol=0)


def test_dtype_and_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models

    vocab = {"<|endoftext|>": 0, "<pad>": 1, **{f"w{i}": i + 2 for i in range(40)}}
    Tokenizer(models.WordLevel(vocab, unk_token="<pad>")).save(str(tmp_path / "tokenizer.json"))
    src, _, state = folder_of(tmp_path, "denseformer")
    assert convert(src, tmp_path / "out", "--dtype", "bfloat16", "--tokenizer", str(tmp_path / "tokenizer.json")) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    written = load_state(tmp_path / "out")
    assert {t.dtype for t in written.values()} == {torch.bfloat16}
    assert torch.equal(written["model.embed_tokens.weight"], state["model.embed_tokens.weight"].bfloat16())
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (tmp_path / "tokenizer.json").read_bytes()
    assert (tmp_path / "out" / "tokenizer_config.json").is_file()


# ------------------------------------------------------------------------------------------------ refusals
REFUSALS = [
    ({"scale_embeds": True}, "scale_embeds=True is not supported"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling={'type': 'linear', 'factor': 2.0} is not"),
    ({"pretraining_tp": 2}, "pretraining_tp=2 is not supported"),
    ({"attention_bias": True}, "attention_bias=True is not supported"),
    ({"mlp_bias": True}, "mlp_bias=True is not supported"),
    ({"use_qk_norm": False}, "use_qk_norm=False is not supported"),
    ({"cross_layer_pattern": "dense"}, "cross_layer_pattern='dense' is not a switch depthattn imports"),
    ({"cross_layer_mode": "v0_mix"}, "cross_layer_mode='v0_mix' is not a switch depthattn imports"),
    ({"recurrent_model": "yes"}, "recurrent_model='yes' is not true or false"),
    ({"depth_attention_stride": "two"}, "depth_attention_stride='two' is not an integer"),
    ({"depth_attention_stride": None}, "depth_attention_stride=None is not an integer"),
    ({"baseline_mode": "densenet"}, "baseline_mode='densenet' is not a baseline their code runs"),
    ({"baseline_mode": "mhc"}, "baseline_mode='mhc' and Depth-Attention are both on"),
    ({"model_type": "mistral"}, None),  # not theirs at all: read as a depthattn folder, refused naming model_type
]


@pytest.mark.parametrize("changes, message", REFUSALS, ids=[next(iter(c)) + "-" + str(i) for i, (c, _) in
                                                              enumerate(REFUSALS)])
def test_config_refusals_are_one_line(tmp_path, capsys, changes, message):
    src, _, _ = folder_of(tmp_path, "depth_attention", **changes)
    assert convert(src, tmp_path / "out") == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthattn convert: error:"), err
    assert "Traceback" not in captured.err and not (tmp_path / "out").exists()
    assert (message or "model_type='mistral'") in err[0]


NUMBERS = [("depth_attention", {"rope_theta": "abc"}, "rope_theta='abc' is not a number"),
           ("depth_attention", {"rms_norm_eps": [1e-5]}, "rms_norm_eps=[1e-05] is not a number"),
           ("depth_attention", {"attention_dropout": "x"}, "attention_dropout='x' is not a number"),
           ("mhc", {"mhc_alpha_init": "big"}, "mhc_alpha_init='big' is not a number"),
           ("attnres", {"attnres_recency_bias_init": True}, "attnres_recency_bias_init=True is not a number")]


@pytest.mark.parametrize("method, changes, message", NUMBERS, ids=[next(iter(c)) for _, c, _ in NUMBERS])
def test_a_number_field_that_is_not_a_number_is_refused_naming_it(tmp_path, capsys, method, changes, message):
    src, _, _ = folder_of(tmp_path, method, **changes)
    assert convert(src, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthattn convert: error:") and message in err[0], err
    assert "config.json" in err[0] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("method, key", [("mhc", "mhc_alpha_init"), ("attnres", "attnres_recency_bias_init")])
def test_a_null_init_value_reads_as_their_default(tmp_path, method, key):
    """Init-only values (the trained ones are in the weights): null reads as the default, not a crash."""
    src, _, _ = folder_of(tmp_path, method, **{key: None})
    assert convert(src, tmp_path / "out") == 0
    cfg = load_config(tmp_path / "out")
    assert (cfg.mhc_alpha_init == 0.01) if method == "mhc" else (cfg.attnres_recency_bias == 3.0)


def test_conflicting_baseline_selectors_are_refused(tmp_path, capsys):
    src, _, _ = folder_of(tmp_path, "mhc", residual_baseline="attnres")
    assert convert(src, tmp_path / "out") == 2
    assert "baseline_mode='mhc' and residual_baseline='attnres' conflict" in capsys.readouterr().err


def _drop(state, key):
    return {k: v for k, v in state.items() if k != key}


@pytest.mark.parametrize("edit, message", [
    (lambda s: {k: v for k, v in s.items() if "q_norm" not in k},
     "is a Llama checkpoint without q/k-norm (no model.layers.N.self_attn.q_norm.weight)"),
    (lambda s: _drop(s, "model.layers.2.attn_residual_connector.alpha_res"),
     "lacks model.layers.2.attn_residual_connector.alpha_res (1 missing tensor(s))"),
    (lambda s: {**s, "model.layers.0.self_attn.v_norm.weight": torch.ones(8)},
     "holds model.layers.0.self_attn.v_norm.weight (1 unexpected tensor(s))"),
    (lambda s: {**s, "model.layers.1.self_attn.q_proj.weight": torch.zeros(30, 32)},
     "model.layers.1.self_attn.q_proj.weight gives model.layers.1.self_attn.q_proj.weight the shape (30, 32)"),
    (lambda s: {**s, "model.layers.3.mlp_residual_connector.residual_logits": torch.zeros(2, 3)},
     "give model.layers.3.cross_layer.connectors.1.bias the shape (10,)"),
])
def test_tensor_refusals_are_one_line(tmp_path, capsys, edit, message):
    values = authors_config("mhc")
    write_authors_folder(tmp_path / "src", values, edit(authors_state(values)))
    assert convert(tmp_path / "src", tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not (tmp_path / "out").exists(), err


def test_missing_and_extra_shards_are_refused(tmp_path, capsys):
    src, _, _ = folder_of(tmp_path, "attnres", shards=3)
    extra = src / "model-00004-of-00004.safetensors"
    extra.write_bytes((src / "model-00001-of-00003.safetensors").read_bytes())
    assert convert(src, tmp_path / "out") == 2
    assert "holds model-00004-of-00004.safetensors, a shard model.safetensors.index.json does not name" in \
        capsys.readouterr().err
    extra.unlink()
    (src / "model-00002-of-00003.safetensors").unlink()
    assert convert(src, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "names shard 'model-00002-of-00003.safetensors'" in err[0] and "missing shard" in err[0]


@pytest.mark.parametrize("flag", ["--from-qwen3", "--upgrade"])
def test_qwen3_and_upgrade_point_an_authors_folder_to_from_authors(tmp_path, capsys, flag):
    src, _, _ = folder_of(tmp_path, "depth_attention")
    assert main(["convert", flag, str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hyq718/Depth-Attention" in err[0] and "--from-authors" in err[0], err


def test_from_qwen3_keeps_the_knobs_given_with_set(tmp_path, capsys):
    from depthattn.hf.convert import save_qwen3

    save_qwen3(DecoderLM(ModelConfig.from_preset("tiny")), tmp_path / "q3")
    assert main(["convert", "--from-qwen3", str(tmp_path / "q3"), "--out", str(tmp_path / "a"),
                 "--cross-layer", "depth_attention", "--set", "depth_attention_stride=1"]) == 0
    assert load_config(tmp_path / "a").depth_attention_stride == 1
    assert "depth_attention_stride=1" in capsys.readouterr().out
    assert main(["convert", "--from-qwen3", str(tmp_path / "q3"), "--out", str(tmp_path / "b"),
                 "--cross-layer", "depth_attention"]) == 0
    assert load_config(tmp_path / "b").depth_attention_stride == 2  # unset: half the layers, as before


# ------------------------------------------------------------------------------------------------ shards
def test_sharded_write_reads_back_with_safetensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(7, 5, generator=g), "b.bias": torch.randn(3, generator=g).bfloat16(),
               "c.scalar": torch.tensor(2.5), "d.empty": torch.empty(0), "e.big": torch.randn(40, 9, generator=g),
               "f.half": torch.randn(4, 4, generator=g).half()}
    plan = {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}
    written = write_shards(tmp_path, plan, lambda k: tensors[k], shard_bytes=200)
    assert written[-1] == INDEX_NAME and len(written) == 4  # a, b..d, e, f: e alone exceeds the bound
    back = {}
    for file in written[:-1]:
        back.update(load_file(tmp_path / file))
    assert set(back) == set(tensors)
    assert all(back[k].dtype == v.dtype and torch.equal(back[k], v) for k, v in tensors.items())
    index, where = weight_files(tmp_path)
    assert index.endswith(INDEX_NAME) and stored_shapes(where) == {k: tuple(v.shape) for k, v in tensors.items()}
    single = tmp_path / "one"
    single.mkdir()
    assert write_shards(single, plan, lambda k: tensors[k]) == [SINGLE_NAME]
    assert all(torch.equal(load_file(single / SINGLE_NAME)[k], v) for k, v in tensors.items())


def test_our_loader_reads_a_sharded_checkpoint(tmp_path):
    model = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="mhc"))
    save_model(model, tmp_path / "one")
    folder = open_model(tmp_path / "one")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    from depthattn.checkpoint import save_folder_files

    files = save_folder_files(folder, sharded, shard_bytes=30_000)
    assert len(files) > 3 and files[-1] == INDEX_NAME
    loaded = load_model(sharded)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


def test_the_dcp_reader_gathers_shards(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from depthattn.checkpoint import save_config_files

    model = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="attnres"))
    (tmp_path / "ck").mkdir()
    save_config_files(model.config, tmp_path / "ck", "float32")
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(tmp_path / "ck" / "dcp"), no_dist=True)
    folder = open_model(tmp_path / "ck")
    assert folder.format == "dcp"
    assert all(torch.equal(folder.tensors[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match=r"sharded FSDP checkpoint .*depthattn export"):
        load_model(tmp_path / "ck")


@pytest.mark.parametrize("mode", [None, "residual"])
def test_an_old_generation_pattern_without_the_depth_softmax_mode_is_imported_with_a_note(tmp_path, capsys, mode):
    """cross_layer_pattern=depth_softmax with cross_layer_mode missing or 'residual': their newest code (3bdad70)
    runs Depth-Attention, their older one (019daf9) another method; imported as the newest reads it, said in a line.
    With the mode set to depth_softmax both agree, and nothing is said."""
    changes = {"cross_layer_mode": mode}
    src, values, _ = folder_of(tmp_path, "depth_attention", "old", **changes)
    if mode is None:
        values.pop("cross_layer_mode")
        (src / "config.json").write_text(__import__("json").dumps(values))
    assert convert(src, tmp_path / "out") == 0
    out = capsys.readouterr().out
    assert load_config(tmp_path / "out").cross_layer == "depth_attention"
    assert "read as Depth-Attention, as their newest code (3bdad70) runs it" in out
    src2, _, _ = folder_of(tmp_path / "agree", "depth_attention", "old")
    assert convert(src2, tmp_path / "out2") == 0
    assert "their older code" not in capsys.readouterr().out
