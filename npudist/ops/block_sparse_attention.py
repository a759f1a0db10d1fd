"""torch_npu's block-sparse attention, ``npu_block_sparse_attention``, as aten ops (autograd -- torch_npu has a
backward for it --, fake tensors and compile come from them).

``npu_block_sparse_attention(query, key, value, block_sparse_mask, block_shape, *, q_input_layout="TND",
kv_input_layout="TND", num_key_value_heads=1, scale_value=0.0, inner_precise=1, actual_seq_lengths=None,
actual_seq_lengths_kv=None, softmax_lse_flag=0) -> (attention_out, softmax_lse)``: per batch item ``b`` and
query head ``n``, query row ``i`` attends exactly the keys ``j`` whose block
``block_sparse_mask[b, n, i // block_shape[0], j // block_shape[1]]`` is nonzero (the mask selects the key
blocks of each query block), among the item's valid keys: ``softmax(scale_value * q k^T) v`` over those keys.
Layouts: "TND" (the items back to back; ``actual_seq_lengths`` / ``actual_seq_lengths_kv`` are each item's
query / key length, required) and "BNSD" (optional lengths, default the full S; query rows past an item's length
give 0). GQA: query head ``n`` reads kv head ``n // (N1 / num_key_value_heads)``. A row that selects no key gives
0. ``softmax_lse`` (``softmax_lse_flag`` 1) is each row's log-sum-exp of its scaled, selected scores, float32,
(B, N1, S1, 1) for BNSD and (T1, N1, 1) for TND (-inf for a row without keys); with flag 0 it is a (1,) zero.
Softmax runs in float32 (float64 for float64 inputs) whatever ``inner_precise`` asks (0 float32, 1 float16
intermediates: a speed choice of Ascend's kernel).
"""
from __future__ import annotations

import torch

_OP = "npu_block_sparse_attention"


def _fail(msg):
    raise ValueError(f"{_OP}: {msg}")


def _attend_item(q, k, v, mask, block_shape, scale, q_len, kv_len, acc):
    """q (N1, Sq, D), k/v (N2, Skv, D), mask (N1, Bq, Bkv) -> out (N1, Sq, Dv), lse (N1, Sq, 1)."""
    n1, sq, _ = q.shape
    skv = k.shape[1]
    groups = n1 // k.shape[0]
    kk, vv = k.repeat_interleave(groups, 0).to(acc), v.repeat_interleave(groups, 0).to(acc)
    rows = torch.arange(sq, device=q.device) // block_shape[0]
    cols = torch.arange(skv, device=q.device) // block_shape[1]
    allowed = mask[:, rows][:, :, cols] != 0  # (N1, Sq, Skv)
    allowed = allowed & (torch.arange(skv, device=q.device) < kv_len) & \
        (torch.arange(sq, device=q.device) < q_len).unsqueeze(-1)
    s = (q.to(acc) @ kk.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    # a row without keys is all -inf: shift it by 0 so its weights are exactly 0 (and its gradients finite); the
    # shift is a constant for the result, so it carries no gradient
    top = s.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    e = torch.exp(s - top)
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total == 0, torch.ones_like(total), total)
    return p @ vv, torch.log(total) + top


def npu_block_sparse_attention(query, key, value, block_sparse_mask, block_shape, *, q_input_layout="TND",
                               kv_input_layout="TND", num_key_value_heads=1, scale_value=0.0, inner_precise=1,
                               actual_seq_lengths=None, actual_seq_lengths_kv=None, softmax_lse_flag=0):
    if q_input_layout not in ("TND", "BNSD") or kv_input_layout != q_input_layout:
        _fail(f"q_input_layout and kv_input_layout must both be 'TND' or both 'BNSD', got {q_input_layout!r} and "
              f"{kv_input_layout!r}")
    if len(block_shape) < 2 or block_shape[0] <= 0 or block_shape[1] <= 0:
        _fail(f"block_shape must be [blockShapeX, blockShapeY] with positive entries, got {list(block_shape)}")
    if inner_precise not in (0, 1):
        _fail(f"inner_precise must be 0 (float32 softmax) or 1 (float16 softmax), got {inner_precise}")
    if softmax_lse_flag not in (None, 0, 1):
        _fail(f"softmax_lse_flag must be 0 or 1, got {softmax_lse_flag}")
    if (actual_seq_lengths is None) != (actual_seq_lengths_kv is None):
        _fail("actual_seq_lengths and actual_seq_lengths_kv must be given together or not at all")
    tnd = q_input_layout == "TND"
    dims = 3 if tnd else 4
    if query.dim() != dims or key.dim() != dims or value.dim() != dims:
        _fail(f"query, key and value must be {dims}-D in layout {q_input_layout}")
    n1 = query.shape[1]
    n2 = key.shape[1]
    if n2 != num_key_value_heads or n1 % n2:
        _fail(f"num_key_value_heads ({num_key_value_heads}) must equal key's head count {n2} and divide the query's "
              f"{n1} heads")
    if tnd:
        if actual_seq_lengths is None:
            _fail("actual_seq_lengths and actual_seq_lengths_kv are required for the TND layout")
        q_lens, kv_lens = [int(x) for x in actual_seq_lengths], [int(x) for x in actual_seq_lengths_kv]
        if len(q_lens) != len(kv_lens) or sum(q_lens) != query.shape[0] or sum(kv_lens) != key.shape[0]:
            _fail(f"actual_seq_lengths {q_lens} / actual_seq_lengths_kv {kv_lens} must have one entry per item and "
                  f"sum to the {query.shape[0]} query / {key.shape[0]} key tokens")
        qs = [t.transpose(0, 1) for t in query.split(q_lens)]
        ks = [t.transpose(0, 1) for t in key.split(kv_lens)]
        vs = [t.transpose(0, 1) for t in value.split(kv_lens)]
        max_q, max_kv = max(q_lens), max(kv_lens)
    else:
        batch = query.shape[0]
        q_lens = [query.shape[2]] * batch if actual_seq_lengths is None else [int(x) for x in actual_seq_lengths]
        kv_lens = [key.shape[2]] * batch if actual_seq_lengths_kv is None else [int(x) for x in actual_seq_lengths_kv]
        if len(q_lens) != batch or len(kv_lens) != batch:
            _fail(f"actual_seq_lengths / actual_seq_lengths_kv need one entry per batch item ({batch})")
        qs, ks, vs = list(query.unbind(0)), list(key.unbind(0)), list(value.unbind(0))
        max_q, max_kv = query.shape[2], key.shape[2]
    batch = len(qs)
    want = (batch, n1, -(-max_q // block_shape[0]), -(-max_kv // block_shape[1]))
    if tuple(block_sparse_mask.shape) != want:
        _fail(f"block_sparse_mask must be (batch, headNum, ceil(maxQS / blockShapeX), ceil(maxKVS / blockShapeY)) "
              f"= {want}, got {tuple(block_sparse_mask.shape)}")
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    outs, lses = [], []
    for b in range(batch):
        o, lse = _attend_item(qs[b], ks[b], vs[b], block_sparse_mask[b], block_shape, scale_value, q_lens[b],
                              kv_lens[b], acc)
        outs.append(o)
        lses.append(lse.float())
    if tnd:
        out = torch.cat([o.transpose(0, 1) for o in outs]).to(query.dtype)
        lse = torch.cat([s.transpose(0, 1) for s in lses])
    else:
        out = torch.stack(outs).to(query.dtype)
        lse = torch.stack(lses)
    return out, lse if softmax_lse_flag == 1 else query.new_zeros(1, dtype=torch.float32)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_block_sparse_attention(Tensor query, Tensor key, Tensor value, Tensor block_sparse_mask, "
            "int[] block_shape, *, str q_input_layout='TND', str kv_input_layout='TND', int num_key_value_heads=1, "
            "float scale_value=0.0, int inner_precise=1, int[]? actual_seq_lengths=None, "
            "int[]? actual_seq_lengths_kv=None, int? softmax_lse_flag=0) -> (Tensor, Tensor)")
_lib.impl("npu_block_sparse_attention", npu_block_sparse_attention, "CompositeImplicitAutograd")
