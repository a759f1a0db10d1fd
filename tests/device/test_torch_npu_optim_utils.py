"""torch_npu.optim's AdamP, BertAdam, LAMB and RMSpropTF on npu parameters against references written from the
algorithms' definitions (float64 on cpu, one parameter at a time); torch_npu.utils.save_async."""
import math

import pytest
import torch

from torch_npu.optim import NpuFusedAdamP, NpuFusedBertAdam, NpuFusedLamb, NpuFusedRMSpropTF

STEPS = 4


def _problem(seed=0):
    """Parameters (a matrix, a vector, a 3-D weight) and per-step gradients; the matrix's gradients are orthogonal
    to its rows (AdamP's projection case)."""
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(5, 4, generator=g), torch.randn(5, generator=g), torch.randn(3, 2, 2, generator=g)]
    grads = []
    for _ in range(STEPS):
        step = [torch.randn(p.shape, generator=g) for p in params]
        w = params[0]
        step[0] = step[0] - (step[0] * w).sum(1, keepdim=True) / (w * w).sum(1, keepdim=True) * w
        grads.append(step)
    return params, grads


def _run(opt_cls, kwargs, params, grads):
    ps = [p.clone().to("npu").requires_grad_(True) for p in params]
    opt = opt_cls(ps, **kwargs)
    for step in grads:
        for p, gr in zip(ps, step):
            p.grad = gr.to("npu")
        opt.step()
    return [p.detach().cpu() for p in ps]


def _close(got, want):
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.float(), rtol=2e-5, atol=2e-6)


def _adamp_reference(params, grads, lr, betas, eps, wd, delta, wd_ratio):
    ps = [p.double().clone() for p in params]
    m = [torch.zeros_like(p) for p in ps]
    v = [torch.zeros_like(p) for p in ps]
    for t, step in enumerate(grads, 1):
        for i, (p, g) in enumerate(zip(ps, step)):
            g = g.double()
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            d = v[i].sqrt() / math.sqrt(1 - betas[1] ** t) + eps
            u = m[i] / d
            ratio = 1.0
            if p.dim() > 1:
                for rows in (p.shape[0], 1):              # per output channel, then the whole layer
                    pv, gv, uv = p.reshape(rows, -1), g.reshape(rows, -1), u.reshape(rows, -1)
                    cos = [abs(float((pv[r] @ gv[r]) / max(pv[r].norm() * gv[r].norm(), eps))) for r in range(rows)]
                    if max(cos) < delta / math.sqrt(pv.shape[1]):
                        unit = [pv[r] / (pv[r].norm() + eps) for r in range(rows)]
                        u = torch.stack([uv[r] - unit[r] * (unit[r] @ uv[r]) for r in range(rows)]).reshape(p.shape)
                        ratio = wd_ratio
                        break
            p.mul_(1 - lr * wd * ratio)
            p.sub_(lr / (1 - betas[0] ** t) * u)
    return ps


def test_adamp():
    params, grads = _problem()
    kw = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, delta=0.1, wd_ratio=0.1)
    _close(_run(NpuFusedAdamP, kw, params, grads), _adamp_reference(params, grads, 0.01, (0.9, 0.99), 1e-8, 0.1,
                                                                    0.1, 0.1))


@pytest.mark.parametrize("t_total,schedule", [(-1, "warmup_linear"), (10, "warmup_cosine"), (10, "warmup_linear")])
def test_bert_adam(t_total, schedule):
    params, grads = _problem(1)
    kw = dict(lr=0.05, warmup=0.2, t_total=t_total, schedule=schedule, weight_decay=0.01, max_grad_norm=1.0)
    got = _run(NpuFusedBertAdam, kw, params, grads)
    ps = [p.double().clone() for p in params]
    m = [torch.zeros_like(p) for p in ps]
    v = [torch.zeros_like(p) for p in ps]
    for t, step in enumerate(grads):
        step = [g.double() for g in step]
        norm = math.sqrt(sum(float((g * g).sum()) for g in step))    # one group, one dtype: clipped together
        if 1.0 / (norm + 1e-6) < 1:
            step = [g * (1.0 / (norm + 1e-6)) for g in step]
        x = t / t_total
        if t_total == -1:
            factor = 1.0
        elif x < 0.2:
            factor = x / 0.2
        elif schedule == "warmup_cosine":
            factor = 0.5 * (1 + math.cos(math.pi * x))
        else:
            factor = max((x - 1) / (0.2 - 1), 0.0)
        for i, (p, g) in enumerate(zip(ps, step)):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            p.sub_(0.05 * factor * (m[i] / (v[i].sqrt() + 1e-6) + 0.01 * p))
    _close(got, ps)
    with pytest.raises(ValueError, match="lr is required"):
        NpuFusedBertAdam([torch.zeros(2, device="npu")])


@pytest.mark.parametrize("adam,global_norm", [(False, False), (True, False), (False, True)])
def test_lamb(adam, global_norm):
    params, grads = _problem(2)
    grads = [[g * 3 for g in step] for step in grads]                 # global norm above 1
    kw = dict(lr=0.02, weight_decay=0.01, adam=adam, use_global_grad_norm=global_norm)
    got = _run(NpuFusedLamb, kw, params, grads)
    ps = [p.double().clone() for p in params]
    m = [torch.zeros_like(p) for p in ps]
    v = [torch.zeros_like(p) for p in ps]
    for step in grads:
        step = [g.double() for g in step]
        if global_norm:
            norm = math.sqrt(sum(float((g * g).sum()) for g in step))
            step = [g / norm for g in step] if norm > 1 else step
        for i, (p, g) in enumerate(zip(ps, step)):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            u = m[i] / (v[i].sqrt() + 1e-6) + 0.01 * p
            wn, un = min(float(p.norm()), 10.0), float(u.norm())
            trust = 1.0 if adam or wn == 0 or un == 0 else wn / un
            p.sub_(0.02 * trust * u)
    _close(got, ps)


@pytest.mark.parametrize("momentum,centered,decoupled,lr_in_momentum", [
    (0.0, False, False, True), (0.9, False, False, True), (0.9, True, False, False), (0.0, True, True, True)])
def test_rmsprop_tf(momentum, centered, decoupled, lr_in_momentum):
    params, grads = _problem(3)
    kw = dict(lr=0.01, alpha=0.9, eps=1e-3, weight_decay=0.05, momentum=momentum, centered=centered,
              decoupled_decay=decoupled, lr_in_momentum=lr_in_momentum)
    got = _run(NpuFusedRMSpropTF, kw, params, grads)
    ps = [p.double().clone() for p in params]
    sq = [torch.ones_like(p) for p in ps]                              # TensorFlow starts the average at 1
    ga = [torch.zeros_like(p) for p in ps]
    buf = [torch.zeros_like(p) for p in ps]
    for step in grads:
        for i, (p, g) in enumerate(zip(ps, step)):
            g = g.double()
            if decoupled:
                p.mul_(1 - 0.05)
            else:
                g = g + 0.05 * p
            sq[i] = sq[i] + 0.1 * (g * g - sq[i])
            if centered:
                ga[i] = ga[i] + 0.1 * (g - ga[i])
                avg = (sq[i] - ga[i] * ga[i] + 1e-3).sqrt()
            else:
                avg = (sq[i] + 1e-3).sqrt()
            if momentum > 0 and lr_in_momentum:
                buf[i] = momentum * buf[i] + 0.01 * g / avg
                p.sub_(buf[i])
            elif momentum > 0:
                buf[i] = momentum * buf[i] + g / avg
                p.sub_(0.01 * buf[i])
            else:
                p.sub_(0.01 * g / avg)
    _close(got, ps)


def test_save_async_writes_the_values_of_the_call(tmp_path):
    """torch_npu.utils.save_async: the file holds the tensors as they were at the call, although the caller
    updates them in place right after; nested containers and non-tensor values are kept."""
    import threading

    from torch_npu.utils import save_async

    w = torch.arange(6, dtype=torch.float32, device="npu").reshape(2, 3)
    state = {"model": {"w": w, "b": torch.ones(3, device="npu")}, "step": 7, "extra": [torch.zeros(2)]}
    path = tmp_path / "ckpt.pt"
    save_async(state, str(path))
    w.mul_(100)                                     # an optimizer step right after the call
    for t in threading.enumerate():
        if t.name == "torch_npu.save_async":
            t.join(60)
    loaded = torch.load(str(path))
    assert torch.equal(loaded["model"]["w"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert torch.equal(loaded["model"]["b"], torch.ones(3)) and loaded["step"] == 7
    assert loaded["model"]["w"].device.type == "cpu" and torch.equal(loaded["extra"][0], torch.zeros(2))
    with pytest.raises(RuntimeError, match="_use_new_zipfile_serialization=False"):
        save_async(state, str(path), _use_new_zipfile_serialization=False)
