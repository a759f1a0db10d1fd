"""torch_npu's inference attention operators, ``npu_prompt_flash_attention`` (full, "PFA"),
``npu_incre_flash_attention`` (incremental decoding, "IFA") and ``npu_fused_infer_attention_score`` (both),
as aten compositions of their documented formula
``atten_out = softmax(scale_value * Q K^T + pse_shift, masked) V`` (scores in float32, the output in query's dtype).

Shared: layouts BSH, BSND, BNSD (PFA also BNSD_BSND: BNSD in, BSND out); grouped-query attention with
``num_key_value_heads`` (0: as many as ``num_heads``), kv head ``h // (num_heads / num_key_value_heads)`` serving
query head ``h``; ``atten_mask`` bool/int8/uint8 with 1 = masked out; ``pse_shift`` added to the scaled scores; a
query row with every key masked gives 0. Each batch item is computed on its own valid lengths.

* PFA: ``atten_mask`` (Q_S, KV_S), (B|1, Q_S, KV_S) or (B|1, 1, Q_S, KV_S); ``sparse_mode`` 0 (the mask, and with
  a mask the band ``-pre_tokens <= j - i <= next_tokens``), 1 (the mask alone), 2 (causal from the top left),
  3 (causal from the bottom right), 4 (band about the bottom-right diagonal); modes 2-4 take the compressed
  2048 x 2048 mask. ``actual_seq_lengths`` / ``actual_seq_lengths_kv``: each item's valid query / key lengths
  (one entry: for all items); query rows past the valid length give 0. ``pse_shift`` (B|1, N, >=Q_S, >=KV_S).
* IFA: ``atten_mask`` (B, KV_S), (B, 1, KV_S) or (B, 1, 1, KV_S); ``pse_shift`` (B|1, N, 1, KV_S);
  ``actual_seq_lengths``: each item's valid key length; with ``kv_padding_size`` the valid keys are left padded,
  positions ``[KV_S - pad - len, KV_S - pad)`` (a negative pad counts as 0; a start below 0 gives 0, as documented).
  Page attention: with ``block_table`` (B, max blocks) and ``block_size``, ``key``/``value`` are the block pools
  (blocks, block_size, H) or (blocks, N_kv, block_size, D) and item ``b``'s keys are the first
  ``actual_seq_lengths[b]`` tokens of its blocks in table order.

* ``npu_fused_infer_attention_score(...) -> (attention_out, softmax_lse)``: a query of one token (Q_S = 1) takes
  IFA's branch (key lengths from ``actual_seq_lengths_kv``, ``block_table``, ``kv_padding_size``), any other PFA's
  (``pre_tokens``/``next_tokens`` default to 2147483647 here); ``softmax_lse`` (``softmax_lse_flag``) is
  ``log(sum(exp(s - max))) + max`` of each row's scaled, masked scores as (B, N, Q_S, 1) float32 (-inf for a row
  with no key), else a (1,) zero. Also refused there: the key/value antiquant parameters, ``query_padding_size``,
  the shared prefix, ``query_rope``/``key_rope`` (MLA), sparse mode 9 and the TND/NTD layouts.

Refused (ValueError naming the argument): the int8 quantisation parameters (``deq_scale1``/``dequant_scale1``,
``quant_scale1``, ``deq_scale2``/``dequant_scale2``, ``quant_scale2``, ``quant_offset2``, ``antiquant_scale``,
``antiquant_offset``: their scaling formulas are not given on the pages), ``padding_mask`` (reserved), the TND
layout and sparse modes 5-8 (documented as unsupported).
"""
from __future__ import annotations

import torch

from npudist.ops.attention import _COMPRESSED, _mask

_SHAPE_LAYOUTS = {"BSH": 3, "BSND": 4, "BNSD": 4}


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _refuse(op, **given):
    for name, value in given.items():
        if value is not None:
            _fail(op, f"{name} is not supported (its quantisation / reserved semantics are not documented)")


def _bnsd(op, t, layout, heads, name):
    """(B, N, S, D) of a BSH / BSND / BNSD tensor with ``heads`` heads."""
    if t.dim() != _SHAPE_LAYOUTS[layout]:
        _fail(op, f"{name} must be {_SHAPE_LAYOUTS[layout]}-D in layout {layout}, got {t.dim()}-D")
    if layout == "BSH":
        if t.shape[-1] % heads:
            _fail(op, f"{name}'s hidden size {t.shape[-1]} is not a multiple of its {heads} heads")
        return t.unflatten(-1, (heads, -1)).transpose(1, 2)
    n = t.shape[2] if layout == "BSND" else t.shape[1]
    if n != heads:
        _fail(op, f"{name} has {n} heads in layout {layout}, expected {heads}")
    return t.transpose(1, 2) if layout == "BSND" else t


def _heads(op, num_heads, num_key_value_heads):
    kv = num_key_value_heads or num_heads
    if num_heads <= 0 or kv <= 0 or num_heads % kv:
        _fail(op, f"num_heads ({num_heads}) must be a positive multiple of num_key_value_heads ({kv})")
    return kv


def _attend(q, k, v, scale, mask, pse):
    """(softmax(scale q k^T + pse, masked) v, its log-sum-exp) for q (1, N, sq, D), k/v (1, N_kv, skv, D); float32."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1).float(), v.repeat_interleave(groups, 1).float()
    s = torch.matmul(q.float(), k.transpose(-1, -2)) * scale
    if pse is not None:
        s = s + pse.float()
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    smax = s.amax(-1, keepdim=True)
    smax = torch.where(torch.isinf(smax), torch.zeros_like(smax), smax)  # fully masked rows: exp(-inf) = 0
    e = torch.exp(s - smax)
    total = e.sum(-1, keepdim=True)
    p = e / total.clamp_min(torch.finfo(torch.float32).tiny)
    return torch.matmul(p, v), smax + torch.log(total)  # the lse of a fully masked row is log(0) = -inf


def _lengths(op, name, lengths, batch, full):
    if lengths is None:
        return [full] * batch
    lengths = list(lengths)
    if len(lengths) == 1:
        lengths = lengths * batch
    if len(lengths) < batch or any(not 0 <= n <= full for n in lengths[:batch]):
        _fail(op, f"{name} must have 1 or >= {batch} entries in [0, {full}], got {lengths}")
    return lengths[:batch]


def _mask4(op, m, dims):
    """The mask as (B|1, 1, rows, cols) bool from one of the accepted shapes (``dims``: {ndim: unsqueezes})."""
    if m.dtype not in (torch.bool, torch.int8, torch.uint8):
        _fail(op, f"atten_mask must be bool, int8 or uint8 (1 = masked out), got {m.dtype}")
    if m.dim() not in dims:
        _fail(op, f"atten_mask must have {sorted(dims)} dims, got {tuple(m.shape)}")
    m = m.bool()
    for d in dims[m.dim()]:
        m = m.unsqueeze(d)
    return m


def npu_prompt_flash_attention(query, key, value, *, padding_mask=None, atten_mask=None, pse_shift=None,
                               actual_seq_lengths=None, deq_scale1=None, quant_scale1=None, deq_scale2=None,
                               quant_scale2=None, quant_offset2=None, num_heads=1, scale_value=1.0,
                               pre_tokens=2147483647, next_tokens=0, input_layout="BSH", num_key_value_heads=0,
                               actual_seq_lengths_kv=None, sparse_mode=0):
    op = "npu_prompt_flash_attention"
    _refuse(op, padding_mask=padding_mask, deq_scale1=deq_scale1, quant_scale1=quant_scale1, deq_scale2=deq_scale2,
            quant_scale2=quant_scale2, quant_offset2=quant_offset2)
    return _prompt(op, query, key, value, atten_mask, pse_shift, actual_seq_lengths, actual_seq_lengths_kv, num_heads,
                   scale_value, pre_tokens, next_tokens, input_layout, num_key_value_heads, sparse_mode)[0]


def _prompt(op, query, key, value, atten_mask, pse_shift, actual_seq_lengths, actual_seq_lengths_kv, num_heads,
            scale_value, pre_tokens, next_tokens, input_layout, num_key_value_heads, sparse_mode):
    in_layout, out_layout = ("BNSD", "BSND") if input_layout == "BNSD_BSND" else (input_layout, input_layout)
    if in_layout not in _SHAPE_LAYOUTS:
        _fail(op, f"input_layout must be BSH, BSND, BNSD or BNSD_BSND (TND is not supported), got {input_layout!r}")
    if sparse_mode not in (0, 1, 2, 3, 4):
        _fail(op, f"sparse_mode must be 0-4 (5-8 are documented as unsupported), got {sparse_mode}")
    kv_heads = _heads(op, num_heads, num_key_value_heads)
    q = _bnsd(op, query, in_layout, num_heads, "query")
    k, v = _bnsd(op, key, in_layout, kv_heads, "key"), _bnsd(op, value, in_layout, kv_heads, "value")
    batch, sq, skv = q.shape[0], q.shape[2], k.shape[2]
    q_lens = _lengths(op, "actual_seq_lengths", actual_seq_lengths, batch, sq)
    kv_lens = _lengths(op, "actual_seq_lengths_kv", actual_seq_lengths_kv, batch, skv)
    mask = None
    if atten_mask is not None:
        mask = _mask4(op, atten_mask, {2: (0, 0), 3: (1,), 4: ()})
        if sparse_mode in (2, 3, 4) and tuple(mask.shape) != (1, 1, _COMPRESSED, _COMPRESSED):
            _fail(op, f"sparse_mode {sparse_mode} takes the compressed {_COMPRESSED}x{_COMPRESSED} mask, got "
                      f"{tuple(atten_mask.shape)}")
        if sparse_mode in (0, 1) and (mask.shape[0] not in (1, batch) or mask.shape[2] < sq or mask.shape[3] < skv):
            _fail(op, f"atten_mask must cover (B|1, 1, {sq}, {skv}), got {tuple(atten_mask.shape)}")
    elif sparse_mode in (2, 3, 4):
        _fail(op, f"sparse_mode {sparse_mode} needs the compressed atten_mask")
    if pse_shift is not None and (pse_shift.dim() != 4 or pse_shift.shape[0] not in (1, batch)
                                  or pse_shift.shape[1] != num_heads or pse_shift.shape[2] < sq
                                  or pse_shift.shape[3] < skv):
        _fail(op, f"pse_shift must be (B|1, {num_heads}, >={sq}, >={skv}), got {tuple(pse_shift.shape)}")
    outs, lses = [], []
    for b in range(batch):
        lq, lk = q_lens[b], kv_lens[b]
        mb = None
        if mask is not None:
            mb = mask[b if mask.shape[0] > 1 else 0][None]
            if sparse_mode in (0, 1):
                mb = mb[..., :lq, :lk]
            mb = _mask(mb, sparse_mode, pre_tokens, next_tokens, lq, lk, query.device)
        pb = None if pse_shift is None else pse_shift[b if pse_shift.shape[0] > 1 else 0][None, :, :lq, :lk]
        o, lse = _attend(q[b:b + 1, :, :lq], k[b:b + 1, :, :lk], v[b:b + 1, :, :lk], scale_value, mb, pb)
        outs.append(torch.nn.functional.pad(o, (0, 0, 0, sq - lq)))
        lses.append(torch.nn.functional.pad(lse, (0, 0, 0, sq - lq), value=float("-inf")))
    return _out(torch.cat(outs), out_layout, query.dtype), torch.cat(lses)


def _out(o, layout, dtype):
    if layout == "BSH":
        o = o.transpose(1, 2).flatten(-2)
    elif layout == "BSND":
        o = o.transpose(1, 2)
    return o.to(dtype).contiguous()


def _paged(op, pool, table, b, length, block_size, heads):
    """Item b's first ``length`` keys (1, N, length, D) gathered from a block pool by its block-table row."""
    if block_size <= 0:
        _fail(op, f"block_size must be positive with block_table, got {block_size}")
    blocks = pool.index_select(0, table[b].to(torch.int64))
    if pool.dim() == 3:  # (blocks, block_size, H)
        seq = blocks.flatten(0, 1).unflatten(-1, (heads, -1)).transpose(0, 1)
    elif pool.dim() == 4:  # (blocks, N, block_size, D)
        seq = blocks.transpose(0, 1).flatten(1, 2)
    else:
        _fail(op, f"with block_table, key/value must be (blocks, block_size, H) or (blocks, N, block_size, D), "
                  f"got {tuple(pool.shape)}")
    if seq.shape[0] != heads or seq.shape[1] < length:
        _fail(op, f"block_table row {b} holds {seq.shape[1]} tokens of {seq.shape[0]} heads; {length} tokens of "
                  f"{heads} heads are needed")
    return seq[None, :, :length]


def npu_incre_flash_attention(query, key, value, *, padding_mask=None, atten_mask=None, pse_shift=None,
                              actual_seq_lengths=None, antiquant_scale=None, antiquant_offset=None, block_table=None,
                              dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None,
                              quant_offset2=None, kv_padding_size=None, num_heads=1, scale_value=1.0,
                              input_layout="BSH", num_key_value_heads=0, block_size=0, inner_precise=1):
    op = "npu_incre_flash_attention"
    _refuse(op, padding_mask=padding_mask, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
            dequant_scale1=dequant_scale1, quant_scale1=quant_scale1, dequant_scale2=dequant_scale2,
            quant_scale2=quant_scale2, quant_offset2=quant_offset2)
    return _incre(op, query, key, value, atten_mask, pse_shift, actual_seq_lengths, block_table, kv_padding_size,
                  num_heads, scale_value, input_layout, num_key_value_heads, block_size)[0]


def _incre(op, query, key, value, atten_mask, pse_shift, actual_seq_lengths, block_table, kv_padding_size, num_heads,
           scale_value, input_layout, num_key_value_heads, block_size):
    if input_layout not in _SHAPE_LAYOUTS:
        _fail(op, f"input_layout must be BSH, BSND or BNSD, got {input_layout!r}")
    kv_heads = _heads(op, num_heads, num_key_value_heads)
    q = _bnsd(op, query, input_layout, num_heads, "query")
    batch = q.shape[0]
    if block_table is not None:
        if actual_seq_lengths is None:
            _fail(op, "page attention (block_table) needs actual_seq_lengths")
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            _fail(op, f"block_table must be ({batch}, max blocks), got {tuple(block_table.shape)}")
        lens = _lengths(op, "actual_seq_lengths", actual_seq_lengths, batch, block_table.shape[1] * block_size)
        if kv_padding_size is not None:
            _fail(op, "kv_padding_size (left padding) does not combine with block_table")
    else:
        k, v = _bnsd(op, key, input_layout, kv_heads, "key"), _bnsd(op, value, input_layout, kv_heads, "value")
        skv = k.shape[2]
        lens = _lengths(op, "actual_seq_lengths", actual_seq_lengths, batch, skv)
        pads = [0] * batch
        if kv_padding_size is not None and actual_seq_lengths is not None:
            pads = [max(int(p), 0) for p in kv_padding_size.reshape(-1).tolist()]
            pads = pads * batch if len(pads) == 1 else pads
    mask = None if atten_mask is None else _mask4(op, atten_mask, {2: (1, 1), 3: (1,), 4: ()})
    outs, lses = [], []
    for b in range(batch):
        if block_table is not None:
            kb = _paged(op, key, block_table, b, lens[b], block_size, kv_heads)
            vb = _paged(op, value, block_table, b, lens[b], block_size, kv_heads)
            lo = 0
        else:
            lo = skv - pads[b] - lens[b] if kv_padding_size is not None and actual_seq_lengths is not None else 0
            if lo < 0:  # documented: a window starting before 0 gives zeros
                outs.append(torch.zeros_like(q[b:b + 1], dtype=torch.float32))
                lses.append(torch.full_like(q[b:b + 1, ..., :1], float("-inf"), dtype=torch.float32))
                continue
            kb, vb = k[b:b + 1, :, lo:lo + lens[b]], v[b:b + 1, :, lo:lo + lens[b]]
        mb = None if mask is None else mask[b if mask.shape[0] > 1 else 0][None, ..., lo:lo + lens[b]]
        pb = None if pse_shift is None else pse_shift[b if pse_shift.shape[0] > 1 else 0][None, ..., lo:lo + lens[b]]
        o, lse = _attend(q[b:b + 1], kb, vb, scale_value, mb, pb)
        outs.append(o)
        lses.append(lse)
    return _out(torch.cat(outs), input_layout, query.dtype), torch.cat(lses)


def npu_fused_infer_attention_score(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
                                    actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None,
                                    dequant_scale2=None, quant_scale2=None, quant_offset2=None, antiquant_scale=None,
                                    antiquant_offset=None, key_antiquant_scale=None, key_antiquant_offset=None,
                                    value_antiquant_scale=None, value_antiquant_offset=None, block_table=None,
                                    query_padding_size=None, kv_padding_size=None, key_shared_prefix=None,
                                    value_shared_prefix=None, actual_shared_prefix_len=None, query_rope=None,
                                    key_rope=None, key_rope_antiquant_scale=None, num_heads=1, scale=1.0,
                                    pre_tokens=2147483647, next_tokens=2147483647, input_layout="BSH",
                                    num_key_value_heads=0, sparse_mode=0, inner_precise=0, block_size=0,
                                    antiquant_mode=0, key_antiquant_mode=0, value_antiquant_mode=0,
                                    softmax_lse_flag=False):
    op = "npu_fused_infer_attention_score"
    _refuse(op, dequant_scale1=dequant_scale1, quant_scale1=quant_scale1, dequant_scale2=dequant_scale2,
            quant_scale2=quant_scale2, quant_offset2=quant_offset2, antiquant_scale=antiquant_scale,
            antiquant_offset=antiquant_offset, key_antiquant_scale=key_antiquant_scale,
            key_antiquant_offset=key_antiquant_offset, value_antiquant_scale=value_antiquant_scale,
            value_antiquant_offset=value_antiquant_offset, query_padding_size=query_padding_size,
            key_shared_prefix=key_shared_prefix, value_shared_prefix=value_shared_prefix,
            actual_shared_prefix_len=actual_shared_prefix_len, query_rope=query_rope, key_rope=key_rope,
            key_rope_antiquant_scale=key_rope_antiquant_scale)
    out, lse = fused_infer_attention(op, query, key, value, pse_shift, atten_mask, actual_seq_lengths,
                                     actual_seq_lengths_kv, block_table, kv_padding_size, num_heads, scale,
                                     pre_tokens, next_tokens, input_layout, num_key_value_heads, sparse_mode,
                                     block_size)
    return out, lse if softmax_lse_flag else query.new_zeros(1, dtype=torch.float32)


def fused_infer_attention(op, query, key, value, pse_shift, atten_mask, actual_seq_lengths, actual_seq_lengths_kv,
                          block_table, kv_padding_size, num_heads, scale, pre_tokens, next_tokens, input_layout,
                          num_key_value_heads, sparse_mode, block_size):
    """The fused operators' shared math: (attention_out in the output layout, softmax_lse (B, N, Q_S, 1))."""
    if input_layout not in ("BSH", "BSND", "BNSD", "BNSD_BSND"):
        _fail(op, f"input_layout must be BSH, BSND, BNSD or BNSD_BSND (TND/NTD are not supported), "
                  f"got {input_layout!r}")
    q_seq = query.shape[1] if input_layout in ("BSH", "BSND") else query.shape[2]
    if q_seq == 1 and input_layout != "BNSD_BSND":
        # the incremental branch: the key lengths are actual_seq_lengths_kv, the band and sparse mode do not apply
        out, lse = _incre(op, query, key, value, atten_mask, pse_shift, actual_seq_lengths_kv, block_table,
                          kv_padding_size, num_heads, scale, input_layout, num_key_value_heads, block_size)
    else:
        if block_table is not None or kv_padding_size is not None:
            _fail(op, "block_table / kv_padding_size are supported for a query of one token (Q_S = 1) only")
        out, lse = _prompt(op, query, key, value, atten_mask, pse_shift, actual_seq_lengths, actual_seq_lengths_kv,
                           num_heads, scale, pre_tokens, next_tokens, input_layout, num_key_value_heads, sparse_mode)
    return out, lse


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_prompt_flash_attention(Tensor query, Tensor key, Tensor value, *, Tensor? padding_mask=None, "
            "Tensor? atten_mask=None, Tensor? pse_shift=None, int[]? actual_seq_lengths=None, Tensor? deq_scale1=None, "
            "Tensor? quant_scale1=None, Tensor? deq_scale2=None, Tensor? quant_scale2=None, "
            "Tensor? quant_offset2=None, int num_heads=1, float scale_value=1.0, int pre_tokens=2147483647, "
            "int next_tokens=0, str input_layout=\"BSH\", int num_key_value_heads=0, "
            "int[]? actual_seq_lengths_kv=None, int sparse_mode=0) -> Tensor")
_lib.define("npu_incre_flash_attention(Tensor query, Tensor key, Tensor value, *, Tensor? padding_mask=None, "
            "Tensor? atten_mask=None, Tensor? pse_shift=None, SymInt[]? actual_seq_lengths=None, "
            "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? block_table=None, "
            "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
            "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? kv_padding_size=None, int num_heads=1, "
            "float scale_value=1.0, str input_layout=\"BSH\", int num_key_value_heads=0, int block_size=0, "
            "int inner_precise=1) -> Tensor")
_lib.define("npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
            "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "
            "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
            "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? antiquant_scale=None, "
            "Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
            "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, "
            "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, "
            "Tensor? value_shared_prefix=None, SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, "
            "Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
            "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
            "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
            "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "
            "bool softmax_lse_flag=False) -> (Tensor, Tensor)")
for _fn in (npu_prompt_flash_attention, npu_incre_flash_attention, npu_fused_infer_attention_score):
    _lib.impl(_fn.__name__, _fn, "CompositeImplicitAutograd")
