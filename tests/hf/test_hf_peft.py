"""LoRA with the ``peft`` package on a depthattn checkpoint (docs/hf.md, "Fine-tuning with PEFT (LoRA)"): an adapter on
q/k/v/o trains with transformers' ``Trainer`` on real text, saves, reloads with ``PeftModel.from_pretrained`` (the
trained adapter's logits), merges (the same logits) and the merged model is a plain checkpoint again. Which modules
``target_modules`` matches, per method, and what becomes of the method's own parameters, are asserted by name."""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("peft", reason="peft not installed (the test extra: pip install -e '.[test]')")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")

from depthattn import ModelConfig  # noqa: E402
from depthattn.checkpoint import load_model  # noqa: E402
from depthattn.data import embedded_corpus_documents, load_tokenizer  # noqa: E402
from depthattn.hf import DepthAttnConfig, DepthAttnForCausalLM  # noqa: E402
from release_fixtures import FIXTURES  # noqa: E402

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
LAYERS = 2
#: (method, extra fields): the methods with parameters of their own, Depth-Attention, vanilla and a looped model.
CASES = [("none", {}), ("depth_attention", {}), ("mhc", {}), ("attnres", {"attnres_block_size": 1}),
         ("denseformer", {}), ("depth_attention", {"num_loops": 2})]
IDS = [f"{m}{'-loops' + str(kw['num_loops']) if 'num_loops' in kw else ''}" for m, kw in CASES]
#: Linear layers of each method's own (under ``cross_layer``), per decoder layer; the other methods have none.
METHOD_LINEARS = {"mhc": ["cross_layer.connectors.0.phi", "cross_layer.connectors.1.phi"]}


@pytest.fixture(scope="module")
def text_rows():
    """Windows of 33 tokens of the shipped corpus, encoded with the release fixture's 512-token BPE, as Trainer rows
    (``labels`` = ``input_ids``: the model shifts them), and the vocabulary size."""
    tok = load_tokenizer(FIXTURES / "data" / "tokenizer.json")
    text = embedded_corpus_documents()[0][1][:6000]
    ids = torch.tensor(tok.encode(text).ids)
    windows = ids[: len(ids) // 33 * 33].view(-1, 33)[:16]
    assert windows.shape == (16, 33)
    return [{"input_ids": w, "labels": w} for w in windows], tok.get_vocab_size()


def base_checkpoint(folder, vocab, method, **kw):
    """A tiny checkpoint folder of ``method``, its method parameters moved off their vanilla init so that they matter;
    returns the folder."""
    cfg = ModelConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                      cross_layer=method, **kw)
    torch.manual_seed(0)
    model = DepthAttnForCausalLM(DepthAttnConfig.from_model_config(cfg))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "cross_layer" in name:
                p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def load_base(folder):
    return DepthAttnForCausalLM.from_pretrained(folder).eval()


def adapted(peft_model) -> set[str]:
    """Names (relative to ``model.layers.{i}.`` or the model) of the modules LoRA wrapped."""
    from peft.tuners.lora import LoraLayer

    names = set()
    for name, module in peft_model.named_modules():
        if isinstance(module, LoraLayer):
            names.add(name.removeprefix("base_model.model."))
    return names


def per_layer(suffixes) -> set[str]:
    return {f"model.layers.{i}.{s}" for i in range(LAYERS) for s in suffixes}


def attention_names(suffixes) -> list[str]:
    return [f"self_attn.{s}" for s in suffixes]


def mean_loss(model, rows) -> float:
    model.eval()
    with torch.no_grad():
        ids = torch.stack([r["input_ids"] for r in rows])
        return model(input_ids=ids, labels=ids).loss.item()


def logits(model, rows):
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.stack([r["input_ids"] for r in rows[:4]])).logits


def train(model, rows, out, steps=12, lr=2e-2):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=steps, learning_rate=lr,
                             lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, report_to=[],
                             save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True, label_names=["labels"])
    Trainer(model=model, args=args, train_dataset=rows).train()


# -------------------------------------------------------------------------------- train, save, reload, merge
@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_lora_on_attention_trains_saves_reloads_and_merges(tmp_path, text_rows, method, kw):
    from peft import LoraConfig, PeftModel, get_peft_model

    rows, vocab = text_rows
    folder = base_checkpoint(tmp_path / "base", vocab, method, **kw)
    base = load_base(folder)
    frozen = {k: v.clone() for k, v in base.state_dict().items()}
    model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", target_modules=ATTENTION, r=4, lora_alpha=8,
                                            lora_dropout=0.0))
    assert adapted(model) == per_layer(attention_names(ATTENTION))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    before = mean_loss(model, rows)
    train(model, rows, tmp_path / "trainer")
    after = mean_loss(model, rows)
    assert after < before - 0.03, (before, after)  # measured: falls by 0.06 to 0.10
    # the checkpoint's own weights, the method's included, are untouched; the adapter moved
    state = model.get_base_model().state_dict()
    for k, v in frozen.items():
        key = next(s for s in (k, k.replace("_proj.weight", "_proj.base_layer.weight")) if s in state)
        assert torch.equal(state[key], v), k
    assert all(p.abs().sum() > 0 for n, p in model.named_parameters() if ".lora_B." in n)
    trained = logits(model, rows)

    model.save_pretrained(tmp_path / "adapter")
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert sorted(saved["target_modules"]) == sorted(ATTENTION)
    from safetensors.torch import load_file

    keys = load_file(tmp_path / "adapter" / "adapter_model.safetensors").keys()
    assert len(keys) == 2 * 4 * LAYERS and all("lora_" in k for k in keys)

    back = PeftModel.from_pretrained(load_base(folder), tmp_path / "adapter").eval()
    torch.testing.assert_close(logits(back, rows), trained, atol=1e-6, rtol=0)
    merged = back.merge_and_unload()
    assert type(merged) is DepthAttnForCausalLM and not adapted(merged)
    merged_logits = logits(merged, rows)
    torch.testing.assert_close(merged_logits, trained, atol=1e-5, rtol=0)
    assert not torch.allclose(logits(load_base(folder), rows), trained, atol=1e-3)  # the adapter mattered

    merged.save_pretrained(tmp_path / "merged")
    again = DepthAttnForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert list(again.state_dict()) == list(frozen)
    torch.testing.assert_close(logits(again, rows), merged_logits, atol=0, rtol=0)
    core = load_model(tmp_path / "merged").eval()  # the native reader too
    with torch.no_grad():
        ids = torch.stack([r["input_ids"] for r in rows[:4]])
        torch.testing.assert_close(core(ids).logits, merged_logits, atol=0, rtol=0)


# -------------------------------------------------------------------------------- which modules LoRA matches
@pytest.mark.parametrize("method", ["none", "depth_attention", "denseformer", "mhc", "attnres"])
def test_target_modules_match_the_decoder_linears_and_leave_method_parameters_frozen(tmp_path, text_rows, method):
    """q/k/v/o names match only the attention projections; ``"all-linear"`` adds the MLP and, for mHC only, the
    connectors' φ (the output layer ``lm_head`` never); every method parameter is frozen and unchanged."""
    from peft import LoraConfig, get_peft_model

    rows, vocab = text_rows
    folder = base_checkpoint(tmp_path / "base", vocab, method)
    model = get_peft_model(load_base(folder), LoraConfig(target_modules=ATTENTION, r=4))
    assert adapted(model) == per_layer(attention_names(ATTENTION))
    method_params = {n: p for n, p in model.named_parameters() if ".cross_layer." in n}
    assert bool(method_params) == (method in ("denseformer", "mhc", "attnres"))
    assert not any(p.requires_grad for p in method_params.values())

    everything = get_peft_model(load_base(folder), LoraConfig(target_modules="all-linear", r=4))
    linears = attention_names(ATTENTION) + [f"mlp.{s}" for s in MLP] + METHOD_LINEARS.get(method, [])
    assert adapted(everything) == per_layer(linears)
    assert not any(p.requires_grad for n, p in everything.named_parameters() if "lora_" not in n)

    if method in METHOD_LINEARS:  # what docs/hf.md advises for mHC (a test below says why)
        excluded = get_peft_model(load_base(folder), LoraConfig(target_modules="all-linear", exclude_modules=["phi"],
                                                                r=4))
        assert adapted(excluded) == per_layer(linears[:7])


def test_a_lora_adapter_on_mhc_phi_is_never_used(tmp_path, text_rows):
    """mHC's connectors read ``phi.weight`` in float32 themselves (``Connector.maps``), not through ``phi(x)``, so a
    LoRA adapter on φ changes no logit and gets no gradient, yet merging it would add its delta: exclude φ."""
    from peft import LoraConfig, get_peft_model

    rows, vocab = text_rows
    folder = base_checkpoint(tmp_path / "base", vocab, "mhc")
    reference = logits(load_base(folder), rows)
    model = get_peft_model(load_base(folder), LoraConfig(target_modules=["phi"], r=4, init_lora_weights=False))
    assert adapted(model) == per_layer(METHOD_LINEARS["mhc"])
    torch.testing.assert_close(logits(model, rows), reference, atol=0, rtol=0)
    model.train()
    ids = torch.stack([r["input_ids"] for r in rows[:2]])
    assert not model(input_ids=ids, labels=ids).loss.requires_grad


# -------------------------------------------------------------------------------- the method's own parameters
@pytest.mark.parametrize("method", ["denseformer", "mhc", "attnres"])
def test_modules_to_save_trains_the_method_parameters_with_the_adapter(tmp_path, text_rows, method):
    """``modules_to_save=["cross_layer"]`` makes trainable copies of every ``cross_layer`` module (per layer and the
    model-level one); they train, are saved in the adapter file, reload, and merge back under the original names."""
    from peft import LoraConfig, PeftModel, get_peft_model

    rows, vocab = text_rows
    kw = {"attnres_block_size": 1} if method == "attnres" else {}
    folder = base_checkpoint(tmp_path / "base", vocab, method, **kw)
    start = {k: v.clone() for k, v in load_base(folder).state_dict().items() if ".cross_layer." in k or
             k.startswith("model.cross_layer.")}
    assert start
    model = get_peft_model(load_base(folder), LoraConfig(task_type="CAUSAL_LM", target_modules=ATTENTION, r=4,
                                                         lora_alpha=8, lora_dropout=0.0,
                                                         modules_to_save=["cross_layer"]))
    copies = {n for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n}
    assert {n.replace("base_model.model.", "").replace("modules_to_save.default.", "") for n in copies} == set(start)
    train(model, rows, tmp_path / "trainer", steps=4)
    trained = logits(model, rows)
    model.save_pretrained(tmp_path / "adapter")
    back = PeftModel.from_pretrained(load_base(folder), tmp_path / "adapter").eval()
    torch.testing.assert_close(logits(back, rows), trained, atol=1e-6, rtol=0)
    merged = back.merge_and_unload()
    torch.testing.assert_close(logits(merged, rows), trained, atol=1e-5, rtol=0)
    state = merged.state_dict()
    assert set(state) == set(load_base(folder).state_dict())
    assert any(not torch.equal(state[k], v) for k, v in start.items())  # the method parameters trained
