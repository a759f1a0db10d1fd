"""``npu::npu_apply_adam_w``: one fused AdamW step, updating ``var``, ``m`` and ``v`` in place.

Ascend's call form (DeepSpeed's NPU FusedAdam)::

    torch_npu.npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, eps, grad,
                               max_grad_norm, amsgrad, maximize, out=(var, m, v))

``beta1_power``/``beta2_power`` are ``beta ** (step - 1)``: the op multiplies them by beta once more for the
bias corrections (Ascend's reference). Math, with ``g = -grad if maximize else grad``::

    var *= 1 - lr * weight_decay
    m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
    vhat = max(max_grad_norm, v) if amsgrad else v
    var -= lr * m / (1 - beta1_power * beta1) / (sqrt(vhat / (1 - beta2_power * beta2)) + eps)

``max_grad_norm`` (amsgrad's running maximum) is read, not updated, as Ascend's schema declares it.
"""
from __future__ import annotations

import torch
from torch.library import custom_op


def _check(grad, var, m, v, max_grad_norm, amsgrad):
    for name, t in (("var", var), ("m", m), ("v", v)):
        if t.shape != grad.shape:
            raise ValueError(f"npu_apply_adam_w: {name} has shape {tuple(t.shape)}, grad {tuple(grad.shape)}")
    if amsgrad and max_grad_norm is None:
        raise ValueError("npu_apply_adam_w: amsgrad=True needs max_grad_norm (the running max of v)")


@custom_op("npu::npu_apply_adam_w", mutates_args=("var", "m", "v"), device_types="npu", schema=(
    "(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar weight_decay, Scalar beta1, Scalar beta2, "
    "Scalar epsilon, Tensor grad, Tensor? max_grad_norm, bool? amsgrad, bool? maximize, Tensor(a!) var, "
    "Tensor(b!) m, Tensor(c!) v) -> ()"))
def npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad, max_grad_norm,
                     amsgrad, maximize, var, m, v):
    _check(grad, var, m, v, max_grad_norm, amsgrad)
    g = -grad if maximize else grad
    var.mul_(1 - lr * weight_decay)
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    vhat = torch.maximum(max_grad_norm, v) if amsgrad else v
    bc1 = 1 - beta1_power * beta1
    bc2 = 1 - beta2_power * beta2
    denom = (vhat / bc2).sqrt_().add_(epsilon)
    var.addcdiv_(m, denom, value=-lr / bc1)


@npu_apply_adam_w.register_fake
def _(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad, max_grad_norm, amsgrad, maximize,
      var, m, v):
    _check(grad, var, m, v, max_grad_norm, amsgrad)


def apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, eps, grad, max_grad_norm=None,
                 amsgrad=False, maximize=False, *, out=None):
    """``torch_npu.npu_apply_adam_w(..., out=(var, m, v))`` -> ``(var, m, v)`` (updated in place)."""
    if out is None or len(out) != 3:
        raise ValueError("npu_apply_adam_w: pass the state to update as out=(var, m, v)")
    var, m, v = out
    torch.ops.npu.npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, eps, grad,
                                   max_grad_norm, amsgrad, maximize, var=var, m=m, v=v)
    return var, m, v
