"""The serving engine's depth mix (``depthattn.serving.mix``) equals the core's float64 loop reference."""

import pytest
import torch

from depthattn.cross_layer.depth_attention import depth_mix, depth_mix_ref
from depthattn.serving.mix import token_depth_mix


def heads(x, n, d):
    return x.reshape(x.shape[0], n, d).transpose(0, 1).unsqueeze(0)  # [T, n·D] → [1, n, T, D]


@pytest.mark.parametrize("H,K,N,dtype", [(4, 2, 3, torch.float32), (8, 2, 1, torch.float32), (4, 4, 4, torch.float64),
                                         (6, 2, 2, torch.bfloat16)])
def test_token_mix_equals_the_core_reference(H, K, N, dtype):
    g = torch.Generator().manual_seed(0)
    T, D = 7, 16
    q = torch.randn(T, H * D, generator=g).to(dtype)
    keys = [torch.randn(T, K * D, generator=g).to(dtype) for _ in range(N)]
    values = [torch.randn(T, K * D, generator=g).to(dtype) for _ in range(N)]
    out = token_depth_mix(q, keys, values, H, K, D)
    assert out.dtype == dtype and out.shape == (T, K * D)
    ref = depth_mix_ref(heads(q, H, D), [heads(k, K, D) for k in keys], [heads(v, K, D) for v in values])
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.double(), ref[0].transpose(0, 1).reshape(T, K * D), **tol)
    core = depth_mix(heads(q, H, D), [heads(k, K, D) for k in keys], [heads(v, K, D) for v in values])
    if dtype == torch.float32:
        torch.testing.assert_close(out, core[0].transpose(0, 1).reshape(T, K * D), atol=1e-6, rtol=1e-6)


def test_token_mix_refuses_mismatched_candidates():
    with pytest.raises(ValueError, match="as many keys as values"):
        token_depth_mix(torch.zeros(2, 32), [torch.zeros(2, 16)], [], 2, 1, 16)
