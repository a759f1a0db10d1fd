"""``npu::npu_grouped_matmul``: one matmul per group (MoE experts), ``y_g = x_g @ weight_g (+ bias_g)``.

Supported (Ascend's non-quantised forms):
* ``group_type=None`` or ``-1``: ``x`` and ``weight`` are lists of equal length, one matmul per pair.
* ``group_type=0`` (split M): ``x`` is one (M, K) tensor whose rows are split by ``group_list`` —
  cumulative row ends (``group_list_type=0``) or per-group counts (``group_list_type=1``) — and ``weight``
  is a list of (K, N) tensors or one (E, K, N) tensor.
``split_item`` 0/1 returns one output per group; 2/3 returns a single tensor (outputs concatenated along M).
Quantisation/antiquantisation arguments, activations (``act_type != 0``) and ``group_type=2`` (split K) raise.
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

_UNSUPPORTED = ("scale", "offset", "antiquant_scale", "antiquant_offset", "per_token_scale", "activation_input",
                "activation_quant_scale", "activation_quant_offset")


def _fail(msg):
    raise ValueError(f"npu_grouped_matmul: {msg}")


def _plan(x, weight, bias, group_list, split_item, group_type, group_list_type):
    """[(x_g, w_g, b_g)] per group, after validating the call form."""
    if split_item not in (0, 1, 2, 3):
        _fail(f"split_item must be 0-3, got {split_item}")
    ws = list(weight[0].unbind(0)) if len(weight) == 1 and weight[0].dim() == 3 else list(weight)
    if group_type in (None, -1):
        if group_list is not None:
            _fail("group_list needs group_type=0 (split M)")
        if len(x) != len(ws):
            _fail(f"x has {len(x)} tensors but weight has {len(ws)}")
        xs = list(x)
    elif group_type == 0:
        if len(x) != 1 or group_list is None:
            _fail("group_type=0 takes one x tensor (M, K) and group_list")
        if group_list_type not in (0, 1):
            _fail(f"group_list_type must be 0 (cumulative) or 1 (counts), got {group_list_type}")
        counts = list(group_list) if group_list_type == 1 else [
            b - a for a, b in zip([0] + list(group_list[:-1]), group_list)]
        if any(c < 0 for c in counts) or sum(counts) > x[0].shape[0] or len(counts) != len(ws):
            _fail(f"group_list {list(group_list)} must give {len(ws)} non-negative groups within M="
                  f"{x[0].shape[0]} rows")
        xs = list(x[0].split(counts + [x[0].shape[0] - sum(counts)], dim=0)[:len(counts)])
    else:
        _fail(f"group_type {group_type} is not supported (None/-1: no split, 0: split M)")
    bs = list(bias) if bias is not None else [None] * len(ws)
    if len(bs) != len(ws):
        _fail(f"bias has {len(bs)} tensors for {len(ws)} groups")
    for i, (xi, wi) in enumerate(zip(xs, ws)):
        if xi.shape[-1] != wi.shape[0] or wi.dim() != 2:
            _fail(f"group {i}: x {tuple(xi.shape)} @ weight {tuple(wi.shape)} do not multiply (weight is (K, N))")
    return list(zip(xs, ws, bs))


def _check_unsupported(kwargs, act_type):
    for name in _UNSUPPORTED:
        if kwargs.get(name) is not None:
            _fail(f"{name} (quantised grouped matmul) is not supported by npudist")
    if act_type not in (None, 0):
        _fail(f"act_type {act_type} (fused activation) is not supported; apply the activation afterwards")


_SCHEMA = ("(Tensor[] x, Tensor[] weight, Tensor[]? bias=None, Tensor[]? scale=None, Tensor[]? offset=None, "
           "Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, Tensor[]? per_token_scale=None, "
           "int[]? group_list=None, Tensor[]? activation_input=None, Tensor[]? activation_quant_scale=None, "
           "Tensor[]? activation_quant_offset=None, int? split_item=0, int? group_type=None, "
           "int? group_list_type=0, int? act_type=0, ScalarType? output_dtype=None) -> Tensor[]")


def _outputs(groups, split_item, output_dtype, compute):
    outs = [compute(xg, wg, bg) for xg, wg, bg in groups]
    if output_dtype is not None:
        outs = [o.to(output_dtype) for o in outs]
    if split_item in (2, 3):
        return [torch.cat(outs, dim=0)]
    return outs


# The kernel lives in `_grouped_matmul` whose arguments have no defaults: torch.library's autograd for ops
# with tensor-list inputs expects one gradient per argument *as passed*, and the dispatcher drops trailing
# default arguments, so the public op (below) validates the Ascend-only arguments and calls it in full.
@custom_op("npu::_grouped_matmul", mutates_args=(), device_types="npu", schema=(
    "(Tensor[] x, Tensor[] weight, Tensor[]? bias, int[]? group_list, int split_item, int group_type, "
    "int group_list_type, ScalarType? output_dtype) -> Tensor[]"))
def _grouped_matmul(x, weight, bias, group_list, split_item, group_type, group_list_type, output_dtype):
    groups = _plan(x, weight, bias, group_list, split_item, group_type, group_list_type)
    return _outputs(groups, split_item, output_dtype, lambda xg, wg, bg: xg @ wg if bg is None else xg @ wg + bg)


@_grouped_matmul.register_fake
def _(x, weight, bias, group_list, split_item, group_type, group_list_type, output_dtype):
    groups = _plan(x, weight, bias, group_list, split_item, group_type, group_list_type)
    return _outputs(groups, split_item, output_dtype,
                    lambda xg, wg, bg: xg.new_empty((*xg.shape[:-1], wg.shape[1])))


def _setup(ctx, inputs, output):
    x, weight, bias, group_list, split_item, group_type, group_list_type, _ = inputs
    ctx.n_x, ctx.n_w, ctx.has_bias = len(x), len(weight), bias is not None
    ctx.save_for_backward(*x, *weight)
    ctx.cfg = (group_list, split_item, group_type, group_list_type)


def _backward(ctx, grads):
    saved = ctx.saved_tensors
    x, weight = list(saved[:ctx.n_x]), list(saved[ctx.n_x:])
    group_list, split_item, group_type, group_list_type = ctx.cfg
    groups = _plan(x, weight, None, group_list, split_item, group_type, group_list_type)
    if split_item in (2, 3):  # one concatenated output: cut its gradient back into groups
        grads = list(grads[0].split([xg.shape[0] for xg, _, _ in groups], dim=0))
    dxs, dws, dbs = [], [], []
    for (xg, wg, _), gy in zip(groups, grads):
        if gy is None:
            gy = xg.new_zeros((*xg.shape[:-1], wg.shape[1]))
        gy = gy.to(xg.dtype)
        dxs.append(gy @ wg.t())
        dws.append(xg.reshape(-1, xg.shape[-1]).t() @ gy.reshape(-1, gy.shape[-1]))
        dbs.append(gy.reshape(-1, gy.shape[-1]).sum(0))
    if group_type == 0:  # rows past the last group took no part
        rest = x[0].shape[0] - sum(d.shape[0] for d in dxs)
        dxs = [torch.cat(dxs + [x[0].new_zeros(rest, x[0].shape[1])], dim=0)]
    if ctx.n_w == 1 and len(dws) > 1:  # one (E, K, N) weight tensor
        dws = [torch.stack(dws, dim=0)]
    return dxs, dws, dbs if ctx.has_bias else None, None, None, None, None, None


register_autograd("npu::_grouped_matmul", _backward, setup_context=_setup)

_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_grouped_matmul" + _SCHEMA)


def npu_grouped_matmul(x, weight, bias=None, scale=None, offset=None, antiquant_scale=None, antiquant_offset=None,
                       per_token_scale=None, group_list=None, activation_input=None, activation_quant_scale=None,
                       activation_quant_offset=None, split_item=0, group_type=None, group_list_type=0, act_type=0,
                       output_dtype=None):
    _check_unsupported(locals(), act_type)
    return torch.ops.npu._grouped_matmul(x, weight, bias, group_list, 0 if split_item is None else split_item,
                                         -1 if group_type is None else group_type,
                                         0 if group_list_type is None else group_list_type, output_dtype)


# Composite: autograd and tracing see the _grouped_matmul call it decomposes into.
_lib.impl("npu_grouped_matmul", npu_grouped_matmul, "CompositeImplicitAutograd")
