"""npu_fused_linear_online_max_sum (vocabulary-parallel cross entropy's local step) and npu_bert_apply_adam
against reference loops written from the documentation."""
import math

import pytest
import torch

import torch_npu
from tests.ops._common import NPU, ops


def _ref_online(x, w, target, start, end):
    rows = []
    for r in range(x.shape[0]):
        logits = [sum(float(x[r, c]) * float(w[v, c]) for c in range(x.shape[1])) for v in range(w.shape[0])]
        mx = max(logits)
        outside = not start <= int(target[r]) < end
        local = 0 if outside else int(target[r]) - start
        rows.append((mx, sum(math.exp(v - mx) for v in logits), 0.0 if outside else logits[local] - mx, outside,
                     local, logits))
    bits = [int(o[3]) for o in rows] + [1] * (-len(rows) % 8)
    packed = [int("".join(str(b) for b in bits[i:i + 8]), 2) for i in range(0, len(bits), 8)]
    return rows, packed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("return_logits", [True, False])
def test_fused_linear_online_max_sum(return_logits):
    torch.manual_seed(0)
    n, h, v, start = 11, 4, 6, 3
    x, w = torch.randn(n, h, dtype=torch.float64), torch.randn(v, h, dtype=torch.float64)
    target = torch.randint(0, 12, (n,), dtype=torch.int32)
    out = torch_npu.npu_fused_linear_online_max_sum(x.to(NPU), w.to(NPU), target.to(NPU), start, start + v,
                                                    return_logits=return_logits)
    rows, packed = _ref_online(x, w, target, start, start + v)
    mx, se, pred, mask, masked, logits = out
    assert mx.dtype == se.dtype == pred.dtype == torch.float32 and mask.dtype == torch.uint8
    torch.testing.assert_close(mx.cpu(), torch.tensor([r[0] for r in rows], dtype=torch.float32))
    torch.testing.assert_close(se.cpu(), torch.tensor([r[1] for r in rows], dtype=torch.float32))
    torch.testing.assert_close(pred.cpu(), torch.tensor([r[2] for r in rows], dtype=torch.float32))
    assert mask.cpu().tolist() == packed and len(packed) == 2
    assert masked.dtype == torch.int32 and masked.cpu().tolist() == [r[4] for r in rows]
    if return_logits:
        torch.testing.assert_close(logits.cpu(), torch.tensor([r[5] for r in rows], dtype=torch.float64))
    else:
        assert logits is None


@pytest.mark.timeout(120)
def test_online_max_sum_completes_the_vocab_parallel_loss():
    """Two vocabulary shards, combined as the callers do, give torch's cross entropy."""
    torch.manual_seed(1)
    x, w = torch.randn(5, 3), torch.randn(8, 3)
    target = torch.randint(0, 8, (5,))
    parts = [ops.npu_fused_linear_online_max_sum(x.to(NPU), w[s:s + 4].to(NPU), target.to(NPU), s, s + 4)
             for s in (0, 4)]
    gmax = torch.maximum(parts[0][0], parts[1][0])
    total = sum(p[1] * torch.exp(p[0] - gmax) for p in parts)
    # predicted_logits is relative to its shard's max and 0 off the shard
    t = target.to(NPU)
    predicted = sum(torch.where((t >= s) & (t < s + 4), p[2] + p[0], 0.0) for s, p in zip((0, 4), parts)) - gmax
    loss = torch.log(total) - predicted
    torch.testing.assert_close(loss.cpu(), torch.nn.functional.cross_entropy(x @ w.t(), target, reduction="none"),
                               rtol=1e-5, atol=1e-5)


def _ref_bert_adam(var, m, v, g, lr, b1, b2, eps, max_norm, global_norm, wd):
    var, m, v = var.tolist(), m.tolist(), v.tolist()
    scale = max_norm / global_norm if 0 < max_norm < global_norm else 1.0
    for i, gi in enumerate(g.tolist()):
        gi *= scale
        m[i] = b1 * m[i] + (1 - b1) * gi
        v[i] = b2 * v[i] + (1 - b2) * gi * gi
        var[i] -= lr * (m[i] / (math.sqrt(v[i]) + eps) + wd * var[i])
    return [torch.tensor(t, dtype=torch.float64) for t in (var, m, v)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("max_norm,global_norm,wd", [(-1.0, 0.0, 0.0), (1.0, 4.0, 0.01), (5.0, 2.0, 0.1)])
def test_bert_apply_adam_two_steps(max_norm, global_norm, wd):
    torch.manual_seed(2)
    var, m, v = (torch.randn(7, dtype=torch.float64), torch.rand(7, dtype=torch.float64),
                 torch.rand(7, dtype=torch.float64))
    state = [t.to(NPU) for t in (var, m, v)]
    ref = [var, m, v]
    for _ in range(2):
        g = torch.randn(7, dtype=torch.float64)
        out = torch_npu.npu_bert_apply_adam(0.05, 0.9, 0.99, 1e-6, g.to(NPU), max_norm, global_norm, wd,
                                            out=tuple(state))
        assert all(a is b for a, b in zip(out, state))  # updated in place
        ref = _ref_bert_adam(*ref, g, 0.05, 0.9, 0.99, 1e-6, max_norm, global_norm, wd)
    for a, b in zip(state, ref):
        torch.testing.assert_close(a.cpu(), b)
    # the aten-style .out overload
    var2, m2, v2 = (t.to(NPU) for t in (var, m, v))
    ops.npu_bert_apply_adam.out(0.05, 0.9, 0.99, 1e-6, torch.ones(7, dtype=torch.float64, device=NPU), 0.0, 0.0,
                                0.0, var=var2, m=m2, v=v2)
    torch.testing.assert_close(var2.cpu(), _ref_bert_adam(var, m, v, torch.ones(7), 0.05, 0.9, 0.99, 1e-6, 0, 0, 0)[0])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("call,match", [
    (lambda x, t: ops.npu_fused_linear_online_max_sum(x, x[:, :2], t, 0, 4), "npu_fused_linear_online_max_sum"),
    (lambda x, t: ops.npu_fused_linear_online_max_sum(x, x, t.float(), 0, 4), "target"),
    (lambda x, t: ops.npu_fused_linear_online_max_sum(x, x, t, 3, 1), "vocab_start_index"),
    (lambda x, t: torch_npu.npu_bert_apply_adam(0.1, 0.9, 0.9, 1e-6, t.float(), 0, 0, 0, adam_mode=1,
                                                out=(t.float(), t.float(), t.float())),
     "npu_bert_apply_adam: adam_mode"),
    (lambda x, t: torch_npu.npu_bert_apply_adam(0.1, 0.9, 0.9, 1e-6, t.float(), 0, 0, 0), "out=\\(var, m, v\\)"),
    (lambda x, t: torch_npu.npu_bert_apply_adam(0.1, 0.9, 0.9, 1e-6, t.float(), 0, 0, 0,
                                                out=(x, t.float(), t.float())), "var must have"),
])
def test_fused_train_invalid_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.randn(4, 4, device=NPU), torch.zeros(4, dtype=torch.int64, device=NPU))


@pytest.mark.timeout(300)
def test_fused_train_ops_compile_fullgraph():
    def fn(x, w, target, var, m, v, g):
        mx, se, pred, mask, masked, logits = torch_npu.npu_fused_linear_online_max_sum(x, w, target, 2, 6,
                                                                                       return_logits=True)
        torch_npu.npu_bert_apply_adam(0.1, 0.9, 0.99, 1e-6, g, 1.0, 2.0, 0.01, out=(var, m, v))
        return mx + se + pred, mask, masked, logits

    x, w, target = torch.randn(9, 3), torch.randn(4, 3), torch.randint(0, 8, (9,))
    g, state = torch.randn(5), [torch.randn(5), torch.rand(5), torch.rand(5)]
    sc, se_ = [t.to(NPU) for t in state], [t.to(NPU) for t in state]
    args = (x.to(NPU), w.to(NPU), target.to(NPU))
    out_c = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args, *sc, g.to(NPU))
    out_e = fn(*args, *se_, g.to(NPU))
    for a, b in zip(list(out_c) + sc, list(out_e) + se_):
        torch.testing.assert_close(a.cpu(), b.cpu())


OPCHECK = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.timeout(300)
def test_fused_train_opcheck():
    x, w, t = torch.randn(9, 3, device=NPU), torch.randn(4, 3, device=NPU), torch.randint(0, 8, (9,), device=NPU)
    for return_logits in (True, False):
        torch.library.opcheck(ops.npu_fused_linear_online_max_sum, (x, w, t, 2, 6, return_logits), test_utils=OPCHECK)
    state = [torch.randn(5, device=NPU) for _ in range(3)]
    torch.library.opcheck(ops._bert_apply_adam_, (0.1, 0.9, 0.99, 1e-6, torch.randn(5, device=NPU), 1.0, 2.0, 0.01,
                                                  None, 0, *state), test_utils=OPCHECK)
