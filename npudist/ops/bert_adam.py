"""``npu_bert_apply_adam``: one step of BERT's Adam (pytorch-pretrained-BERT's ``BertAdam``, no bias correction),
updating ``var``, ``m`` and ``v`` in place. Ascend's call form::

    torch_npu.npu_bert_apply_adam(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm,
                                  weight_decay, step_size=None, adam_mode=0, out=(var, m, v))

Math (adam_mode 0, "adam")::

    g = grad * max_grad_norm / global_grad_norm   if 0 < max_grad_norm < global_grad_norm   (gradient clipping
        by the norm the caller computed over all parameters), else grad
    m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
    var -= lr * (m / (sqrt(v) + epsilon) + weight_decay * var)

adam_mode 1 ("mbert_adam") and ``step_size`` have no documented formula: they raise ``ValueError``.
"""
from __future__ import annotations

import torch
from torch.library import custom_op

_OP = "npu_bert_apply_adam"


def _check(grad, var, m, v, step_size, adam_mode):
    for name, t in (("var", var), ("m", m), ("v", v)):
        if t.shape != grad.shape or t.dtype != grad.dtype:
            raise ValueError(f"{_OP}: {name} must have grad's shape {tuple(grad.shape)} and dtype {grad.dtype}, got "
                             f"{t.dtype} {tuple(t.shape)}")
    if adam_mode != 0:
        raise ValueError(f"{_OP}: adam_mode {adam_mode} ('mbert_adam') has no documented formula and is not "
                         "provided; use adam_mode=0")
    if step_size is not None:
        raise ValueError(f"{_OP}: step_size has no documented role and is not provided; pass None (lr is the step)")


@custom_op("npu::_bert_apply_adam_", mutates_args=("var", "m", "v"), device_types="npu", schema=(
    "(Scalar lr, Scalar beta1, Scalar beta2, Scalar epsilon, Tensor grad, Scalar max_grad_norm, "
    "Scalar global_grad_norm, Scalar weight_decay, Scalar? step_size, int adam_mode, Tensor(a!) var, "
    "Tensor(b!) m, Tensor(c!) v) -> ()"))
def _bert_apply_adam_(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay, step_size,
                      adam_mode, var, m, v):
    _check(grad, var, m, v, step_size, adam_mode)
    g = grad
    if 0 < max_grad_norm < global_grad_norm:
        g = grad * (max_grad_norm / global_grad_norm)
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    update = m / (v.sqrt() + epsilon)
    if weight_decay:
        update = update + weight_decay * var
    var.sub_(update * lr)


@_bert_apply_adam_.register_fake
def _(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay, step_size, adam_mode, var, m, v):
    _check(grad, var, m, v, step_size, adam_mode)


def bert_apply_adam(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay, step_size=None,
                    adam_mode=0, *, out=None):
    """``torch_npu.npu_bert_apply_adam(..., out=(var, m, v))`` -> ``(var, m, v)`` (updated in place)."""
    if out is None or len(out) != 3:
        raise ValueError(f"{_OP}: pass the state to update as out=(var, m, v)")
    var, m, v = out
    torch.ops.npu._bert_apply_adam_(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay,
                                    step_size, adam_mode, var, m, v)
    return var, m, v


def _bert_apply_adam_out(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay,
                         step_size=None, adam_mode=0, *, var, m, v):
    torch.ops.npu._bert_apply_adam_(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay,
                                    step_size, adam_mode, var, m, v)
    return var, m, v


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_bert_apply_adam.out(Scalar lr, Scalar beta1, Scalar beta2, Scalar epsilon, Tensor grad, "
            "Scalar max_grad_norm, Scalar global_grad_norm, Scalar weight_decay, Scalar? step_size=None, "
            "int adam_mode=0, *, Tensor(a!) var, Tensor(b!) m, Tensor(c!) v) -> (Tensor(a!), Tensor(b!), Tensor(c!))")
_lib.impl("npu_bert_apply_adam.out", _bert_apply_adam_out, "CompositeImplicitAutograd")
