"""``npu::npu_fusion_attention`` and ``npu::npu_fusion_attention_grad`` (Ascend's fused attention).

Math (Ascend's documented reference): ``out = dropout(softmax(scale * Q K^T, masked), keep_prob) @ V`` with
``atten_mask`` True = masked out. Layouts BSH, SBH, BSND, BNSD and TND (packed variable length with cumulative
``actual_seq_qlen``/``actual_seq_kvlen``); grouped-query attention when q has a multiple of kv's heads.
Scores are computed in float32 whatever the input dtype (as the Ascend kernel accumulates); the output has the
input dtype. Dropout is drawn from the npu device's default generator; the returned ``(seed, offset)`` is the
generator state before the draw, and the backward replays it, as Ascend's kernel does with its Philox state.
See docs/torch_npu.md for the differences from Ascend (pse, padding_mask, prefix and sparse modes 5-8 raise).
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
_NO_BAND = 2147483647
_COMPRESSED = 2048  # side of the compressed triu(1) mask sparse modes 2-4 take
_STAT_WIDTH = 8  # softmax_max/softmax_sum are replicated 8 wide, as Ascend returns them


def _fail(msg: str):
    raise ValueError(f"npu_fusion_attention: {msg}")


def _check_args(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, keep_prob,
                prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode):
    if input_layout not in LAYOUTS:
        _fail(f"input_layout must be one of {', '.join(LAYOUTS)}, got {input_layout!r}")
    if pse is not None:
        _fail("pse (positional bias) is not supported by npudist; add the bias to the scores outside the op")
    if padding_mask is not None:
        _fail("padding_mask is reserved on Ascend and not supported; pass atten_mask instead")
    if prefix is not None or sparse_mode not in (0, 1, 2, 3, 4):
        _fail(f"sparse_mode must be 0-4 (prefix/varlen modes 5-8 are not supported), got {sparse_mode}")
    if not 0.0 < keep_prob <= 1.0:
        _fail(f"keep_prob must be in (0, 1], got {keep_prob}")
    if not (query.dtype == key.dtype == value.dtype) or not query.is_floating_point():
        _fail(f"query/key/value must share one floating dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    if head_num <= 0:
        _fail(f"head_num must be positive, got {head_num}")
    if (input_layout == "TND") != (actual_seq_qlen is not None and actual_seq_kvlen is not None):
        _fail("input_layout 'TND' needs actual_seq_qlen and actual_seq_kvlen (cumulative lengths), and only "
              "TND takes them")
    if atten_mask is not None and atten_mask.dtype not in (torch.bool, torch.uint8):
        _fail(f"atten_mask must be bool or uint8 (True/1 = masked out), got {atten_mask.dtype}")
    if atten_mask is not None and sparse_mode in (2, 3, 4) and tuple(atten_mask.shape) != (_COMPRESSED,) * 2:
        _fail(f"sparse_mode {sparse_mode} takes the compressed {_COMPRESSED}x{_COMPRESSED} mask "
              f"torch.triu(torch.ones(2048, 2048), 1).bool(), got shape {tuple(atten_mask.shape)}")


def _head_dim(query, head_num, layout) -> int:
    if layout in ("BSH", "SBH"):
        if query.shape[-1] % head_num:
            _fail(f"hidden size {query.shape[-1]} is not a multiple of head_num {head_num}")
        return query.shape[-1] // head_num
    heads = query.shape[2] if layout == "BSND" else query.shape[1]
    if heads != head_num:
        _fail(f"head_num={head_num} but query has {heads} heads in layout {layout}")
    return query.shape[-1]


def _to_bnsd(t: torch.Tensor, layout: str, d: int) -> torch.Tensor:
    """(B, N, S, D) view of a BSH/SBH/BSND/BNSD tensor."""
    if t.dim() != (3 if layout in ("BSH", "SBH") else 4):
        _fail(f"layout {layout} expects {3 if layout in ('BSH', 'SBH') else 4}-D tensors, got {t.dim()}-D")
    if layout == "BSH":
        return t.unflatten(-1, (-1, d)).transpose(1, 2)
    if layout == "SBH":
        return t.unflatten(-1, (-1, d)).permute(1, 2, 0, 3)
    if layout == "BSND":
        return t.transpose(1, 2)
    return t


def _from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BSH":
        return t.transpose(1, 2).flatten(-2)
    if layout == "SBH":
        return t.permute(2, 0, 1, 3).flatten(-2)
    if layout == "BSND":
        return t.transpose(1, 2)
    return t


def _segments(actual_seq_qlen, actual_seq_kvlen, tq: int, tk: int) -> list[tuple[int, int, int, int]]:
    """(q_start, q_end, kv_start, kv_end) per sequence of a TND batch from cumulative lengths."""
    if len(actual_seq_qlen) != len(actual_seq_kvlen) or not actual_seq_qlen:
        _fail("actual_seq_qlen and actual_seq_kvlen must be non-empty and of equal length")
    q_ends, k_ends = list(actual_seq_qlen), list(actual_seq_kvlen)
    for name, ends, total in (("actual_seq_qlen", q_ends, tq), ("actual_seq_kvlen", k_ends, tk)):
        if any(b < a for a, b in zip([0] + ends, ends)) or ends[-1] > total:
            _fail(f"{name} must be non-decreasing cumulative lengths ending at most at T={total}, got {ends}")
    return [(q0, q1, k0, k1) for q0, q1, k0, k1 in zip([0] + q_ends[:-1], q_ends, [0] + k_ends[:-1], k_ends)]


def _mask(atten_mask, sparse_mode, pre, nxt, sq, skv, device):
    """Bool mask (True = masked) broadcastable to (B, N, sq, skv), or None for full attention."""
    if atten_mask is None:  # Ascend ignores sparse_mode and the band without a mask
        return None
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(skv, device=device).unsqueeze(0)
    if sparse_mode in (0, 1):
        m = atten_mask.bool()
        if tuple(m.shape[-2:]) != (sq, skv):
            if m.dim() == 2 and m.shape[0] >= sq and m.shape[1] >= skv:
                m = m[:sq, :skv]  # TND: one SS mask cut per sequence
            else:
                _fail(f"atten_mask's last two dims must be (Sq, Skv) = ({sq}, {skv}), got {tuple(m.shape)}")
        if sparse_mode == 0 and (pre < _NO_BAND or nxt < _NO_BAND):
            m = m | (j - i > nxt) | (i - j > pre)  # band around the top-left diagonal
        return m
    if sparse_mode == 2:
        return j > i
    shift = skv - sq  # bottom-right aligned diagonal
    if sparse_mode == 3:
        return j > i + shift
    return (j - shift - i > nxt) | (i - (j - shift) > pre)


def _expand_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _probs(q, k, mask, scale):
    """float32 (P, row max, row sum) of softmax(scale * q k^T) with masked entries removed."""
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    smax = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - smax)
    if mask is not None:
        e = e.masked_fill(mask, 0.0)  # also clears the NaNs of fully masked rows (smax = -inf)
    ssum = e.sum(dim=-1, keepdim=True)
    # A row with any unmasked entry has ssum >= 1 (its max contributes exp(0)); a fully masked row has
    # ssum = 0 and e = 0, so clamping to 1 yields P = 0 there (its output is 0) and is exact elsewhere.
    return e / ssum.clamp_min(1.0), smax, ssum


def _keep_masks(shapes, keep_prob, device, replay=None):
    """Dropout keep-masks drawn from the device's npu generator; ``replay`` = (seed, offset) redraws them."""
    if keep_prob >= 1.0:
        return [None] * len(shapes), 0, 0, 0
    gen = torch.npu.default_generators[device.index]
    saved = gen.get_state()
    if replay is not None:
        gen.set_state(torch.tensor(list(replay), dtype=torch.int64).view(torch.uint8))
    seed, offset = (int(v) for v in gen.get_state().view(torch.int64))
    masks = [torch.rand(s, device=device, generator=gen) < keep_prob for s in shapes]
    if replay is not None:
        gen.set_state(saved)
    return masks, seed, offset, sum(m.numel() for m in masks)


def _problems(query, key, value, head_num, layout, actual_seq_qlen, actual_seq_kvlen):
    """Split the inputs into (q, k, v) (B, N, S, D) problems plus a function putting outputs back."""
    d = _head_dim(query, head_num, layout)
    if layout != "TND":
        q, k, v = (_to_bnsd(t, layout, d) for t in (query, key, value))
        return [(q, k, v)], (lambda outs: _from_bnsd(outs[0], layout).contiguous())
    if query.dim() != 3:
        _fail(f"layout TND expects 3-D (T, N, D) tensors, got {query.dim()}-D")
    segs = _segments(actual_seq_qlen, actual_seq_kvlen, query.shape[0], key.shape[0])
    probs = [tuple(t[a:b].transpose(0, 1).unsqueeze(0) for t, a, b in ((query, q0, q1), (key, k0, k1),
                                                                          (value, k0, k1)))
             for q0, q1, k0, k1 in segs]

    def join(outs):
        out = torch.zeros_like(query) if query.shape[0] > segs[-1][1] else None
        cat = torch.cat([o.squeeze(0).transpose(0, 1) for o in outs], dim=0)
        if out is None:
            return cat
        out[: segs[-1][1]] = cat
        return out
    return probs, join


def _groups(q, k, v) -> int:
    n1, n2 = q.shape[1], k.shape[1]
    if n2 == 0 or n1 % n2 or v.shape[1] != n2:
        _fail(f"query heads ({n1}) must be a multiple of key/value heads ({n2}, {v.shape[1]})")
    if k.shape[-1] != q.shape[-1]:
        _fail(f"query and key head dims differ ({q.shape[-1]} vs {k.shape[-1]})")
    return n1 // n2


def _stats(t: torch.Tensor) -> torch.Tensor:
    """(B, N, S, 8) float32 (TND: (T, N, 8)) softmax statistics from per-problem (1|B, N, S, 1) tensors."""
    return t.expand(*t.shape[:-1], _STAT_WIDTH).contiguous()


@custom_op("npu::npu_fusion_attention", mutates_args=(), device_types="npu", schema=(
    "(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, Tensor? pse=None, "
    "Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
    "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int[]? prefix=None, "
    "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, "
    "bool sync=False) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)"))
def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                         scale=1.0, keep_prob=1.0, pre_tockens=_NO_BAND, next_tockens=_NO_BAND, inner_precise=0,
                         prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                         gen_mask_parallel=True, sync=False):
    _check_args(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, keep_prob, prefix,
                actual_seq_qlen, actual_seq_kvlen, sparse_mode)
    problems, join = _problems(query, key, value, head_num, input_layout, actual_seq_qlen, actual_seq_kvlen)
    shapes = [(q.shape[0], q.shape[1], q.shape[2], k.shape[2]) for q, k, _ in problems]
    keeps, seed, offset, numels = _keep_masks(shapes, keep_prob, query.device)
    outs, maxes, sums = [], [], []
    for (q, k, v), keep in zip(problems, keeps):
        g = _groups(q, k, v)
        mask = _mask(atten_mask, sparse_mode, pre_tockens, next_tockens, q.shape[2], k.shape[2], q.device)
        p, smax, ssum = _probs(q, _expand_kv(k, g), mask, scale)
        if keep is not None:
            p = p * keep / keep_prob
        outs.append(torch.matmul(p, _expand_kv(v, g).float()).to(query.dtype))
        maxes.append(smax)
        sums.append(ssum)
    if input_layout == "TND":  # (T, N, 1); tokens past the last sequence get 0 (their output is 0 too)
        rest = [query.new_zeros(query.shape[0] - sum(m.shape[2] for m in maxes), query.shape[1], 1,
                                dtype=torch.float32)]
        smax = torch.cat([m.squeeze(0).transpose(0, 1) for m in maxes] + rest, dim=0)
        ssum = torch.cat([s.squeeze(0).transpose(0, 1) for s in sums] + rest, dim=0)
    else:
        smax, ssum = maxes[0], sums[0]
    reserved = query.new_empty(0)
    return join(outs), _stats(smax), _stats(ssum), reserved, seed, offset, numels


def _fake_stats_shape(query, head_num, input_layout):
    if input_layout == "TND":
        return (query.shape[0], query.shape[1], _STAT_WIDTH)
    b, s = {"BSH": (0, 1), "SBH": (1, 0), "BSND": (0, 1), "BNSD": (0, 2)}[input_layout]
    return (query.shape[b], head_num, query.shape[s], _STAT_WIDTH)


def _fake_out_shape(query, key, value, head_num, input_layout):
    """The output takes value's head dim (Dv may differ from the query/key head dim)."""
    if input_layout in ("BSH", "SBH"):
        kv_heads = key.shape[-1] // _head_dim(query, head_num, input_layout)
        return (*query.shape[:-1], head_num * (value.shape[-1] // max(kv_heads, 1)))
    return (*query.shape[:-1], value.shape[-1])


@npu_fusion_attention.register_fake
def _(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None, scale=1.0,
      keep_prob=1.0, pre_tockens=_NO_BAND, next_tockens=_NO_BAND, inner_precise=0, prefix=None,
      actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False):
    _check_args(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, keep_prob, prefix,
                actual_seq_qlen, actual_seq_kvlen, sparse_mode)
    if keep_prob < 1.0:
        # The (seed, offset) outputs are runtime values a trace would freeze, so the backward would replay
        # the wrong dropout mask: refuse rather than give wrong gradients.
        _fail("keep_prob < 1 (dropout) cannot be traced (torch.compile / fake tensors): its seed and offset "
              "are runtime values; run it eagerly or apply dropout outside the op")
    stat_shape = _fake_stats_shape(query, head_num, input_layout)
    return (query.new_empty(_fake_out_shape(query, key, value, head_num, input_layout)),
            query.new_empty(stat_shape, dtype=torch.float32),
            query.new_empty(stat_shape, dtype=torch.float32), query.new_empty(0), 0, 0, 0)


@custom_op("npu::npu_fusion_attention_grad", mutates_args=(), device_types="npu", schema=(
    "(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, str input_layout, Tensor? pse=None, "
    "Tensor? padding_mask=None, Tensor? atten_mask=None, Tensor? softmax_max=None, Tensor? softmax_sum=None, "
    "Tensor? softmax_in=None, Tensor? attention_in=None, float scale_value=1., float keep_prob=1., "
    "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int seed=0, int offset=0, "
    "int numels=0, int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, "
    "int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False) -> (Tensor, Tensor, Tensor, Tensor)"))
def npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, pse=None, padding_mask=None,
                              atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None,
                              attention_in=None, scale_value=1.0, keep_prob=1.0, pre_tockens=_NO_BAND,
                              next_tockens=_NO_BAND, inner_precise=0, seed=0, offset=0, numels=0, prefix=None,
                              actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True,
                              sync=False):
    _check_args(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, keep_prob, prefix,
                actual_seq_qlen, actual_seq_kvlen, sparse_mode)
    problems, join = _problems(query, key, value, head_num, input_layout, actual_seq_qlen, actual_seq_kvlen)
    dys, _ = _problems(dy, dy, dy, head_num, input_layout, actual_seq_qlen, actual_seq_qlen)
    shapes = [(q.shape[0], q.shape[1], q.shape[2], k.shape[2]) for q, k, _ in problems]
    keeps, *_ = _keep_masks(shapes, keep_prob, query.device, replay=(seed, offset))
    dqs, dks, dvs = [], [], []
    for (q, k, v), (do, _, _), keep in zip(problems, dys, keeps):
        g = _groups(q, k, v)
        mask = _mask(atten_mask, sparse_mode, pre_tockens, next_tockens, q.shape[2], k.shape[2], q.device)
        ke, ve = _expand_kv(k, g).float(), _expand_kv(v, g).float()
        p, _, _ = _probs(q, ke, mask, scale_value)
        pd = p if keep is None else p * keep / keep_prob
        do = do.float()
        dv = torch.matmul(pd.transpose(-1, -2), do)
        dp = torch.matmul(do, ve.transpose(-1, -2))
        if keep is not None:
            dp = dp * keep / keep_prob
        ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
        dq = torch.matmul(ds, ke) * scale_value
        dk = torch.matmul(ds.transpose(-1, -2), q.float()) * scale_value
        if g > 1:  # each kv head served g query heads: sum their contributions
            dk = dk.unflatten(1, (-1, g)).sum(2)
            dv = dv.unflatten(1, (-1, g)).sum(2)
        dqs.append(dq.to(query.dtype))
        dks.append(dk.to(key.dtype))
        dvs.append(dv.to(value.dtype))
    if input_layout == "TND":
        _, join_kv = _problems(key, key, key, key.shape[1], "TND", actual_seq_kvlen, actual_seq_kvlen)
        return join(dqs), join_kv(dks), join_kv(dvs), query.new_empty(0)
    return (join(dqs), _from_bnsd(dks[0], input_layout).contiguous(), _from_bnsd(dvs[0], input_layout).contiguous(),
            query.new_empty(0))


@npu_fusion_attention_grad.register_fake
def _(query, key, value, dy, *_args, **_kwargs):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape), query.new_empty(0)


_FWD_ARGS = ("query", "key", "value", "head_num", "input_layout", "pse", "padding_mask", "atten_mask", "scale",
             "keep_prob", "pre_tockens", "next_tockens", "inner_precise", "prefix", "actual_seq_qlen",
             "actual_seq_kvlen", "sparse_mode", "gen_mask_parallel", "sync")


def _setup_context(ctx, inputs, output):
    a = dict(zip(_FWD_ARGS, inputs))
    _, smax, ssum, _, seed, offset, numels = output
    ctx.save_for_backward(a["query"], a["key"], a["value"], a["atten_mask"], smax, ssum)
    ctx.args = {k: a[k] for k in ("head_num", "input_layout", "scale", "keep_prob", "pre_tockens", "next_tockens",
                                  "actual_seq_qlen", "actual_seq_kvlen", "sparse_mode")}
    ctx.rng = (seed, offset, numels)


def _backward(ctx, dout, *_unused_stat_grads):
    q, k, v, atten_mask, smax, ssum = ctx.saved_tensors
    a = ctx.args
    seed, offset, numels = ctx.rng
    dq, dk, dv, _ = torch.ops.npu.npu_fusion_attention_grad(
        q, k, v, dout, a["head_num"], a["input_layout"], atten_mask=atten_mask, softmax_max=smax,
        softmax_sum=ssum, scale_value=a["scale"], keep_prob=a["keep_prob"], pre_tockens=a["pre_tockens"],
        next_tockens=a["next_tockens"], seed=seed, offset=offset, numels=numels,
        actual_seq_qlen=a["actual_seq_qlen"], actual_seq_kvlen=a["actual_seq_kvlen"],
        sparse_mode=a["sparse_mode"])
    return (dq, dk, dv) + (None,) * (len(_FWD_ARGS) - 3)


register_autograd("npu::npu_fusion_attention", _backward, setup_context=_setup_context)
