"""torch_npu's paged KV-cache writer, ``npu_scatter_pa_kv_cache``, as aten index writes into the caches.

``npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
compress_seq_offsets=None, seq_lens=None, cache_mode='PA_NZ') -> ()`` writes token ``t`` of ``key``/``value``
(T, N, D) to slot ``s = slot_mapping[t]``, i.e. block ``s // block_size`` at offset ``s % block_size``, in place:

* ``cache_mode`` None / 'Norm' (the documented second case): caches (blocks, block_size, N, D),
  ``cache[s // bs, s % bs] = key[t]``;
* 'PA_NZ' (the first case): caches (blocks, N * D // last, block_size, last), the token's N * D values split
  into rows of ``last``: ``cache[s // bs, :, s % bs, :] = key[t].reshape(N * D // last, last)``.

Refused (ValueError): 4-D key/value with ``compress_lens``/``compress_seq_offsets``/``seq_lens`` (the third,
compressing case: the page gives its shapes but not how the compression selects tokens).
"""
from __future__ import annotations

import torch

_OP = "npu_scatter_pa_kv_cache"


def _fail(msg):
    raise ValueError(f"{_OP}: {msg}")


def _write(name, tokens, cache, slots, cache_mode):
    if tokens.dim() != 3:
        _fail(f"{name} must be (tokens, heads, head_size), got {tuple(tokens.shape)}")
    if cache.dim() != 4 or cache.dtype != tokens.dtype:
        _fail(f"{name}_cache must be 4-D of {name}'s dtype {tokens.dtype}, got {tuple(cache.shape)} {cache.dtype}")
    width = tokens.shape[1] * tokens.shape[2]
    if cache_mode in (None, "Norm"):
        if tuple(cache.shape[2:]) != tuple(tokens.shape[1:]):
            _fail(f"{name}_cache must be (blocks, block_size, {tokens.shape[1]}, {tokens.shape[2]}), "
                  f"got {tuple(cache.shape)}")
        bs = cache.shape[1]
        cache.index_put_((slots // bs, slots % bs), tokens)
        return
    if cache.shape[1] * cache.shape[3] != width:
        _fail(f"{name}_cache must be (blocks, {width} // last, block_size, last) for cache_mode 'PA_NZ', "
              f"got {tuple(cache.shape)}")
    bs = cache.shape[2]
    # advanced indices around a full slice: the indexed view is (tokens, N * D // last, last)
    cache[slots // bs, :, slots % bs] = tokens.reshape(tokens.shape[0], cache.shape[1], cache.shape[3])


def npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
                            compress_seq_offsets=None, seq_lens=None, cache_mode="PA_NZ"):
    for name, t in (("compress_lens", compress_lens), ("compress_seq_offsets", compress_seq_offsets),
                    ("seq_lens", seq_lens)):
        if t is not None:
            _fail(f"{name} (the compressing case) is not supported")
    if cache_mode not in (None, "Norm", "PA_NZ"):
        _fail(f"cache_mode must be None, 'Norm' or 'PA_NZ', got {cache_mode!r}")
    if key.shape[:2] != value.shape[:2]:
        _fail(f"key {tuple(key.shape)} and value {tuple(value.shape)} must share their first two dims")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != key.shape[0]:
        _fail(f"slot_mapping must be ({key.shape[0]},), got {tuple(slot_mapping.shape)}")
    slots = slot_mapping.to(torch.int64)
    _write("key", key, key_cache, slots, cache_mode)
    _write("value", value, value_cache, slots, cache_mode)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_scatter_pa_kv_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
            "Tensor slot_mapping, *, Tensor? compress_lens=None, Tensor? compress_seq_offsets=None, "
            "Tensor? seq_lens=None, str? cache_mode='PA_NZ') -> ()")
_lib.impl("npu_scatter_pa_kv_cache", npu_scatter_pa_kv_cache, "CompositeImplicitAutograd")
