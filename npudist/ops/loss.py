"""``npu::npu_cross_entropy_loss``: log_softmax and nll_loss fused (torch's CrossEntropyLoss, documented as the
same), with class weights, ``ignore_index`` and label smoothing in torch's convention::

    log_prob = log_softmax(input)                       (returned, input's dtype)
    nll_i    = -w[t_i] * log_prob[i, t_i]; smooth_i = -sum_c w_c * log_prob[i, c]   (0 where t_i is ignored)
    loss     = (1 - eps) * R(nll) + eps / C * R'(smooth)

R is the reduction: "none" per row, "sum", or "mean" = sum / sum of w[t_i] over the kept rows (the number of kept
rows without weights), for both terms, as torch computes it. ``loss`` has shape [N] for "none", [1] otherwise.
The z-loss (``lse_square_scale_for_zloss``, ``return_zloss``) is documented as not enabled on Ascend: non-default
values raise, and ``zloss``/``lse_for_zloss`` are empty tensors. Only ``loss`` carries a gradient.
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

_REDUCTIONS = ("mean", "sum", "none")


def _check(x, target, weight, reduction, label_smoothing, zscale, return_zloss):
    op = "npu_cross_entropy_loss"
    if x.dim() != 2 or target.shape != (x.shape[0],):
        raise ValueError(f"{op}: input must be (N, C) and target (N,), got {tuple(x.shape)} and {tuple(target.shape)}")
    if weight is not None and tuple(weight.shape) != (x.shape[1],):
        raise ValueError(f"{op}: weight must be ({x.shape[1]},), got {tuple(weight.shape)}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1), got {label_smoothing}")
    if zscale != 0.0 or return_zloss:
        raise ValueError(f"{op}: the z-loss (lse_square_scale_for_zloss, return_zloss) is not enabled (Ascend "
                         f"documents it as not supported yet)")


def _parts(x, target, weight, ignore_index):
    """float log_prob, per-row weight of the target (0 if ignored), the class weights, and the kept mask."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    lp = torch.log_softmax(x.to(acc), dim=-1)
    keep = target != ignore_index
    t = torch.where(keep, target, 0)
    w = weight.to(acc) if weight is not None else None
    wt = w.gather(0, t) * keep if w is not None else keep.to(acc)
    return lp, wt, w, keep, t


def _denominator(wt, reduction):
    return wt.sum() if reduction == "mean" else 1.0


@custom_op("npu::npu_cross_entropy_loss", mutates_args=(), device_types="npu", schema=(
    "(Tensor input, Tensor target, Tensor? weight=None, str reduction='mean', int ignore_index=-100, "
    "float label_smoothing=0.0, float lse_square_scale_for_zloss=0.0, bool return_zloss=False) "
    "-> (Tensor, Tensor, Tensor, Tensor)"))
def npu_cross_entropy_loss(x, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0,
                           lse_square_scale_for_zloss=0.0, return_zloss=False):
    _check(x, target, weight, reduction, label_smoothing, lse_square_scale_for_zloss, return_zloss)
    lp, wt, w, keep, t = _parts(x, target, weight, ignore_index)
    nll = -lp.gather(1, t.unsqueeze(1)).squeeze(1) * wt
    eps, c = label_smoothing, x.shape[1]
    if eps:  # the smoothing term reads all of log_prob once more: only when it counts
        smooth = -(lp @ w if weight is not None else lp.sum(1)) * keep
        nll = (1 - eps) * nll + eps / c * smooth
    loss = nll if reduction == "none" else (nll.sum() / _denominator(wt, reduction)).reshape(1)
    empty = x.new_empty(0)
    return loss.to(x.dtype), lp.to(x.dtype), empty, empty.clone()


@npu_cross_entropy_loss.register_fake
def _(x, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0,
      lse_square_scale_for_zloss=0.0, return_zloss=False):
    _check(x, target, weight, reduction, label_smoothing, lse_square_scale_for_zloss, return_zloss)
    loss = x.new_empty(x.shape[0] if reduction == "none" else 1)
    return loss, torch.empty_like(x), x.new_empty(0), x.new_empty(0)


@custom_op("npu::npu_cross_entropy_loss_backward", mutates_args=(), device_types="npu", schema=(
    "(Tensor grad_loss, Tensor log_prob, Tensor target, Tensor? weight=None, str reduction='mean', "
    "int ignore_index=-100, float label_smoothing=0.0) -> Tensor"))
def npu_cross_entropy_loss_backward(grad_loss, log_prob, target, weight=None, reduction="mean", ignore_index=-100,
                                    label_smoothing=0.0):
    acc = torch.float64 if log_prob.dtype == torch.float64 else torch.float32
    p = log_prob.to(acc).exp()
    keep = target != ignore_index
    t = torch.where(keep, target, 0)
    n, c = log_prob.shape
    w = weight.to(acc) if weight is not None else torch.ones(c, dtype=acc, device=p.device)
    wt = w.gather(0, t) * keep
    d = _denominator(wt, reduction)
    onehot = torch.zeros_like(p).scatter_(1, t.unsqueeze(1), 1.0)
    eps = label_smoothing
    # d nll_i = w_t (p_i - e_t); d smooth_i = p_i * sum(w) - w
    g = ((1 - eps) * wt.unsqueeze(1) * (p - onehot) + eps / c * keep.unsqueeze(1) * (p * w.sum() - w)) / d
    scale = grad_loss.to(acc).reshape(-1, 1) if reduction == "none" else grad_loss.to(acc).reshape(1, 1)
    return (g * scale).to(log_prob.dtype)


@npu_cross_entropy_loss_backward.register_fake
def _(grad_loss, log_prob, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    return torch.empty_like(log_prob)


def _setup(ctx, inputs, output):
    _, target, weight, reduction, ignore_index, label_smoothing, _, _ = inputs
    ctx.save_for_backward(output[1], target, weight)
    ctx.cfg = (reduction, ignore_index, label_smoothing)


def _backward(ctx, grad_loss, _g_log_prob, _g_zloss, _g_lse):
    log_prob, target, weight = ctx.saved_tensors
    dx = torch.ops.npu.npu_cross_entropy_loss_backward(grad_loss, log_prob, target, weight, *ctx.cfg)
    return dx, None, None, None, None, None, None, None


register_autograd("npu::npu_cross_entropy_loss", _backward, setup_context=_setup)
