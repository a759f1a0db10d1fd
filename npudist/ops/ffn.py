"""torch_npu's feed-forward operator ``npu_ffn``, its documented formula ``out = activation(x W1 + b1) W2 + b2`` as
aten ops (fake tensors and compile come from them).

``npu_ffn(x, weight1, weight2, activation, *, expert_tokens=None, bias1=None, bias2=None, inner_precise=None,
...)``: ``x`` (..., K1) is flattened to its M rows; without experts ``weight1`` (K1, N1), ``weight2`` (K2, N2),
``bias1`` (N1,), ``bias2`` (N2,); with ``expert_tokens`` (E token counts summing to M, the rows grouped by
expert in order) ``weight1`` (E, K1, N1), ``weight2`` (E, K2, N2), ``bias1`` (E, N1), ``bias2`` (E, N2) and each
expert's rows use its own weights. ``activation``: "fastgelu" (``x * sigmoid(1.702 x)``, as npu_fast_gelu),
"gelu" (the erf form), "relu", "silu". Computed in float32 (float64 for float64 inputs; ``inner_precise``, the
float16 precision / speed choice, does not change that), returned in x's dtype and shape (last dim N2).
``output_dtype`` is documented as effective only with quantised inputs, which are refused, so it is not used.

Refused with a ValueError naming the argument: the gated activations "geglu", "swiglu", "reglu" (the page does
not say which half of x W1 + b1 is the gate), ``expert_tokens_index`` (its index form is not described), and
the quantisation / pseudo-quantisation parameters ``scale``, ``offset``, ``deq_scale1/2``,
``antiquant_scale1/2``, ``antiquant_offset1/2`` (no formulas are given for them).
"""
from __future__ import annotations

import torch

_OP = "npu_ffn"
_ACTIVATIONS = {"fastgelu": lambda h: h * torch.sigmoid(1.702 * h), "gelu": torch.nn.functional.gelu,
                "relu": torch.relu, "silu": torch.nn.functional.silu}
_GATED = ("geglu", "swiglu", "reglu")


def _fail(msg):
    raise ValueError(f"{_OP}: {msg}")


def _check_shapes(x, weight1, weight2, bias1, bias2, experts):
    lead = (experts,) if experts else ()
    if weight1.dim() != len(lead) + 2 or weight2.dim() != len(lead) + 2 or tuple(weight1.shape[:-2]) != lead \
            or tuple(weight2.shape[:-2]) != lead:
        form = "(E, K, N)" if experts else "(K, N)"
        _fail(f"weight1 and weight2 must be {form}{f' with E = {experts}' if experts else ''}, got "
              f"{tuple(weight1.shape)} and {tuple(weight2.shape)}")
    k1, n1 = weight1.shape[-2:]
    k2, n2 = weight2.shape[-2:]
    if x.shape[-1] != k1 or n1 != k2:
        _fail(f"need x's last dim = K1 and N1 = K2, got x {tuple(x.shape)}, weight1 {tuple(weight1.shape)}, "
              f"weight2 {tuple(weight2.shape)}")
    for name, b, n in (("bias1", bias1, n1), ("bias2", bias2, n2)):
        if b is not None and tuple(b.shape) != lead + (n,):
            _fail(f"{name} must be {lead + (n,)}, got {tuple(b.shape)}")


def npu_ffn(x, weight1, weight2, activation, *, expert_tokens=None, expert_tokens_index=None, bias1=None, bias2=None,
            scale=None, offset=None, deq_scale1=None, deq_scale2=None, antiquant_scale1=None, antiquant_scale2=None,
            antiquant_offset1=None, antiquant_offset2=None, inner_precise=None, output_dtype=None):
    for name, value in (("scale", scale), ("offset", offset), ("deq_scale1", deq_scale1), ("deq_scale2", deq_scale2),
                        ("antiquant_scale1", antiquant_scale1), ("antiquant_scale2", antiquant_scale2),
                        ("antiquant_offset1", antiquant_offset1), ("antiquant_offset2", antiquant_offset2)):
        if value is not None:
            _fail(f"{name} is not supported (the page gives no formula for the quantised FFN)")
    if expert_tokens_index is not None:
        _fail("expert_tokens_index is not supported (its index form is not described); pass expert_tokens counts")
    if activation in _GATED:
        _fail(f"activation {activation!r} is not supported: the page does not say which half of x W1 + b1 gates "
              f"the other; use one of {sorted(_ACTIVATIONS)}")
    if activation not in _ACTIVATIONS:
        _fail(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    if inner_precise not in (None, 0, 1):
        _fail(f"inner_precise must be 0 (high precision) or 1 (high performance), got {inner_precise}")
    if not 2 <= x.dim() <= 8:
        _fail(f"x must have 2 to 8 dims, got {x.dim()}")
    counts = None if expert_tokens is None else [int(c) for c in expert_tokens]
    _check_shapes(x, weight1, weight2, bias1, bias2, len(counts) if counts else 0)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    rows = x.reshape(-1, x.shape[-1]).to(acc)
    act_fn = _ACTIVATIONS[activation]

    def expert(xs, w1, w2, b1, b2):
        h = xs @ w1.to(acc)
        if b1 is not None:
            h = h + b1.to(acc)
        out = act_fn(h) @ w2.to(acc)
        return out if b2 is None else out + b2.to(acc)

    if counts is None:
        out = expert(rows, weight1, weight2, bias1, bias2)
    else:
        if any(c < 0 for c in counts) or sum(counts) != rows.shape[0]:
            _fail(f"expert_tokens must be non-negative counts summing to x's {rows.shape[0]} rows, got {counts}")
        parts = rows.split(counts)
        out = torch.cat([expert(p, weight1[e], weight2[e], None if bias1 is None else bias1[e],
                                None if bias2 is None else bias2[e]) for e, p in enumerate(parts)])
    return out.to(x.dtype).reshape(*x.shape[:-1], weight2.shape[-1])


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_ffn(Tensor x, Tensor weight1, Tensor weight2, str activation, *, int[]? expert_tokens=None, "
            "int[]? expert_tokens_index=None, Tensor? bias1=None, Tensor? bias2=None, Tensor? scale=None, "
            "Tensor? offset=None, Tensor? deq_scale1=None, Tensor? deq_scale2=None, Tensor? antiquant_scale1=None, "
            "Tensor? antiquant_scale2=None, Tensor? antiquant_offset1=None, Tensor? antiquant_offset2=None, "
            "int? inner_precise=None, ScalarType? output_dtype=None) -> Tensor")
_lib.impl("npu_ffn", npu_ffn, "CompositeImplicitAutograd")
