"""``npu::npu_rotary_mul(input, r1, r2, rotary_mode='half', rotate=None)``: ``r1 * x + r2 * rotate(x)``.

``half``: ``rotate(x) = cat(-x2, x1)`` with x1, x2 the two halves of the last dim (LLaMA/NeoX style);
``interleave``: the same on the (even, odd) element pairs (GPT-J style); with a ``rotate`` matrix (D, D):
``rotate(x) = x @ rotate`` whatever the mode (it gets no gradient, as documented). r1/r2 broadcast to x
(typically (1|B, S, 1, D) or (1|B, 1, S, D)); their gradients are reduced to their own shapes.
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

MODES = ("half", "interleave")


def _check(x, r1, r2, mode, rotate=None):
    if rotate is not None and (rotate.dim() != 2 or tuple(rotate.shape) != (x.shape[-1],) * 2):
        raise ValueError(f"npu_rotary_mul: rotate must be a ({x.shape[-1]}, {x.shape[-1]}) matrix, got "
                         f"{tuple(rotate.shape)}")
    if mode not in MODES:
        raise ValueError(f"npu_rotary_mul: rotary_mode must be 'half' or 'interleave', got {mode!r}")
    if x.shape[-1] % 2:
        raise ValueError(f"npu_rotary_mul: the last dim of input must be even, got {x.shape[-1]}")
    for name, r in (("r1", r1), ("r2", r2)):
        try:
            torch.broadcast_shapes(x.shape, r.shape)
        except RuntimeError:
            raise ValueError(f"npu_rotary_mul: {name} of shape {tuple(r.shape)} does not broadcast to input "
                             f"{tuple(x.shape)}") from None
        if torch.broadcast_shapes(x.shape, r.shape) != x.shape:
            raise ValueError(f"npu_rotary_mul: {name} of shape {tuple(r.shape)} would enlarge input "
                             f"{tuple(x.shape)}")


def _rotate(x: torch.Tensor, mode: str, rotate=None) -> torch.Tensor:
    if rotate is not None:
        return x @ rotate.to(x.dtype)
    if mode == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def _rotate_transposed(g: torch.Tensor, mode: str, rotate=None) -> torch.Tensor:
    """Adjoint of _rotate: rotate(x) . g == x . _rotate_transposed(g)."""
    if rotate is not None:
        return g @ rotate.to(g.dtype).t()
    return -_rotate(g, mode)


@custom_op("npu::npu_rotary_mul", mutates_args=(), device_types="npu",
           schema="(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor")
def npu_rotary_mul(x, r1, r2, rotary_mode="half", rotate=None):
    _check(x, r1, r2, rotary_mode, rotate)
    return x * r1 + _rotate(x, rotary_mode, rotate) * r2


@npu_rotary_mul.register_fake
def _(x, r1, r2, rotary_mode="half", rotate=None):
    _check(x, r1, r2, rotary_mode, rotate)
    return torch.empty_like(x)


@custom_op("npu::npu_rotary_mul_backward", mutates_args=(), device_types="npu",
           schema=("(Tensor grad, Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) "
                   "-> (Tensor, Tensor, Tensor)"))
def npu_rotary_mul_backward(grad, x, r1, r2, rotary_mode="half", rotate=None):
    dx = grad * r1 + _rotate_transposed(grad * r2, rotary_mode, rotate)
    dr1 = (grad * x).sum_to_size(r1.shape)
    dr2 = (grad * _rotate(x, rotary_mode, rotate)).sum_to_size(r2.shape)
    return dx, dr1.to(r1.dtype), dr2.to(r2.dtype)


@npu_rotary_mul_backward.register_fake
def _(grad, x, r1, r2, rotary_mode="half", rotate=None):
    return torch.empty_like(x), torch.empty_like(r1), torch.empty_like(r2)


def _setup(ctx, inputs, output):
    x, r1, r2, mode, rotate = inputs
    ctx.save_for_backward(x, r1, r2, rotate)
    ctx.mode = mode


def _backward(ctx, grad):
    x, r1, r2, rotate = ctx.saved_tensors
    dx, dr1, dr2 = torch.ops.npu.npu_rotary_mul_backward(grad, x, r1, r2, ctx.mode, rotate)
    return dx, dr1, dr2, None, None


register_autograd("npu::npu_rotary_mul", _backward, setup_context=_setup)


# ---- npu_apply_rotary_pos_emb: query and key rotated in place (inference) ---------------------------------------
# q = q * cos + rotate(q) * sin, likewise k; rotate per rotary_mode: half = cat(-x2, x1) over the halves,
# interleave = (-odd, even) over the element pairs, quarter = cat(-x2, x1, -x4, x3) over the quarters.
# cos/sin broadcast over the heads: (B, S, 1, D) for BSND, (T, 1, D) for TND, the head dim set to 1 otherwise.
POS_EMB_LAYOUTS = {"BSND": 2, "SBND": 2, "BNSD": 1, "TND": 1}  # layout -> head dim


def _rotate_quarter(x):
    x1, x2, x3, x4 = x.chunk(4, dim=-1)
    return torch.cat((-x2, x1, -x4, x3), dim=-1)


def _check_pos_emb(query, key, cos, sin, layout, rotary_mode):
    op = "npu_apply_rotary_pos_emb"
    if layout not in POS_EMB_LAYOUTS:
        raise ValueError(f"{op}: layout must be one of {', '.join(POS_EMB_LAYOUTS)}, got {layout!r}")
    if rotary_mode not in ("half", "interleave", "quarter"):
        raise ValueError(f"{op}: rotary_mode must be 'half', 'interleave' or 'quarter', got {rotary_mode!r}")
    ndim = 3 if layout == "TND" else 4
    if any(t.dim() != ndim for t in (query, key, cos, sin)):
        raise ValueError(f"{op}: layout {layout} takes {ndim}-D query, key, cos and sin")
    d = query.shape[-1]
    if key.shape[-1] != d or cos.shape[-1] != d or sin.shape != cos.shape:
        raise ValueError(f"{op}: query, key, cos and sin must share the last dim D (cos/sin of one shape), got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(cos.shape)}, {tuple(sin.shape)}")
    if d % (4 if rotary_mode == "quarter" else 2):
        raise ValueError(f"{op}: D={d} must be divisible by {4 if rotary_mode == 'quarter' else 2} for "
                         f"rotary_mode {rotary_mode!r}")
    n = POS_EMB_LAYOUTS[layout]
    for t in (query, key):
        try:
            ok = torch.broadcast_shapes(t.shape, cos.shape) == t.shape and cos.shape[n] == 1
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"{op}: cos/sin {tuple(cos.shape)} must broadcast to {tuple(t.shape)} with 1 head")


def _pos_emb(x, cos, sin, mode):
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    c, s = cos.to(xf.dtype), sin.to(xf.dtype)
    rot = _rotate_quarter(xf) if mode == "quarter" else _rotate(xf, mode)
    return (xf * c + rot * s).to(x.dtype)


@custom_op("npu::_apply_rotary_pos_emb_", mutates_args=("query", "key"), device_types="npu", schema=(
    "(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin, str layout, str rotary_mode) -> ()"))
def _apply_rotary_pos_emb_(query, key, cos, sin, layout, rotary_mode):
    _check_pos_emb(query, key, cos, sin, layout, rotary_mode)
    query.copy_(_pos_emb(query, cos, sin, rotary_mode))
    key.copy_(_pos_emb(key, cos, sin, rotary_mode))


@_apply_rotary_pos_emb_.register_fake
def _(query, key, cos, sin, layout, rotary_mode):
    _check_pos_emb(query, key, cos, sin, layout, rotary_mode)


def npu_apply_rotary_pos_emb(query, key, cos, sin, layout="BSND", rotary_mode="half"):
    """``torch_npu.npu_apply_rotary_pos_emb``: updates query and key in place and returns them."""
    torch.ops.npu._apply_rotary_pos_emb_(query, key, cos, sin, layout, rotary_mode)
    return query, key


# ---- npu_mrope: rope / multimodal rope from a cos-sin cache (vLLM's layout; inference) ---------------------------
# cos_sin_cache (max_seq_len, rotary_dim) holds cos in its first half and sin in its second. positions (T,) picks
# one row per token (rope); positions (3, T) picks one per section (mrope): the rotary_dim/2 frequencies are split
# into mrope_section = [t, h, w] and section i takes its cos/sin from positions[i] ('default', three segments), or
# frequency j takes them from positions[j % 3] within the first 3*section sizes ('interleave', Qwen3-VL's layout).
# Each head's first rotary_dim elements are rotated (half: neox halves, interleave: GPT-J pairs); the rest pass.
def _mrope_plan(positions, query, key, cos_sin_cache, head_size, mrope_section, rotary_mode, cache_mode):
    op = "npu_mrope"
    if positions.dim() not in (1, 2) or (positions.dim() == 2 and positions.shape[0] != 3):
        raise ValueError(f"{op}: positions must be (num_tokens,) or (3, num_tokens), got {tuple(positions.shape)}")
    if query.dim() != 2 or key.dim() != 2 or cos_sin_cache.dim() != 2:
        raise ValueError(f"{op}: query, key and cos_sin_cache must be 2-D")
    t = positions.shape[-1]
    if query.shape[0] != t or key.shape[0] != t or query.shape[1] % head_size or key.shape[1] % head_size:
        raise ValueError(f"{op}: query {tuple(query.shape)} and key {tuple(key.shape)} must be (num_tokens={t}, "
                         f"heads * head_size={head_size})")
    rot = cos_sin_cache.shape[1]
    if rot % 2 or rot > head_size:
        raise ValueError(f"{op}: rotary_dim {rot} must be even and at most head_size {head_size}")
    if rotary_mode not in ("half", "interleave") or cache_mode not in ("default", "interleave"):
        raise ValueError(f"{op}: rotary_mode must be 'half'/'interleave' and cache_mode 'default'/'interleave', got "
                         f"{rotary_mode!r}, {cache_mode!r}")
    section = list(mrope_section) if mrope_section is not None else [0, 0, 0]
    if positions.dim() == 2 and (len(section) != 3 or sum(section) != rot // 2):
        raise ValueError(f"{op}: mrope mode (2-D positions) needs mrope_section of 3 sizes summing to "
                         f"rotary_dim/2 = {rot // 2}, got {section}")
    return section


def _mrope_cos_sin(positions, cache, section, cache_mode):
    half = cache.shape[1] // 2
    picked = cache.index_select(0, positions.reshape(-1).long()).view(*positions.shape, -1)
    cos, sin = picked[..., :half], picked[..., half:]
    if positions.dim() == 1:
        return cos, sin
    if cache_mode == "default":
        return tuple(torch.cat([p[i] for i, p in enumerate(c.split(section, dim=-1))], dim=-1) for c in (cos, sin))
    out = []
    for c in (cos, sin):
        m = c[0].clone()
        for i in (1, 2):  # frequency j (< 3 * section[i]) with j % 3 == i comes from axis i
            m[..., i:3 * section[i]:3] = c[i][..., i:3 * section[i]:3]
        out.append(m)
    return tuple(out)


def _mrope_apply(x, cos, sin, head_size, rotary_mode):
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    heads = xf.view(x.shape[0], -1, head_size)
    rot = cos.shape[-1] * 2
    xr, xp = heads[..., :rot], heads[..., rot:]
    c, s = cos.to(xf.dtype).unsqueeze(1), sin.to(xf.dtype).unsqueeze(1)
    if rotary_mode == "half":
        x1, x2 = xr.chunk(2, dim=-1)
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    return torch.cat((out, xp), dim=-1).reshape(x.shape).to(x.dtype)


@custom_op("npu::npu_mrope", mutates_args=(), device_types="npu", schema=(
    "(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, int head_size, *, int[]? mrope_section=None, "
    "str? rotary_mode='half', str? cache_mode='default') -> (Tensor, Tensor)"))
def npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half",
              cache_mode="default"):
    rotary_mode, cache_mode = rotary_mode or "half", cache_mode or "default"
    section = _mrope_plan(positions, query, key, cos_sin_cache, head_size, mrope_section, rotary_mode, cache_mode)
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= cos_sin_cache.shape[0]):
        raise ValueError(f"npu_mrope: positions must be in [0, {cos_sin_cache.shape[0]}) (the cache's rows)")
    cos, sin = _mrope_cos_sin(positions, cos_sin_cache, section, cache_mode)
    return _mrope_apply(query, cos, sin, head_size, rotary_mode), _mrope_apply(key, cos, sin, head_size, rotary_mode)


@npu_mrope.register_fake
def _(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half",
      cache_mode="default"):
    _mrope_plan(positions, query, key, cos_sin_cache, head_size, mrope_section, rotary_mode or "half",
                cache_mode or "default")
    return torch.empty_like(query), torch.empty_like(key)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_apply_rotary_pos_emb(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin, "
            "str layout='BSND', str rotary_mode='half') -> (Tensor(a!), Tensor(b!))")
# Composite: tracing sees the mutating kernel (functionalised by torch.compile) and the returned inputs.
_lib.impl("npu_apply_rotary_pos_emb", npu_apply_rotary_pos_emb, "CompositeImplicitAutograd")
