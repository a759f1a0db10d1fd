"""The vocabulary-parallel cross entropy's loss / softmax step and the linear + cross entropy backward, against
Megatron's formulas written out here (loss = log(sum exp) - predicted, softmax = exp(l - max) / sum) and
against autograd of torch's own cross entropy of input @ weight.T on one shard covering the whole vocabulary."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, ops


def _pack(outside):  # MSB-first bytes, the last padded with 1s
    bits = outside.tolist() + [True] * (-len(outside) % 8)
    return torch.tensor([sum(int(b) << (7 - j) for j, b in enumerate(bits[i:i + 8])) for i in range(0, len(bits), 8)],
                        dtype=torch.uint8)


def test_loss_and_softmax_from_max_sum():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, generator=g)
    target = torch.randint(0, 7, (5,), generator=g)
    mx = logits.max(-1).values
    sum_exp = torch.tensor([sum(math.exp(v - m) for v in row) for row, m in zip(logits.tolist(), mx.tolist())])
    predicted = torch.tensor([logits[i, target[i]].item() - mx[i].item() for i in range(5)])
    loss, softmax = torch_npu.npu_fused_cross_entropy_loss_with_max_sum(
        mx.to(NPU), sum_exp.to(NPU), predicted.to(NPU), vocab_parallel_logits=logits.half().to(NPU))
    torch.testing.assert_close(loss.cpu(), torch.nn.functional.cross_entropy(logits, target, reduction="none"))
    want = [[math.exp(v - m) / s for v in row] for row, m, s in zip(logits.half().float().tolist(), mx.tolist(),
                                                                     sum_exp.tolist())]
    assert softmax.dtype == torch.float32
    torch.testing.assert_close(softmax.cpu(), torch.tensor(want))
    loss2, none = torch_npu.npu_fused_cross_entropy_loss_with_max_sum(mx.to(NPU), sum_exp.to(NPU), predicted.to(NPU))
    assert none is None
    torch.testing.assert_close(loss2.cpu(), loss.cpu())
    with pytest.raises(ValueError, match=r"npu_fused_cross_entropy_loss_with_max_sum: label_smoothing"):
        torch_npu.npu_fused_cross_entropy_loss_with_max_sum(mx.to(NPU), sum_exp.to(NPU), predicted.to(NPU),
                                                            label_smoothing=0.1)


@pytest.mark.parametrize("mode", ["softmax", "max_sum"])
def test_linear_cross_entropy_backward(mode):
    g = torch.Generator().manual_seed(1)
    n, h, v, start = 9, 6, 8, 4  # this shard holds vocabulary [4, 12) of a larger one
    x, w = torch.randn(n, h, generator=g, dtype=torch.float64), torch.randn(v, h, generator=g, dtype=torch.float64)
    target = torch.randint(0, 16, (n,), generator=g)
    grad = torch.rand(n, generator=g, dtype=torch.float64)
    outside = (target < start) | (target >= start + v)
    masked = torch.where(outside, 0, target - start)
    logits = x @ w.t()
    mx, sum_exp = logits.max(-1).values, (logits - logits.max(-1, keepdim=True).values).exp().sum(-1)
    softmax = (logits - mx[:, None]).exp() / sum_exp[:, None]
    kw = dict(softmax=softmax.to(NPU)) if mode == "softmax" else dict(logits_max=mx.to(NPU),
                                                                       sum_exp_logits=sum_exp.to(NPU))
    gx, gw = torch_npu.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(
        grad.to(NPU), x.to(NPU), w.to(NPU), _pack(outside).to(NPU), masked.to(NPU), **kw)
    # reference: the gradient of sum_i grad_i * (log(sum exp l_i) - l_i[target] * inside_i) by autograd
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    lr = xr @ wr.t()
    picked = lr.gather(1, masked[:, None]).squeeze(1) * (~outside)
    (grad * (torch.logsumexp(lr, -1) - picked)).sum().backward()
    torch.testing.assert_close(gx.cpu(), xr.grad)
    torch.testing.assert_close(gw.cpu(), wr.grad)


def test_backward_rejects_bad_arguments():
    x, w = torch.randn(4, 3).to(NPU), torch.randn(5, 3).to(NPU)
    args = (torch.ones(4).to(NPU), x, w, torch.zeros(1, dtype=torch.uint8).to(NPU),
            torch.zeros(4, dtype=torch.int64).to(NPU))
    with pytest.raises(ValueError, match="backward: without softmax, logits_max and sum_exp_logits"):
        torch_npu.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(*args)
    with pytest.raises(ValueError, match="backward: target_mask must be uint8"):
        torch_npu.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(
            *args[:3], torch.zeros(2, dtype=torch.uint8).to(NPU), args[4], softmax=torch.ones(4, 5).to(NPU))


def test_ce_max_sum_compile_and_online_max_sum_chain():
    def fn(x, w, target):
        mx, s, pred, tmask, mtarget, logits = ops.npu_fused_linear_online_max_sum(x, w, target, 0, w.shape[0],
                                                                                   return_logits=True)
        loss, softmax = ops.npu_fused_cross_entropy_loss_with_max_sum(mx, s, pred, vocab_parallel_logits=logits)
        gx, gw = ops.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(torch.ones_like(loss), x, w, tmask,
                                                                               mtarget, softmax=softmax)
        return loss, gx, gw

    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(6, 4, generator=g), torch.randn(10, 4, generator=g)
    target = torch.randint(0, 10, (6,), generator=g)
    args = [x.to(NPU), w.to(NPU), target.to(NPU)]
    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
    # one shard holding the whole vocabulary: torch's cross entropy and its gradients
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(xr @ wr.t(), target, reduction="none")
    ref.sum().backward()
    torch.testing.assert_close(eager[0].cpu(), ref.detach())
    torch.testing.assert_close(eager[1].cpu(), xr.grad)
    torch.testing.assert_close(eager[2].cpu(), wr.grad)
