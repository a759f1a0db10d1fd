"""torch_npu's paged KV-cache writer against a per-token loop over the documented cache layouts."""
import pytest
import torch

import torch_npu

from ._common import NPU, ops


def _tokens(seed):
    g = torch.Generator().manual_seed(seed)
    key, value = torch.randn(5, 2, 8, generator=g), torch.randn(5, 2, 16, generator=g)
    slots = torch.randperm(3 * 4, generator=g)[:5].to(torch.int32)  # 3 blocks of 4 slots, distinct
    return key, value, slots


@pytest.mark.parametrize("mode", ["Norm", None])
def test_scatter_pa_kv_cache_nd(mode):
    key, value, slots = _tokens(0)
    kc, vc = torch.randn(3, 4, 2, 8), torch.randn(3, 4, 2, 16)
    kn, vn = kc.to(NPU), vc.to(NPU)
    torch_npu.npu_scatter_pa_kv_cache(key.to(NPU), value.to(NPU), kn, vn, slots.to(NPU), cache_mode=mode)
    for t, s in enumerate(slots.tolist()):
        kc[s // 4, s % 4] = key[t]
        vc[s // 4, s % 4] = value[t]
    torch.testing.assert_close(kn.cpu(), kc)
    torch.testing.assert_close(vn.cpu(), vc)


def test_scatter_pa_kv_cache_pa_nz():
    key, value, slots = _tokens(1)
    last = 4
    kc, vc = torch.randn(3, 16 // last, 4, last), torch.randn(3, 32 // last, 4, last)
    kn, vn = kc.to(NPU), vc.to(NPU)
    torch_npu.npu_scatter_pa_kv_cache(key.to(NPU), value.to(NPU), kn, vn, slots.to(NPU))
    for t, s in enumerate(slots.tolist()):
        flat_k, flat_v = key[t].flatten().tolist(), value[t].flatten().tolist()
        for c in range(kc.shape[1]):
            for i in range(last):
                kc[s // 4, c, s % 4, i] = flat_k[c * last + i]
        for c in range(vc.shape[1]):
            for i in range(last):
                vc[s // 4, c, s % 4, i] = flat_v[c * last + i]
    torch.testing.assert_close(kn.cpu(), kc)
    torch.testing.assert_close(vn.cpu(), vc)
    with pytest.raises(ValueError, match="npu_scatter_pa_kv_cache: seq_lens"):
        torch_npu.npu_scatter_pa_kv_cache(key.to(NPU), value.to(NPU), kn, vn, slots.to(NPU),
                                          seq_lens=torch.tensor([5], device=NPU))


def test_kv_cache_compile():
    def fn(key, value, kc, vc, slots):
        ops.npu_scatter_pa_kv_cache(key, value, kc, vc, slots, cache_mode="Norm")
        return kc.sum() + vc.sum()

    key, value, slots = _tokens(2)
    caches = [torch.zeros(3, 4, 2, 8).to(NPU), torch.zeros(3, 4, 2, 16).to(NPU)]
    eager = fn(key.to(NPU), value.to(NPU), *caches, slots.to(NPU))
    caches_c = [torch.zeros(3, 4, 2, 8).to(NPU), torch.zeros(3, 4, 2, 16).to(NPU)]
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(key.to(NPU), value.to(NPU), *caches_c, slots.to(NPU))
    torch.testing.assert_close(out.cpu(), eager.cpu())
    for a, b in zip(caches_c, caches):
        torch.testing.assert_close(a.cpu(), b.cpu())
