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


# ---- npu_apply_adam: TensorFlow's ApplyAdam (Ascend's op of that name) ------------------------------------------
# beta1_power/beta2_power are beta ** t (the current step):
#   lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power)
#   m += (1 - beta1) * (grad - m);  v += (1 - beta2) * (grad^2 - v)
#   var -= lr_t * m / (sqrt(v) + epsilon)            (use_nesterov: lr_t * (beta1 * m + (1 - beta1) * grad) / ...)
# use_locking only orders concurrent updates on Ascend; the npu stream already does.
@custom_op("npu::_apply_adam_", mutates_args=("var", "m", "v"), device_types="npu", schema=(
    "(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar beta1, Scalar beta2, Scalar epsilon, Tensor grad, "
    "bool? use_locking, bool? use_nesterov, Tensor(a!) var, Tensor(b!) m, Tensor(c!) v) -> ()"))
def _apply_adam_(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking, use_nesterov, var, m, v):
    _check_adam(grad, var, m, v)
    lr_t = lr * (1 - beta2_power) ** 0.5 / (1 - beta1_power)
    m.add_(grad - m, alpha=1 - beta1)
    v.add_(grad * grad - v, alpha=1 - beta2)
    step = m * beta1 + grad * (1 - beta1) if use_nesterov else m
    var.sub_(lr_t * step / (v.sqrt() + epsilon))


def _check_adam(grad, var, m, v):
    for name, t in (("var", var), ("m", m), ("v", v)):
        if t.shape != grad.shape:
            raise ValueError(f"npu_apply_adam: {name} has shape {tuple(t.shape)}, grad {tuple(grad.shape)}")


@_apply_adam_.register_fake
def _(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking, use_nesterov, var, m, v):
    _check_adam(grad, var, m, v)


def apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking=False, use_nesterov=False, *,
               out=None):
    """``torch_npu.npu_apply_adam(..., out=(var, m, v))`` -> ``(var, m, v)`` (updated in place)."""
    if out is None or len(out) != 3:
        raise ValueError("npu_apply_adam: pass the state to update as out=(var, m, v)")
    var, m, v = out
    torch.ops.npu._apply_adam_(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking,
                               use_nesterov, var, m, v)
    return var, m, v


def _apply_adam_out(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking=None, use_nesterov=None, *,
                    var, m, v):
    torch.ops.npu._apply_adam_(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking,
                               use_nesterov, var, m, v)
    return var, m, v


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_apply_adam.out(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar beta1, Scalar beta2, "
            "Scalar epsilon, Tensor grad, bool? use_locking, bool? use_nesterov, *, Tensor(a!) var, Tensor(b!) m, "
            "Tensor(c!) v) -> (Tensor(a!), Tensor(b!), Tensor(c!))")
_lib.impl("npu_apply_adam.out", _apply_adam_out, "CompositeImplicitAutograd")
