"""MoE gating operators: softmax/sigmoid scores, (grouped) top-k expert selection, and the gating backward.

* ``npu_moe_gating_top_k_softmax(x, finished=None, k=1) -> (y, expert_idx, row_idx)``: ``y, expert_idx =
  topk(softmax(x, -1), k)``; ``row_idx[..., j] = j * rows + row`` (``arange(rows * k).view(k, rows).t()``),
  rows = the product of x's leading dims. A row whose ``finished`` is True gets expert index ``num_experts``.
* ``npu_moe_gating_top_k_softmax_v2(x, *, k=1, finished=None, renorm=0, output_softmax=False)``: renorm 0 as
  above, renorm 1 takes topk of x first and softmaxes the k values. The third output is the float32
  ``softmax(x)`` when renorm = 0 and output_softmax, else an empty (0,) float32 tensor.
* ``npu_moe_gating_top_k(x, k, *, bias, input_ids, tid2eid, k_group, group_count, group_select_mode, renorm,
  norm_type, out_flag, routed_scaling_factor, eps) -> (y, expert_idx, norm_out)``: ``norm_out = softmax(x)``
  (norm_type 0) or ``sigmoid(x)`` (1) in float32; selection scores ``norm_out + bias``; with group_count > 1 the
  experts split into groups scored by their max (group_select_mode 0) or top-2 sum (1), and only the best
  k_group groups stay eligible; ``expert_idx = topk(scores, k)`` (hash mode: ``tid2eid[input_ids]``);
  ``y = g / (sum(g) + eps) * routed_scaling_factor`` with ``g = norm_out[expert_idx]`` (without the bias).
  norm_out is returned whatever out_flag says (its shape and dtype do not depend on it).
* ``npu_moe_gating_top_k_backward(x_norm, grad_y, expertIdx, *, renorm, norm_type, routed_scaling_factor,
  eps)``: the gradient of ``y`` above with respect to ``x``.

The softmax forms are inference operators on Ascend (no backward); npu_moe_gating_top_k is differentiable in x.
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

_MAX_K = 1024
_MAX_EXPERTS = 2048


def _fail(op: str, msg: str):
    raise ValueError(f"{op}: {msg}")


# ---- softmax + top-k (inference) --------------------------------------------------------------------------
def _check_softmax_topk(op, x, finished, k, renorm=0):
    if x.dim() not in (2, 3) or not x.is_floating_point():
        _fail(op, f"x must be a 2-D or 3-D floating tensor, got {x.dtype} {tuple(x.shape)}")
    if not 0 < k <= min(x.shape[-1], _MAX_K):
        _fail(op, f"k must be in (0, min(num_experts={x.shape[-1]}, {_MAX_K})], got {k}")
    if finished is not None and (finished.dtype != torch.bool or tuple(finished.shape) != tuple(x.shape[:-1])):
        _fail(op, f"finished must be a bool tensor of shape {tuple(x.shape[:-1])}, got {finished.dtype} "
                  f"{tuple(finished.shape)}")
    if renorm not in (0, 1):
        _fail(op, f"renorm must be 0 (softmax, then topk) or 1 (topk, then softmax), got {renorm}")


def _finish(expert_idx, finished, num_experts):
    """Rows marked finished route to the sentinel expert ``num_experts``."""
    idx = expert_idx.to(torch.int32)
    if finished is not None:
        idx = torch.where(finished.unsqueeze(-1), torch.full_like(idx, num_experts), idx)
    return idx


@custom_op("npu::npu_moe_gating_top_k_softmax", mutates_args=(), device_types="npu",
           schema="(Tensor x, Tensor? finished=None, int k=1) -> (Tensor, Tensor, Tensor)")
def npu_moe_gating_top_k_softmax(x, finished=None, k=1):
    _check_softmax_topk("npu_moe_gating_top_k_softmax", x, finished, k)
    y, idx = torch.softmax(x.float(), dim=-1).topk(k, dim=-1)
    rows = x[..., 0].numel()
    row_idx = torch.arange(rows * k, device=x.device, dtype=torch.int32).view(k, rows).t()
    return y.to(x.dtype), _finish(idx, finished, x.shape[-1]), row_idx.reshape(idx.shape).contiguous()


@npu_moe_gating_top_k_softmax.register_fake
def _(x, finished=None, k=1):
    _check_softmax_topk("npu_moe_gating_top_k_softmax", x, finished, k)
    shape = (*x.shape[:-1], k)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int32), x.new_empty(shape, dtype=torch.int32)


# Kernels with keyword-only tensors are defined on a positional kernel (custom_op takes no keyword-only tensors).
@custom_op("npu::_moe_gating_top_k_softmax_v2", mutates_args=(), device_types="npu", schema=(
    "(Tensor x, Tensor? finished, int k, int renorm, bool output_softmax) -> (Tensor, Tensor, Tensor)"))
def _moe_gating_top_k_softmax_v2(x, finished, k, renorm, output_softmax):
    _check_softmax_topk("npu_moe_gating_top_k_softmax_v2", x, finished, k, renorm)
    if renorm == 0:
        probs = torch.softmax(x.float(), dim=-1)
        y, idx = probs.topk(k, dim=-1)
        soft = probs if output_softmax else x.new_empty(0, dtype=torch.float32)
    else:
        top, idx = x.float().topk(k, dim=-1)
        y, soft = torch.softmax(top, dim=-1), x.new_empty(0, dtype=torch.float32)
    return y.to(x.dtype), _finish(idx, finished, x.shape[-1]), soft


@_moe_gating_top_k_softmax_v2.register_fake
def _(x, finished, k, renorm, output_softmax):
    _check_softmax_topk("npu_moe_gating_top_k_softmax_v2", x, finished, k, renorm)
    shape = (*x.shape[:-1], k)
    soft = x.shape if renorm == 0 and output_softmax else (0,)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int32), x.new_empty(soft, dtype=torch.float32)


def npu_moe_gating_top_k_softmax_v2(x, *, k=1, finished=None, renorm=0, output_softmax=False):
    return torch.ops.npu._moe_gating_top_k_softmax_v2(x, finished, k, 0 if renorm is None else renorm,
                                                      bool(output_softmax))


# ---- grouped top-k with softmax/sigmoid (differentiable) --------------------------------------------------
_OP = "npu_moe_gating_top_k"


def _check_gating(x, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode, renorm, norm_type):
    if x.dim() != 2 or not x.is_floating_point():
        _fail(_OP, f"x must be a 2-D floating tensor (tokens, experts), got {x.dtype} {tuple(x.shape)}")
    e = x.shape[1]
    if e > _MAX_EXPERTS:
        _fail(_OP, f"the number of experts (x.shape[-1] = {e}) must be at most {_MAX_EXPERTS}")
    if group_count <= 0 or e % group_count or e // group_count <= 2:
        _fail(_OP, f"group_count must divide the {e} experts into groups of more than 2, got {group_count}")
    if not 1 <= k_group <= group_count:
        _fail(_OP, f"k_group must be in [1, group_count={group_count}], got {k_group}")
    if not 1 <= k <= e // group_count * k_group:
        _fail(_OP, f"k must be in [1, experts / group_count * k_group = {e // group_count * k_group}], got {k}")
    if group_select_mode not in (0, 1):
        _fail(_OP, f"group_select_mode must be 0 (group max) or 1 (sum of the group's top 2), got "
                   f"{group_select_mode}")
    _check_modes(_OP, renorm, norm_type)
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != e):
        _fail(_OP, f"bias must be 1-D of the {e} experts, got shape {tuple(bias.shape)}")
    if (input_ids is None) != (tid2eid is None):
        _fail(_OP, "input_ids and tid2eid (hash mode) must be given together")
    if input_ids is not None:
        if input_ids.dim() != 1 or input_ids.shape[0] != x.shape[0]:
            _fail(_OP, f"input_ids must be 1-D with one id per token ({x.shape[0]}), got {tuple(input_ids.shape)}")
        if tid2eid.dim() != 2 or tid2eid.shape[1] != k:
            _fail(_OP, f"tid2eid must be 2-D (vocab, k={k}), got {tuple(tid2eid.shape)}")


def _norm(x, norm_type):
    return torch.softmax(x.float(), dim=-1) if norm_type == 0 else torch.sigmoid(x.float())


def _select(norm, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode):
    if input_ids is not None:
        return tid2eid.index_select(0, input_ids.long()).long()
    scores = norm if bias is None else norm + bias.float()
    if group_count > 1:
        grouped = scores.unflatten(-1, (group_count, -1))
        if group_select_mode == 0:
            group_score = grouped.amax(-1)
        else:
            group_score = grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(
            -1, group_score.topk(k_group, dim=-1).indices, True)
        scores = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).flatten(-2)
    return scores.topk(k, dim=-1).indices


@custom_op("npu::_moe_gating_top_k", mutates_args=(), device_types="npu", schema=(
    "(Tensor x, Tensor? bias, Tensor? input_ids, Tensor? tid2eid, int k, int k_group, int group_count, "
    "int group_select_mode, int renorm, int norm_type, float routed_scaling_factor, float eps)"
    " -> (Tensor, Tensor, Tensor)"))
def _moe_gating_top_k(x, bias, input_ids, tid2eid, k, k_group, group_count, group_select_mode, renorm, norm_type,
                      routed_scaling_factor, eps):
    _check_gating(x, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode, renorm, norm_type)
    norm = _norm(x, norm_type)
    idx = _select(norm, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode)
    g = norm.gather(-1, idx)
    y = g / (g.sum(-1, keepdim=True) + eps) * routed_scaling_factor
    return y.to(x.dtype), idx.to(torch.int32), norm


@_moe_gating_top_k.register_fake
def _(x, bias, input_ids, tid2eid, k, k_group, group_count, group_select_mode, renorm, norm_type,
      routed_scaling_factor, eps):
    _check_gating(x, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode, renorm, norm_type)
    return (x.new_empty(x.shape[0], k), x.new_empty(x.shape[0], k, dtype=torch.int32),
            x.new_empty(x.shape, dtype=torch.float32))


def _check_modes(op, renorm, norm_type):
    if renorm != 0:
        _fail(op, f"renorm must be 0 (norm, then topk; the only mode Ascend supports), got {renorm}")
    if norm_type not in (0, 1):
        _fail(op, f"norm_type must be 0 (softmax) or 1 (sigmoid), got {norm_type}")


def _check_gating_backward(x_norm, grad_y, expert_idx, renorm, norm_type):
    op = "npu_moe_gating_top_k_backward"
    if x_norm.dim() != 2 or x_norm.dtype != torch.float32:
        _fail(op, f"x_norm must be the forward's 2-D float32 norm_out, got {x_norm.dtype} {tuple(x_norm.shape)}")
    if grad_y.dim() != 2 or grad_y.shape[0] != x_norm.shape[0] or not 1 <= grad_y.shape[1] <= x_norm.shape[1]:
        _fail(op, f"grad_y must be (M={x_norm.shape[0]}, K) with 1 <= K <= {x_norm.shape[1]}, got "
                  f"{tuple(grad_y.shape)}")
    if tuple(expert_idx.shape) != tuple(grad_y.shape) or expert_idx.dtype not in (torch.int32, torch.int64):
        _fail(op, f"expertIdx must be an int32 tensor of grad_y's shape {tuple(grad_y.shape)}, got "
                  f"{expert_idx.dtype} {tuple(expert_idx.shape)}")
    _check_modes(op, renorm, norm_type)


def _norm_vjp(s, ds, norm_type):
    """Gradient through norm_out = softmax(x) or sigmoid(x), from the float32 scores s."""
    if norm_type == 0:
        return s * (ds - (ds * s).sum(-1, keepdim=True))
    return ds * s * (1 - s)


@custom_op("npu::npu_moe_gating_top_k_backward", mutates_args=(), device_types="npu", schema=(
    "(Tensor x_norm, Tensor grad_y, Tensor expertIdx, *, int renorm=0, int norm_type=0, "
    "float routed_scaling_factor=1.0, float eps=1e-20) -> Tensor"))
def npu_moe_gating_top_k_backward(x_norm, grad_y, expertIdx, *, renorm=0, norm_type=0, routed_scaling_factor=1.0,
                                  eps=1e-20):
    _check_gating_backward(x_norm, grad_y, expertIdx, renorm, norm_type)
    idx = expertIdx.long()
    g = x_norm.gather(-1, idx)
    total = g.sum(-1, keepdim=True) + eps
    gy = grad_y.float()
    # y_i = g_i / total * r: d/dg_i = r * (gy_i / total - sum_j gy_j g_j / total^2)
    dg = routed_scaling_factor * (gy / total - (gy * g).sum(-1, keepdim=True) / total ** 2)
    ds = torch.zeros_like(x_norm).scatter_add_(-1, idx, dg)
    return _norm_vjp(x_norm, ds, norm_type).to(grad_y.dtype)


@npu_moe_gating_top_k_backward.register_fake
def _(x_norm, grad_y, expertIdx, *, renorm=0, norm_type=0, routed_scaling_factor=1.0, eps=1e-20):
    _check_gating_backward(x_norm, grad_y, expertIdx, renorm, norm_type)
    return x_norm.new_empty(x_norm.shape, dtype=grad_y.dtype)


def _gating_setup(ctx, inputs, output):
    _, idx, norm = output
    ctx.save_for_backward(norm, idx)
    ctx.dtype = inputs[0].dtype
    ctx.kw = {"norm_type": inputs[9], "routed_scaling_factor": inputs[10], "eps": inputs[11]}


def _gating_backward(ctx, grad_y, _grad_idx, grad_norm):
    norm, idx = ctx.saved_tensors
    if grad_y is None:
        grad_y = norm.new_zeros(idx.shape)
    dx = torch.ops.npu.npu_moe_gating_top_k_backward(norm, grad_y, idx, **ctx.kw)
    if grad_norm is not None:  # norm_out used downstream: its own path to x
        dx = dx + _norm_vjp(norm, grad_norm.float(), ctx.kw["norm_type"]).to(dx.dtype)
    return (dx.to(ctx.dtype),) + (None,) * 11


register_autograd("npu::_moe_gating_top_k", _gating_backward, setup_context=_gating_setup)


def npu_moe_gating_top_k(x, k, *, bias=None, input_ids=None, tid2eid=None, k_group=1, group_count=1,
                         group_select_mode=0, renorm=0, norm_type=0, out_flag=False, routed_scaling_factor=1.0,
                         eps=1e-20):
    return torch.ops.npu._moe_gating_top_k(x, bias, input_ids, tid2eid, k, k_group, group_count, group_select_mode,
                                           renorm, norm_type, routed_scaling_factor, eps)


_lib = torch.library.Library("npu", "FRAGMENT")
for _name, _schema, _fn in (
        ("npu_moe_gating_top_k_softmax_v2", "(Tensor x, *, int k=1, Tensor? finished=None, int? renorm=0, "
         "bool? output_softmax=False) -> (Tensor, Tensor, Tensor)", npu_moe_gating_top_k_softmax_v2),
        ("npu_moe_gating_top_k", "(Tensor x, int k, *, Tensor? bias=None, Tensor? input_ids=None, "
         "Tensor? tid2eid=None, int k_group=1, int group_count=1, int group_select_mode=0, int renorm=0, "
         "int norm_type=0, bool out_flag=False, float routed_scaling_factor=1.0, float eps=1e-20) "
         "-> (Tensor, Tensor, Tensor)", npu_moe_gating_top_k)):
    _lib.define(_name + _schema)
    # Composite: autograd and tracing see the positional kernel it decomposes into.
    _lib.impl(_name, _fn, "CompositeImplicitAutograd")
