"""torch.compile of the blocks: keys unchanged, graphs bounded by block signatures whatever the depth, compiled
training equal to eager (inductor on CPU), compiled runs save, resume and load strictly."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from depthattn.cross_layer import names as method_names
from depthattn import DecoderLM, ModelConfig
from depthattn.checkpoint import checkpoint_dirs, load_model
from depthattn.training import TrainConfig, read_metrics, resolve_model_config, train
from depthattn.training.parallelize import apply_compile, check_compiler, compile_units

pytestmark = pytest.mark.compile  # torch.compile throughout (dynamo tracing, inductor)


NARROW = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
              vocab_size=128)


def graphs_for(method: str, layers: int) -> tuple[int, int, int]:
    """(dynamo graphs, recompiles, bound) after one forward + backward of a compiled ``layers``-deep model."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig.from_preset("tiny", num_hidden_layers=layers, cross_layer=method, **NARROW))
    keys = list(model.state_dict())
    apply_compile(model, backend="eager")  # dynamo's graph count does not depend on the backend
    assert list(model.state_dict()) == keys  # compiled in place: no _orig_mod
    ids = torch.randint(0, 128, (2, 12))
    model(ids, labels=ids).loss.backward()
    bound = max(n for _, n in compile_units(model))
    return counters["stats"]["unique_graphs"], sum(counters["recompiles"].values()), bound


@pytest.mark.parametrize("method", method_names())
def test_graphs_bounded_by_block_signatures_not_depth(method):
    graphs10, recompiles10, bound = graphs_for(method, 10)
    graphs14, recompiles14, _ = graphs_for(method, 14)
    assert graphs10 == graphs14  # no graph per layer
    assert recompiles10 <= bound - 1 and recompiles14 <= bound - 1
    assert 1 <= graphs10 <= 2 * bound  # one per signature (mhc: its block splits in two)


def test_missing_compiler_is_one_line(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match=r"^TrainConfig.compile=true: .*C\+\+ compiler.*set compile=false$"):
        check_compiler(torch.device("cpu"))


def test_compiled_training_equals_eager_and_resumes(tmp_path, data_dir):
    """Inductor on CPU, 10 layers, AttnRes (sublayer bodies compiled) : losses within 1e-4 of eager, checkpoint keys
    unchanged (strict load), a compiled run resumed mid-way repeats the uninterrupted compiled curve."""
    cfg = resolve_model_config("tiny", {"cross_layer": "attnres", "num_hidden_layers": 10, **NARROW,
                                        "vocab_size": 512}, 512, "tokenizer.json")
    base = dict(steps=4, batch_size=2, seq_len=32, lr=3e-3, eval_every=0, eval_windows=2, save_every=2,
                keep_last=3)
    eager = train(tmp_path / "eager", cfg, TrainConfig(**base), data_dir, progress=False)
    compiled = train(tmp_path / "compiled", cfg, TrainConfig(**base, compile=True), data_dir, progress=False)
    le = [r["loss"] for r in read_metrics(eager.run_dir)]
    lc = [r["loss"] for r in read_metrics(compiled.run_dir)]
    assert max(abs(a - b) for a, b in zip(le, lc)) < 1e-4, (le, lc)
    assert abs(eager.final_val_loss - compiled.final_val_loss) < 1e-4
    model = load_model(compiled.checkpoint)  # strict: every key and shape
    assert not any("_orig_mod" in k for k in model.state_dict())
    for a, b in zip(load_model(eager.checkpoint).parameters(), model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    part = tmp_path / "part"
    train(part, cfg, TrainConfig(**base, compile=True), data_dir, progress=False, stop_after=2)
    assert [p.name for p in checkpoint_dirs(part)] == ["step_00000002"]
    train(part, cfg, TrainConfig(**base, compile=True), data_dir, progress=False, resume=True)
    assert [r["loss"] for r in read_metrics(part)] == lc
