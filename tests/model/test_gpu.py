"""GPU checks (marked ``gpu``; run with ``pytest -m gpu`` on a CUDA machine).

Tolerances: fp32 with TF32 off matches the CPU to 1e-4 (different kernels and reduction orders); bf16 SDPA backends
agree with the math backend to 3e-2 on logits of magnitude ~1 (bf16 has 8 mantissa bits, ~4e-3 relative per op).
"""

import pytest
import torch

from depthattn import DecoderLM, ModelConfig, generate, naive_generate
from depthattn.cross_layer import names as method_names

from conftest import left_padded_batch, make_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("method", sorted(method_names()))
def test_cuda_fp32_matches_cpu_and_cached_decode_matches_full(method):
    cpu = make_model(cross_layer=method)
    gpu = make_model(cross_layer=method).cuda()
    gpu.load_state_dict(cpu.state_dict())
    ids, mask = left_padded_batch(512, [10, 6], seed=1)
    with torch.no_grad():
        ref = cpu(ids, attention_mask=mask).logits
        full = gpu(ids.cuda(), attention_mask=mask.cuda()).logits
        torch.testing.assert_close(full.cpu()[mask], ref[mask], atol=1e-4, rtol=0)
        cache = gpu.new_cache(2, 10)
        parts = [gpu(ids[:, :4].cuda(), attention_mask=mask[:, :4].cuda(), cache=cache).logits]
        for t in range(4, 10):
            parts.append(gpu(ids[:, t:t + 1].cuda(), attention_mask=mask[:, :t + 1].cuda(), cache=cache).logits)
    torch.testing.assert_close(torch.cat(parts, 1)[mask.cuda()], full[mask.cuda()], atol=1e-5, rtol=0)
    fast = generate(gpu, ids.cuda(), 6, temperature=0, attention_mask=mask.cuda())
    assert torch.equal(fast, naive_generate(gpu, ids.cuda(), 6, attention_mask=mask.cuda()))


def test_sdpa_backends_agree_in_bf16():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("tiny", cross_layer="depth_attention", num_hidden_layers=5,
                                  depth_attention_stride=2, head_dim=64, num_attention_heads=4, hidden_size=256)
    model = DecoderLM(cfg).cuda().to(torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 128), device="cuda")
    out = {}
    with torch.no_grad():
        for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.CUDNN_ATTENTION):
            try:
                with sdpa_kernel(backend):
                    out[backend] = model(ids).logits.float()
            except RuntimeError as e:  # a backend unavailable for this build/shape
                print(f"skip {backend}: {e}")
    assert SDPBackend.MATH in out and len(out) >= 2
    for backend, logits in out.items():
        torch.testing.assert_close(logits, out[SDPBackend.MATH], atol=3e-2, rtol=0)


@pytest.mark.parametrize("method", sorted(method_names()))
def test_bf16_autocast_training_step_is_finite(method):
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig.from_preset("tiny", cross_layer=method)).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 512, (4, 64), device="cuda")
    losses = []
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gqa_attention_never_needs_sdpas_math_kernel(dtype):
    """``functional.attention`` takes ``enable_gqa`` only where flash serves it: with the math kernel disallowed,
    unmasked GQA attention (training, prefill) still runs, in float32 (expanded K/V, memory-efficient kernel) and
    bf16 (flash), and equals the float32 twin."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from depthattn.functional import attention, attention_ref

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 8, 64, 64, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(2, 2, 64, 64, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        out = attention(q, k, v, None, is_causal=True)
    from depthattn.functional import causal_padding_mask

    ref = attention_ref(q, k, v, causal_padding_mask(None, 0, 64, 64, torch.float32, "cuda"))
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2 if dtype == torch.bfloat16 else 1e-4, rtol=0)
