"""torch_npu's Native Sparse Attention selected attention for decoding, ``npu_nsa_select_attention_infer``.

``npu_nsa_select_attention_infer(query, key, value, topk_indices, scale_value, head_num, key_value_head_num,
select_block_size, select_block_count, page_block_size, *, layout='BSND', atten_mask=None, block_table=None,
actual_seq_qlen=None, actual_seq_kvlen=None) -> Tensor``: one query token per batch item attends only the key
blocks its kv head selected, read from a paged kv cache::

    out[b, h] = softmax(scale_value * q[b, h] K_sel^T) V_sel

* Query layouts: "BSH" (B, 1, head_num * D), "BSND" (B, 1, head_num, D), "TND" (B, head_num, D) (one token per
  item, so T = B). The output has query's layout and dtype with value's head size Dv in place of D.
* Paged kv cache (the only documented form): ``key`` / ``value`` are block pools (block_num, page_block_size, H)
  or (block_num, page_block_size, key_value_head_num, D) (each independently). Token ``t`` of item ``b`` lives in
  block ``block_table[b, t // page_block_size]`` at row ``t % page_block_size``; item ``b`` has
  ``actual_seq_kvlen[b]`` tokens.
* Selection: ``topk_indices`` (B, key_value_head_num, select_block_count), int32. Entry ``i`` selects the tokens
  ``[i * select_block_size, (i + 1) * select_block_size)`` of the item, cut at ``actual_seq_kvlen[b]`` (a last,
  partial block contributes its valid tokens); -1 selects nothing (the page's example pads with it). K_sel /
  V_sel are the selected tokens of kv head ``h // (head_num / key_value_head_num)`` (grouped-query attention); a
  block listed twice counts twice. A query head that selects no token gives 0.
* Scores and softmax in float32, the output cast to query's dtype. Inference only: no gradient.

Rejected with a ValueError naming the argument (the page's constraints): dtypes other than float16 / bfloat16 (query,
key and value alike), topk_indices / block_table not int32, non-contiguous or empty tensors, a query S other than 1,
``head_num`` / ``key_value_head_num`` not matching the shapes or not a multiple, more than 16 query heads per kv
head, more than 256 kv heads, a batch above 3072, query / key D other than 192, value D other than 128,
``page_block_size`` not matching the pools or above 128, ``select_block_size`` not a multiple of 16, no
``block_table`` (only paged attention is supported), no ``actual_seq_kvlen``, ``atten_mask`` and
``actual_seq_qlen`` (documented as not supported yet), a block table row too short for its item or naming a block
outside the pools, and a topk entry below -1 or selecting a block that starts at or past the item's length.

``select_block_count`` is held to the number of select blocks the longest item has,
``ceil(max(actual_seq_kvlen) / select_block_size)``: the page states ``select_block_count * select_block_size <=
max(actual_seq_kvlen)``, but its own example (count 2, size 64, lengths [82]) breaks that formula and fits this one.
"""
from __future__ import annotations

import torch
from torch.library import custom_op

_OP = "npu_nsa_select_attention_infer"
_LAYOUTS = ("BSH", "BSND", "TND")
_D_QK, _D_V = 192, 128
_MAX_BATCH, _MAX_KV_HEADS, _MAX_GROUP, _MAX_PAGE = 3072, 256, 16, 128


def _fail(msg):
    raise ValueError(f"{_OP}: {msg}")


def _plain(name, t, dtypes, fix):
    if t.dtype not in dtypes:
        _fail(f"{name} must be {' or '.join(str(d).replace('torch.', '') for d in dtypes)} ({fix}), got {t.dtype}")
    if t.numel() == 0:
        _fail(f"{name} must not be empty, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        _fail(f"{name} must be contiguous (pass {name}.contiguous())")


def _pool_heads(name, pool, page_block_size, kv_heads, head_dim):
    """Check a (block_num, page, H) / (block_num, page, N, D) pool; returns its block count."""
    if pool.dim() == 3:
        if pool.shape[2] != kv_heads * head_dim:
            _fail(f"{name} (block_num, page_block_size, H) needs H = key_value_head_num * {head_dim} = "
                  f"{kv_heads * head_dim}, got {tuple(pool.shape)}")
    elif pool.dim() == 4:
        if pool.shape[2] != kv_heads or pool.shape[3] != head_dim:
            _fail(f"{name} (block_num, page_block_size, N, D) needs N = key_value_head_num = {kv_heads} and "
                  f"D = {head_dim}, got {tuple(pool.shape)}")
    else:
        _fail(f"{name} must be the paged cache (block_num, page_block_size, H) or (block_num, page_block_size, N, D), "
              f"got {tuple(pool.shape)}")
    if pool.shape[1] != page_block_size:
        _fail(f"{name}'s block size {pool.shape[1]} must equal page_block_size ({page_block_size})")
    return pool.shape[0]


def _check(query, key, value, topk_indices, block_table, head_num, key_value_head_num, select_block_size,
           select_block_count, page_block_size, layout, actual_seq_kvlen):
    """Every check that needs only shapes, dtypes and the int arguments (shared by the kernel and the fake).
    Returns (batch, value head dim)."""
    if layout not in _LAYOUTS:
        _fail(f"layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        _plain(name, t, (torch.float16, torch.bfloat16), "cast it with .half() or .bfloat16()")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        _fail(f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    _plain("topk_indices", topk_indices, (torch.int32,), "topk_indices.int()")
    if block_table is None:
        _fail("block_table is required: only paged attention is supported (pass the (B, max blocks) int32 table)")
    _plain("block_table", block_table, (torch.int32,), "block_table.int()")
    if head_num <= 0 or key_value_head_num <= 0 or head_num % key_value_head_num:
        _fail(f"head_num ({head_num}) must be a positive multiple of key_value_head_num ({key_value_head_num})")
    if head_num // key_value_head_num > _MAX_GROUP:
        _fail(f"head_num / key_value_head_num must be <= {_MAX_GROUP}, got {head_num} / {key_value_head_num}")
    if key_value_head_num > _MAX_KV_HEADS:
        _fail(f"key_value_head_num must be <= {_MAX_KV_HEADS}, got {key_value_head_num}")
    dims = 4 if layout == "BSND" else 3
    if query.dim() != dims:
        _fail(f"query must be {dims}-D in layout {layout}, got {tuple(query.shape)}")
    if layout == "BSH":
        batch, s, hidden = query.shape
        if hidden != head_num * _D_QK:
            _fail(f"query (B, S, H) in layout BSH needs H = head_num * {_D_QK} = {head_num * _D_QK} (query and key "
                  f"head size {_D_QK}), got {tuple(query.shape)}")
    elif layout == "BSND":
        batch, s, n, d = query.shape
    else:
        batch, n, d = query.shape
        s = 1
    if layout != "BSH":
        if n != head_num:
            _fail(f"query has {n} heads, head_num is {head_num}: pass head_num={n}")
        if d != _D_QK:
            _fail(f"query's head size D must be {_D_QK}, got {d}")
    if s != 1:
        _fail(f"query's S must be 1 (one decoding token per batch item), got {s}")
    if batch > _MAX_BATCH:
        _fail(f"the batch (query's {'T' if layout == 'TND' else 'B'}) must be <= {_MAX_BATCH}, got {batch}")
    key_blocks = _pool_heads("key", key, page_block_size, key_value_head_num, _D_QK)
    value_blocks = _pool_heads("value", value, page_block_size, key_value_head_num, _D_V)
    if key_blocks != value_blocks:
        _fail(f"key and value must hold the same number of blocks, got {key_blocks} and {value_blocks}")
    if not 0 < page_block_size <= _MAX_PAGE:
        _fail(f"page_block_size must be in [1, {_MAX_PAGE}], got {page_block_size}")
    if select_block_size <= 0 or select_block_size % 16:
        _fail(f"select_block_size must be a positive multiple of 16, got {select_block_size}")
    if tuple(topk_indices.shape) != (batch, key_value_head_num, select_block_count):
        _fail(f"topk_indices must be (B, key_value_head_num, select_block_count) = "
              f"({batch}, {key_value_head_num}, {select_block_count}), got {tuple(topk_indices.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        _fail(f"block_table must be (B, max blocks) with B = {batch}, got {tuple(block_table.shape)}")
    if actual_seq_kvlen is None:
        _fail("actual_seq_kvlen (each batch item's key/value length) is required")
    lens = [int(x) for x in actual_seq_kvlen]
    capacity = block_table.shape[1] * page_block_size
    if len(lens) != batch or any(not 0 <= x <= capacity for x in lens):
        _fail(f"actual_seq_kvlen needs one length per batch item ({batch}), each in [0, {capacity}] (block_table's "
              f"{block_table.shape[1]} blocks of page_block_size {page_block_size}), got {lens}")
    blocks = -(-max(lens) // select_block_size)
    if not 0 < select_block_count <= blocks:
        _fail(f"select_block_count must be in [1, ceil(max(actual_seq_kvlen) / select_block_size)] = [1, {blocks}], "
              f"got {select_block_count}")
    return batch, _D_V


def _out_shape(layout, batch, head_num, dv):
    return {"BSH": (batch, 1, head_num * dv), "BSND": (batch, 1, head_num, dv), "TND": (batch, head_num, dv)}[layout]


def _check_values(topk_indices, block_table, lens, select_block_size, page_block_size, block_num):
    dev = topk_indices.device
    length = torch.tensor(lens, device=dev, dtype=torch.int64)
    idx = topk_indices.long()
    limit = (length + select_block_size - 1) // select_block_size  # blocks starting before each item's end
    bad = (idx < -1) | (idx >= limit[:, None, None])
    if bool(bad.any()):
        b, n, i = (int(x) for x in bad.nonzero()[0])
        _fail(f"topk_indices[{b}, {n}, {i}] = {int(idx[b, n, i])} must be -1 (no block) or a select block of the item, "
              f"in [0, {int(limit[b])}) for actual_seq_kvlen[{b}] = {lens[b]} and select_block_size "
              f"{select_block_size}")
    pages = (length + page_block_size - 1) // page_block_size  # block table entries each item uses
    used = torch.arange(block_table.shape[1], device=dev)[None, :] < pages[:, None]
    table = block_table.long()
    bad = used & ((table < 0) | (table >= block_num))
    if bool(bad.any()):
        b, j = (int(x) for x in bad.nonzero()[0])
        _fail(f"block_table[{b}, {j}] = {int(table[b, j])} must name a block of key/value, in [0, {block_num})")


@custom_op("npu::_nsa_select_attention_infer", mutates_args=(), device_types="npu", schema=(
    "(Tensor query, Tensor key, Tensor value, Tensor topk_indices, Tensor block_table, float scale_value, "
    "int head_num, int key_value_head_num, int select_block_size, int select_block_count, int page_block_size, "
    "str layout, int[] actual_seq_kvlen) -> Tensor"))
def _select_attention(query, key, value, topk_indices, block_table, scale_value, head_num, key_value_head_num,
                      select_block_size, select_block_count, page_block_size, layout, actual_seq_kvlen):
    batch, dv = _check(query, key, value, topk_indices, block_table, head_num, key_value_head_num,
                       select_block_size, select_block_count, page_block_size, layout, actual_seq_kvlen)
    lens = [int(x) for x in actual_seq_kvlen]
    _check_values(topk_indices, block_table, lens, select_block_size, page_block_size, key.shape[0])
    dev = query.device
    kv, group = key_value_head_num, head_num // key_value_head_num
    k = key.reshape(key.shape[0], page_block_size, kv, _D_QK)
    v = value.reshape(value.shape[0], page_block_size, kv, dv)
    # the selected tokens' positions in their item: (B, kv, count * select_block_size)
    idx = topk_indices.long()
    pos = (idx[..., None] * select_block_size + torch.arange(select_block_size, device=dev)).flatten(-2)
    length = torch.tensor(lens, device=dev, dtype=torch.int64)[:, None, None]
    valid = (idx >= 0).repeat_interleave(select_block_size, -1) & (pos < length)
    pos = torch.where(valid, pos, torch.zeros_like(pos))
    rows = torch.arange(batch, device=dev)[:, None, None]
    blocks = block_table.long()[rows, pos // page_block_size]
    slots = pos % page_block_size
    heads = torch.arange(kv, device=dev)[None, :, None]
    k_sel = k[blocks, slots, heads].float()  # (B, kv, L, D)
    v_sel = v[blocks, slots, heads].float()  # (B, kv, L, Dv)
    q = query.reshape(batch, kv, group, _D_QK).float()
    s = torch.matmul(q, k_sel.transpose(-1, -2)) * scale_value  # (B, kv, group, L)
    s = s.masked_fill(~valid[:, :, None, :], float("-inf"))
    top = s.amax(-1, keepdim=True)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # a head without tokens: weights exactly 0
    e = torch.exp(s - top)
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total == 0, torch.ones_like(total), total)
    out = torch.matmul(p, v_sel)  # (B, kv, group, Dv)
    return out.reshape(_out_shape(layout, batch, head_num, dv)).to(query.dtype).contiguous()


@_select_attention.register_fake
def _(query, key, value, topk_indices, block_table, scale_value, head_num, key_value_head_num, select_block_size,
      select_block_count, page_block_size, layout, actual_seq_kvlen):
    batch, dv = _check(query, key, value, topk_indices, block_table, head_num, key_value_head_num,
                       select_block_size, select_block_count, page_block_size, layout, actual_seq_kvlen)
    return query.new_empty(_out_shape(layout, batch, head_num, dv))


def npu_nsa_select_attention_infer(query, key, value, topk_indices, scale_value, head_num, key_value_head_num,
                                   select_block_size, select_block_count, page_block_size, *, layout="BSND",
                                   atten_mask=None, block_table=None, actual_seq_qlen=None, actual_seq_kvlen=None):
    if atten_mask is not None:
        _fail("atten_mask is not supported (documented as not supported yet): pass atten_mask=None")
    if actual_seq_qlen is not None:
        _fail("actual_seq_qlen is not supported (documented as not supported yet; one query token per item): pass "
              "actual_seq_qlen=None")
    if block_table is None:
        _fail("block_table is required: only paged attention is supported (pass the (B, max blocks) int32 table)")
    if actual_seq_kvlen is None:
        _fail("actual_seq_kvlen (each batch item's key/value length) is required")
    return torch.ops.npu._nsa_select_attention_infer(query, key, value, topk_indices, block_table, scale_value,
                                                     head_num, key_value_head_num, select_block_size,
                                                     select_block_count, page_block_size, layout,
                                                     list(actual_seq_kvlen))


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_nsa_select_attention_infer(Tensor query, Tensor key, Tensor value, Tensor topk_indices, "
            "float scale_value, int head_num, int key_value_head_num, int select_block_size, int select_block_count, "
            "int page_block_size, *, str layout='BSND', Tensor? atten_mask=None, Tensor? block_table=None, "
            "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None) -> Tensor")
# Composite: tracing sees the positional kernel it decomposes into (custom ops take no keyword-only tensors).
_lib.impl("npu_nsa_select_attention_infer", npu_nsa_select_attention_infer, "CompositeImplicitAutograd")
