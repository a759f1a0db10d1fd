"""``npu::npu_grouped_matmul``: one matmul per group (MoE experts), ``y_g = x_g @ weight_g (+ bias_g)``.

Supported (Ascend's non-quantised forms):
* ``group_type=None`` or ``-1``: ``x`` and ``weight`` are lists of equal length, one matmul per pair
  (an optional ``group_list`` must then describe the rows of each x); or one 2-D ``x`` split along M by the
  cumulative ``group_list`` over several weights (torch_npu's int-list form).
* ``group_type=0`` (split M): ``x`` is one (M, K) tensor whose rows are split by ``group_list`` —
  cumulative row ends (``group_list_type=0``) or per-group counts (``group_list_type=1``) — and ``weight``
  is a list of (K, N) tensors or one (E, K, N) tensor; or x and weight are lists of equal length.
* ``group_type=2`` (split K, the experts' weight gradient ``x^T @ dy``): one x (M, K) and one weight (K, N)
  whose K axis ``group_list`` splits; group g is ``x[:, K_g] @ weight[K_g, :]``.
``split_item`` 0/1 returns one output per group; 2/3 returns a single tensor (outputs concatenated along M,
or stacked to (E, M, N) for split K). Groups that end before M (or K) leave the rest out.
Quantisation/antiquantisation arguments, activations (``act_type != 0``, Ascend applies them only to
per-token-quantised calls) and ``group_type=1`` (split N, which Ascend's training kernels lack too) raise.
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

_UNSUPPORTED = ("scale", "offset", "antiquant_scale", "antiquant_offset", "per_token_scale", "activation_input",
                "activation_quant_scale", "activation_quant_offset")


def _fail(msg):
    raise ValueError(f"npu_grouped_matmul: {msg}")


def _counts(group_list, group_list_type, total, n_groups, axis):
    if group_list_type not in (0, 1):
        _fail(f"group_list_type must be 0 (cumulative) or 1 (counts), got {group_list_type}")
    gl = [int(v) for v in group_list]
    counts = gl if group_list_type == 1 else [b - a for a, b in zip([0] + gl[:-1], gl)]
    if any(c < 0 for c in counts) or sum(counts) > total or len(counts) != n_groups:
        _fail(f"group_list {gl} must give {n_groups} non-negative groups within {axis}={total}")
    return counts


def _split(t, counts, dim):
    """The groups of ``t`` along ``dim``; entries past the last group take no part."""
    return list(t.split(counts + [t.shape[dim] - sum(counts)], dim=dim)[:len(counts)])


def _plan(x, weight, bias, group_list, split_item, group_type, group_list_type):
    """[(x_g, w_g, b_g)] per group, after validating the call form."""
    if split_item not in (0, 1, 2, 3):
        _fail(f"split_item must be 0-3, got {split_item}")
    if group_type not in (None, -1, 0, 2):
        _fail(f"group_type {group_type} is not supported (None/-1: no split, 0: split M, 2: split K; "
              f"1 (split N) is not supported by Ascend's training kernels either)")
    ws = list(weight[0].unbind(0)) if len(weight) == 1 and weight[0].dim() == 3 else list(weight)
    if group_type == 2:  # split K: x is one (M, K), weight one (K, N); group g multiplies K-slice g of both
        if len(x) != 1 or len(weight) != 1 or x[0].dim() != 2 or weight[0].dim() != 2 or group_list is None:
            _fail("group_type=2 (split K) takes one 2-D x (M, K), one 2-D weight (K, N) and group_list")
        if x[0].shape[1] != weight[0].shape[0]:
            _fail(f"x {tuple(x[0].shape)} @ weight {tuple(weight[0].shape)} do not multiply (weight is (K, N))")
        counts = _counts(group_list, group_list_type, x[0].shape[1], len(group_list), "K")
        xs, ws = _split(x[0], counts, 1), _split(weight[0], counts, 0)
    elif len(x) == 1 and len(ws) > 1 or group_type == 0 and len(x) == 1:  # split M of one x over the weights
        if group_list is None or x[0].dim() != 2:
            _fail("one 2-D x (M, K) with several weights (or an (E, K, N) weight) needs group_list to split M")
        # torch_npu's int-list form (group_type None) takes cumulative ends only
        glt = group_list_type if group_type == 0 else 0
        xs = _split(x[0], _counts(group_list, glt, x[0].shape[0], len(ws), "M"), 0)
    else:
        if len(x) != len(ws):
            _fail(f"x has {len(x)} tensors but weight has {len(ws)}")
        xs = list(x)
        if group_list is not None:  # optional here: it must then describe the rows of each x
            glt = group_list_type if group_type == 0 else 0
            rows = [xi.shape[0] for xi in xs]
            if _counts(group_list, glt, sum(rows), len(ws), "M") != rows:
                _fail(f"group_list {list(group_list)} does not match the rows {rows} of the x tensors")
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


def _outputs(groups, split_item, group_type, output_dtype, compute):
    outs = [compute(xg, wg, bg) for xg, wg, bg in groups]
    if output_dtype is not None:
        outs = [o.to(output_dtype) for o in outs]
    if split_item in (2, 3):  # one tensor: split K stacks the (M, N) partial products, the others concatenate rows
        return [torch.stack(outs, dim=0) if group_type == 2 else torch.cat(outs, dim=0)]
    return outs


# The kernel lives in `_grouped_matmul` whose arguments have no defaults: torch.library's autograd for ops
# with tensor-list inputs expects one gradient per argument *as passed*, and the dispatcher drops trailing
# default arguments, so the public op (below) validates the Ascend-only arguments and calls it in full.
@custom_op("npu::_grouped_matmul", mutates_args=(), device_types="npu", schema=(
    "(Tensor[] x, Tensor[] weight, Tensor[]? bias, int[]? group_list, int split_item, int group_type, "
    "int group_list_type, ScalarType? output_dtype) -> Tensor[]"))
def _grouped_matmul(x, weight, bias, group_list, split_item, group_type, group_list_type, output_dtype):
    groups = _plan(x, weight, bias, group_list, split_item, group_type, group_list_type)
    return _outputs(groups, split_item, group_type, output_dtype,
                    lambda xg, wg, bg: xg @ wg if bg is None else xg @ wg + bg)


@_grouped_matmul.register_fake
def _(x, weight, bias, group_list, split_item, group_type, group_list_type, output_dtype):
    groups = _plan(x, weight, bias, group_list, split_item, group_type, group_list_type)
    return _outputs(groups, split_item, group_type, output_dtype,
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
    if split_item in (2, 3):  # one output: cut its gradient back into groups
        grads = list(grads[0].unbind(0)) if group_type == 2 else list(
            grads[0].split([xg.shape[0] for xg, _, _ in groups], dim=0))
    dxs, dws, dbs = [], [], []
    for (xg, wg, _), gy in zip(groups, grads):
        if gy is None:
            gy = xg.new_zeros((*xg.shape[:-1], wg.shape[1]))
        gy = gy.to(xg.dtype)
        dxs.append(gy @ wg.t())
        dws.append(xg.flatten(0, -2).t() @ gy.flatten(0, -2))
        dbs.append(gy.flatten(0, -2).sum(0))
    if group_type == 2:  # K slices of the one x and the one weight; K past the last group took no part
        rest = x[0].shape[1] - sum(d.shape[1] for d in dxs)
        dxs = [torch.cat(dxs + [x[0].new_zeros(x[0].shape[0], rest)], dim=1)]
        dws = [torch.cat(dws + [weight[0].new_zeros(rest, weight[0].shape[1])], dim=0)]
    elif len(x) == 1 and len(dxs) > 1 or group_type == 0 and len(x) == 1:  # M slices of the one x
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


# ---- grouped matmul add: the experts' weight gradient accumulated into a float32 buffer ------------------------
def _check_gmm_add(y, x, weight, group_list, transpose_x, transpose_weight, group_type, group_list_type):
    op = "npu_grouped_matmul_add"
    if not transpose_x or transpose_weight or group_type != 2:
        raise ValueError(f"{op}: Ascend supports only transpose_x=True, transpose_weight=False and group_type=2 "
                         f"(split K), got {transpose_x}, {transpose_weight}, {group_type}")
    if group_list_type not in (None, 0, 1):
        raise ValueError(f"{op}: group_list_type must be 0 (cumulative) or 1 (counts), got {group_list_type}")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[0] != weight.shape[0]:
        raise ValueError(f"{op}: x (K, M) and weight (K, N) must be 2-D with equal K, got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if group_list.dim() != 1 or tuple(y.shape) != (group_list.shape[0], x.shape[1], weight.shape[1]):
        raise ValueError(f"{op}: self must be (g, M, N) = ({group_list.shape[0] if group_list.dim() == 1 else '?'}, "
                         f"{x.shape[1]}, {weight.shape[1]}), got {tuple(y.shape)}")


def _gmm_add_products(x, weight, group_list, group_list_type, dtype):
    """[x_g^T @ weight_g] over the K slices group_list gives, in dtype."""
    counts = _counts(group_list.tolist(), group_list_type or 0, x.shape[0], group_list.shape[0], "K")
    return [xg.to(dtype).t() @ wg.to(dtype) for xg, wg in zip(_split(x, counts, 0), _split(weight, counts, 0))]


_GMM_ADD_ARGS = ("Tensor x, Tensor weight, Tensor group_list, *, bool transpose_x=True, bool transpose_weight=False, "
                 "int group_type=2, int? group_list_type=0")


@custom_op("npu::npu_grouped_matmul_add", mutates_args=(), device_types="npu",
           schema=f"(Tensor self, {_GMM_ADD_ARGS}) -> Tensor")
def npu_grouped_matmul_add(y, x, weight, group_list, *, transpose_x=True, transpose_weight=False, group_type=2,
                           group_list_type=0):
    _check_gmm_add(y, x, weight, group_list, transpose_x, transpose_weight, group_type, group_list_type)
    return y + torch.stack(_gmm_add_products(x, weight, group_list, group_list_type, y.dtype)) if len(group_list) \
        else y.clone()


@npu_grouped_matmul_add.register_fake
def _(y, x, weight, group_list, *, transpose_x=True, transpose_weight=False, group_type=2, group_list_type=0):
    _check_gmm_add(y, x, weight, group_list, transpose_x, transpose_weight, group_type, group_list_type)
    return torch.empty_like(y)


@custom_op("npu::npu_grouped_matmul_add_", mutates_args=("y",), device_types="npu",
           schema=f"(Tensor(a!) y, {_GMM_ADD_ARGS}) -> ()")
def _grouped_matmul_add_inplace(y, x, weight, group_list, *, transpose_x=True, transpose_weight=False,
                                group_type=2, group_list_type=0):
    _check_gmm_add(y, x, weight, group_list, transpose_x, transpose_weight, group_type, group_list_type)
    for g, prod in enumerate(_gmm_add_products(x, weight, group_list, group_list_type, y.dtype)):
        y[g].add_(prod)


@_grouped_matmul_add_inplace.register_fake
def _(y, x, weight, group_list, *, transpose_x=True, transpose_weight=False, group_type=2, group_list_type=0):
    _check_gmm_add(y, x, weight, group_list, transpose_x, transpose_weight, group_type, group_list_type)


def grouped_matmul_add_(y, x, weight, group_list, *, transpose_x=True, transpose_weight=False, group_type=2,
                        group_list_type=0):
    """``torch_npu.npu_grouped_matmul_add_``: accumulates into ``y`` and returns it."""
    torch.ops.npu.npu_grouped_matmul_add_(y, x, weight, group_list, transpose_x=transpose_x,
                                          transpose_weight=transpose_weight, group_type=group_type,
                                          group_list_type=group_list_type)
    return y


def _gmm_add_setup(ctx, inputs, keyword_only_inputs, output):
    _, x, weight, group_list = inputs
    ctx.save_for_backward(x, weight, group_list)
    ctx.group_list_type = keyword_only_inputs.get("group_list_type", 0)


# The gradients read group_list's values, so they are an operator of their own (with a fake kernel for tracing).
@custom_op("npu::_grouped_matmul_add_backward", mutates_args=(), device_types="npu",
           schema="(Tensor grad, Tensor x, Tensor weight, Tensor group_list, int group_list_type) -> (Tensor, Tensor)")
def _grouped_matmul_add_backward(grad, x, weight, group_list, group_list_type):
    counts = _counts(group_list.tolist(), group_list_type, x.shape[0], group_list.shape[0], "K")
    dxs, dws = [], []
    for g, (xg, wg) in enumerate(zip(_split(x, counts, 0), _split(weight, counts, 0))):
        gy = grad[g].to(x.dtype)  # out_g = x_g^T @ w_g: dx_g = w_g @ gy^T, dw_g = x_g @ gy
        dxs.append(wg @ gy.t())
        dws.append(xg @ gy)
    rest = x.shape[0] - sum(counts)
    dx = torch.cat(dxs + [x.new_zeros(rest, x.shape[1])])
    dw = torch.cat(dws + [weight.new_zeros(rest, weight.shape[1])])
    return dx, dw


@_grouped_matmul_add_backward.register_fake
def _(grad, x, weight, group_list, group_list_type):
    return torch.empty_like(x), torch.empty_like(weight)


def _gmm_add_backward(ctx, grad):
    x, weight, group_list = ctx.saved_tensors
    dx, dw = torch.ops.npu._grouped_matmul_add_backward(grad, x, weight, group_list, ctx.group_list_type or 0)
    return grad, dx, dw, None


register_autograd("npu::npu_grouped_matmul_add", _gmm_add_backward, setup_context=_gmm_add_setup)
