"""The torch_npu fused optimizers whose algorithm PyTorch has no optimizer for: AdamP, BERT's Adam, LAMB and
TensorFlow-style RMSprop, with torch_npu 2.14.0's names, signatures, defaults and update math.

On Ascend every parameter of a group (per dtype) lives in one flat buffer so that one kernel updates them all;
where the math is per parameter (AdamP's projection, LAMB's trust ratio) it is per parameter there too, and where
it spans the flat buffer (BertAdam's gradient clipping) it spans the group's parameters of one dtype here."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.optim.optimizer import required

__all__ = ["NpuFusedAdamP", "NpuFusedBertAdam", "NpuFusedLamb", "NpuFusedRMSpropTF"]


def _check(name, lr=None, eps=None, betas=None, **nonneg):
    if lr is not None and lr is not required and lr < 0.0:
        raise ValueError(f"{name}: invalid learning rate {lr} (must be >= 0)")
    if eps is not None and eps < 0.0:
        raise ValueError(f"{name}: invalid epsilon {eps} (must be >= 0)")
    for i, beta in enumerate(betas or ()):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"{name}: invalid beta parameter at index {i}: {beta} (must be in [0, 1))")
    for key, value in nonneg.items():
        if value < 0.0:
            raise ValueError(f"{name}: invalid {key} {value} (must be >= 0)")


def _with_grads(group):
    for p in group["params"]:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise RuntimeError("torch_npu fused optimizers do not support sparse gradients")
        yield p


def _moments(state, p, grad, beta1, beta2):
    """Adam's moving averages of the gradient and its square, made at the first step ("step" counts from 0)."""
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    return exp_avg, exp_avg_sq


class _Optimizer(torch.optim.Optimizer):
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._prepare()
        for group in self.param_groups:
            self._group_step(group)
        return loss

    def _prepare(self):
        pass


class NpuFusedAdamP(_Optimizer):
    """AdamP (Heo et al., 2021): Adam whose update of a weight of 2 or more dims loses its radial component when
    the gradient is nearly orthogonal to the weight (cosine similarity, per output channel or over the whole
    layer, below ``delta / sqrt(view size)``); such a weight's decoupled weight decay is scaled by ``wd_ratio``.
    ``p *= 1 - lr * weight_decay * ratio``, then ``p -= lr / (1 - beta1^t) * perturb``."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, delta=0.1, wd_ratio=0.1,
                 nesterov=False):
        _check("NpuFusedAdamP", lr, eps, betas, weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, delta=delta,
                                      wd_ratio=wd_ratio, nesterov=nesterov))

    @staticmethod
    def _projection(p, grad, perturb, delta, wd_ratio, eps):
        expand = [-1] + [1] * (p.dim() - 1)
        for view in (lambda x: x.reshape(x.size(0), -1), lambda x: x.reshape(1, -1)):
            cosine = F.cosine_similarity(view(grad), view(p), dim=1, eps=eps).abs()
            if cosine.max() < delta / math.sqrt(view(p).size(1)):
                p_n = p / view(p).norm(dim=1).view(expand).add(eps)
                return perturb - p_n * view(p_n * perturb).sum(dim=1).view(expand), wd_ratio
        return perturb, 1.0

    def _group_step(self, group):
        beta1, beta2 = group["betas"]
        for p in _with_grads(group):
            grad, state = p.grad, self.state[p]
            exp_avg, exp_avg_sq = _moments(state, p, grad, beta1, beta2)
            state["step"] += 1
            denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** state["step"])).add_(group["eps"])
            if group["nesterov"]:
                perturb = (beta1 * exp_avg + (1 - beta1) * grad) / denom
            else:
                perturb = exp_avg / denom
            ratio = 1.0
            if p.dim() > 1:
                perturb, ratio = self._projection(p, grad, perturb, group["delta"], group["wd_ratio"], group["eps"])
            if group["weight_decay"] > 0:
                p.mul_(1 - group["lr"] * group["weight_decay"] * ratio)
            p.add_(perturb, alpha=-group["lr"] / (1 - beta1 ** state["step"]))


def _warmup_cosine(x, warmup):
    return x / warmup if x < warmup else 0.5 * (1.0 + math.cos(math.pi * x))


def _warmup_constant(x, warmup):
    return x / warmup if x < warmup else 1.0


def _warmup_linear(x, warmup):
    return x / warmup if x < warmup else max((x - 1.0) / (warmup - 1.0), 0.0)


def _warmup_poly(x, warmup, degree=0.5):
    return x / warmup if x < warmup else (1.0 - x) ** degree


SCHEDULES = {"warmup_cosine": _warmup_cosine, "warmup_constant": _warmup_constant,
             "warmup_linear": _warmup_linear, "warmup_poly": _warmup_poly}


class NpuFusedBertAdam(_Optimizer):
    """BERT's Adam (pytorch-pretrained-bert's ``BertAdam``): no bias correction, weight decay added to the update,
    the learning rate scaled by ``schedule(step / t_total, warmup)`` when ``t_total != -1``, and the gradients of
    each group (per dtype) clipped together to ``max_grad_norm`` first (``-1``: no clipping).
    ``p -= lr_t * (m / (sqrt(v) + e) + weight_decay * p)``."""

    def __init__(self, params, lr=required, warmup=-1, t_total=-1, schedule="warmup_linear", b1=0.9, b2=0.999,
                 e=1e-6, weight_decay=0.01, max_grad_norm=1.0):
        if lr is required:
            raise ValueError("NpuFusedBertAdam: lr is required")
        _check("NpuFusedBertAdam", lr, e, (b1, b2))
        if (warmup < 0.0 and warmup != -1) or warmup >= 1.0:
            raise ValueError(f"NpuFusedBertAdam: invalid warmup {warmup} (a fraction in [0, 1), or -1 for none)")
        if schedule not in SCHEDULES:
            raise ValueError(f"NpuFusedBertAdam: invalid schedule {schedule!r}, one of {sorted(SCHEDULES)}")
        self.max_grad_norm = max_grad_norm
        super().__init__(params, dict(lr=lr, schedule=schedule, warmup=warmup, t_total=t_total, b1=b1, b2=b2, e=e,
                                      weight_decay=weight_decay, max_grad_norm=max_grad_norm))

    def _group_step(self, group):
        params = list(_with_grads(group))
        if self.max_grad_norm > 0:
            for dtype in {p.dtype for p in params}:
                grads = [p.grad for p in params if p.dtype == dtype]
                total = torch.stack([g.float().pow(2).sum() for g in grads]).sum().sqrt()
                coef = self.max_grad_norm / (total + 1e-6)
                if coef < 1.0:
                    torch._foreach_mul_(grads, coef.item())
        for p in params:
            state = self.state[p]
            exp_avg, exp_avg_sq = _moments(state, p, p.grad, group["b1"], group["b2"])
            update = exp_avg / (exp_avg_sq.sqrt() + group["e"])
            if group["weight_decay"] > 0.0:
                update += group["weight_decay"] * p
            lr = group["lr"]
            if group["t_total"] != -1:
                lr *= SCHEDULES[group["schedule"]](state["step"] / group["t_total"], group["warmup"])
            p.add_(update, alpha=-lr)
            state["step"] += 1


class NpuFusedLamb(_Optimizer):
    """LAMB (You et al., 2020) as torch_npu computes it: no bias correction, ``u = m / (sqrt(v) + eps) +
    weight_decay * p``, ``p -= lr * trust * u`` with ``trust = min(||p||, 10) / ||u||`` per parameter (1 when
    either norm is 0, always 1 with ``adam=True``); with ``use_global_grad_norm`` the gradients are divided by
    their global norm when it exceeds 1."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0, adam=False,
                 use_global_grad_norm=False):
        _check("NpuFusedLamb", lr, eps, betas)
        self.adam = adam
        self.use_global_grad_norm = use_global_grad_norm
        self.global_grad_norm = 1.0
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _prepare(self):
        if self.use_global_grad_norm:
            grads = [p.grad for group in self.param_groups for p in _with_grads(group)]
            self.global_grad_norm = (torch.stack([g.float().pow(2).sum() for g in grads]).sum().sqrt().item()
                                     if grads else 1.0)

    def _group_step(self, group):
        beta1, beta2 = group["betas"]
        for p in _with_grads(group):
            grad, state = p.grad, self.state[p]
            if self.global_grad_norm > 1:
                grad = grad / self.global_grad_norm
            exp_avg, exp_avg_sq = _moments(state, p, grad, beta1, beta2)
            state["step"] += 1
            adam_step = exp_avg / exp_avg_sq.sqrt().add(group["eps"])
            if group["weight_decay"] != 0:
                adam_step.add_(p, alpha=group["weight_decay"])
            trust = 1.0
            if not self.adam:
                weight_norm = p.float().pow(2).sum().sqrt().clamp(0, 10)
                adam_norm = adam_step.float().pow(2).sum().sqrt()
                if weight_norm != 0 and adam_norm != 0:
                    trust = (weight_norm / adam_norm).item()
            p.add_(adam_step, alpha=-group["lr"] * trust)


class NpuFusedRMSpropTF(_Optimizer):
    """TensorFlow's RMSprop (timm's RMSpropTF): the square average starts at 1 and is updated as
    ``s += (1 - alpha) * (g^2 - s)``, eps inside the root (``sqrt(s + eps)``; centered: ``sqrt(s - a^2 + eps)``),
    and with momentum the learning rate is accumulated in the buffer (``lr_in_momentum``). Weight decay adds
    ``weight_decay * p`` to the gradient, or with ``decoupled_decay`` scales the parameter by
    ``1 - weight_decay`` (torch_npu's decoupled form: no learning rate in it)."""

    def __init__(self, params, lr=1e-2, alpha=0.9, eps=1e-10, weight_decay=0, momentum=0., centered=False,
                 decoupled_decay=False, lr_in_momentum=True):
        _check("NpuFusedRMSpropTF", lr, eps, momentum=momentum, weight_decay=weight_decay, alpha=alpha)
        super().__init__(params, dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                                      weight_decay=weight_decay, decoupled_decay=decoupled_decay,
                                      lr_in_momentum=lr_in_momentum))

    def _group_step(self, group):
        for p in _with_grads(group):
            grad, state = p.grad, self.state[p]
            if not state:
                state["step"] = 0
                state["square_avg"] = torch.ones_like(p)
                if group["momentum"] > 0:
                    state["momentum_buffer"] = torch.zeros_like(p)
                if group["centered"]:
                    state["grad_avg"] = torch.zeros_like(p)
            state["step"] += 1
            if group["weight_decay"] != 0:
                if group["decoupled_decay"]:
                    p.mul_(1 - group["weight_decay"])
                else:
                    grad = grad.add(p, alpha=group["weight_decay"])
            square_avg = state["square_avg"]
            square_avg.add_(grad.pow(2) - square_avg, alpha=1 - group["alpha"])
            if group["centered"]:
                grad_avg = state["grad_avg"]
                grad_avg.add_(grad - grad_avg, alpha=1 - group["alpha"])
                avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).add_(group["eps"]).sqrt_()
            else:
                avg = square_avg.add(group["eps"]).sqrt_()
            if group["momentum"] > 0:
                buf = state["momentum_buffer"]
                if group["lr_in_momentum"]:
                    buf.mul_(group["momentum"]).addcdiv_(grad, avg, value=group["lr"])
                    p.sub_(buf)
                else:
                    buf.mul_(group["momentum"]).addcdiv_(grad, avg)
                    p.add_(buf, alpha=-group["lr"])
            else:
                p.addcdiv_(grad, avg, value=-group["lr"])
