"""Every call of an npu op gives PyTorch's result and PyTorch's warnings, not only the first.

Under asynchronous launch the first call of an op signature runs synchronously and later ones are queued
(docs/op_path.md), so a difference between the two paths shows from the second call on. These tests run in
both launch modes (CI's second pass sets ASCEND_LAUNCH_BLOCKING=1).
"""
import json
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

from .conftest import run_python


def _warnings_of(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
        torch.npu.synchronize()  # a warning of a queued kernel arrives here at the latest
    return out, [f"{w.category.__name__}: {w.message}" for w in caught]


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_binary_cross_entropy_is_right_on_every_call(weighted):
    torch.manual_seed(0)
    wrong = []
    for i in range(300):
        x, t = torch.rand(5, 5), torch.rand(5, 5)
        w = torch.rand(5, 5) if weighted else None
        ref = F.binary_cross_entropy(x.double(), t.double(), None if w is None else w.double()).item()
        got = F.binary_cross_entropy(x.npu(), t.npu(), None if w is None else w.npu()).item()
        if abs(got - ref) > 1e-5 * abs(ref):
            wrong.append((i, got, ref))
    assert not wrong, f"{len(wrong)} of 300 calls wrong, first: {wrong[:3]}"


# Losses whose out= kernels do not follow the functional contract (scratch-sized or resized outputs), in
# every reduction; a call sequence long enough to reuse the queued signature.
LOSSES = {
    "binary_cross_entropy": lambda x, t, r: F.binary_cross_entropy(x.sigmoid(), t, reduction=r),
    "mse_loss": lambda x, t, r: F.mse_loss(x, t, reduction=r),
    "l1_loss": lambda x, t, r: F.l1_loss(x, t, reduction=r),
    "smooth_l1_loss": lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r),
    "huber_loss": lambda x, t, r: F.huber_loss(x, t, reduction=r),
    "soft_margin_loss": lambda x, t, r: F.soft_margin_loss(x, t.sign(), reduction=r),
    "kl_div": lambda x, t, r: F.kl_div(x.log_softmax(-1), t.softmax(-1), reduction="batchmean" if r == "mean" else r),
    "multilabel_soft_margin_loss": lambda x, t, r: F.multilabel_soft_margin_loss(x, (t > 0.5).float(), reduction=r),
}


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_losses_match_cpu_values_and_warnings_on_every_call(name, reduction, capfd):
    loss = LOSSES[name]
    torch.manual_seed(1)
    for call in range(4):
        x, t = torch.randn(6, 7), torch.rand(6, 7)
        ref, ref_warnings = _warnings_of(lambda: loss(x, t, reduction))
        cpu_stderr = capfd.readouterr().err
        got, got_warnings = _warnings_of(lambda: loss(x.npu(), t.npu(), reduction))
        npu_stderr = capfd.readouterr().err  # C++ warnings printed from another thread land here
        assert got.device.type == "npu" and got.shape == ref.shape and got.dtype == ref.dtype
        assert torch.equal(got.cpu(), ref), f"call {call}: {got.cpu()} vs {ref}"
        assert got_warnings == ref_warnings, f"call {call}"
        assert npu_stderr == cpu_stderr, f"call {call}: npu printed {npu_stderr!r}"


def test_a_signature_that_warns_warns_on_every_call():
    x = torch.randn(1, 4)  # std over one element: "degrees of freedom is <= 0" on every call
    for call in range(3):
        ref, ref_warnings = _warnings_of(lambda: x.std(dim=0))
        got, got_warnings = _warnings_of(lambda: x.npu().std(dim=0))
        assert ref_warnings and got_warnings == ref_warnings, f"call {call}"
        assert torch.equal(got.cpu().isnan(), ref.isnan())


def test_a_queued_kernel_warning_reaches_python():
    # An npu -> npu copy is always queued; complex to real warns (once per process, TORCH_WARN_ONCE) on the
    # worker that runs it. The warning must reach Python's warnings, not the worker's stderr. A fresh process:
    # an earlier copy in this one may have used up the warning.
    code = textwrap.dedent("""
        import json, warnings, torch
        src = torch.randn(8, dtype=torch.complex64).npu()
        dst = torch.empty(8, device="npu")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dst.copy_(src)
            torch.npu.synchronize()
        print(json.dumps([str(w.message) for w in caught]))
        assert torch.equal(dst.cpu(), src.cpu().real)
    """)
    for env in ({}, {"ASCEND_LAUNCH_BLOCKING": "1"}):
        proc = run_python(code, env)
        assert proc.returncode == 0, proc.stderr
        caught = json.loads(proc.stdout.strip().splitlines()[-1])
        assert len(caught) == 1 and "discards the imaginary part" in caught[0], (env, caught)
        assert "Warning" not in proc.stderr, (env, proc.stderr)


def test_inplace_composite_ops_run_their_cpu_kernels():
    # conj_physical_'s only kernel is a composite one that calls a CPU DispatchStub directly; on npu tensors
    # it raised "DispatchStub: missing kernel for npu".
    x = torch.randn(4, 3, dtype=torch.complex64)
    params, grads = [torch.randn(5), torch.randn(2, 3)], [torch.randn(5), torch.randn(2, 3)]
    params_npu, grads_npu = [p.npu() for p in params], [g.npu() for g in grads]
    for call in range(3):
        y = x.npu()
        y.conj_physical_()
        assert torch.equal(y.cpu(), x.conj_physical()), f"call {call}"
        torch._foreach_add_(params, grads, alpha=0.5)
        torch._foreach_add_(params_npu, grads_npu, alpha=0.5)
        torch._foreach_mul_(params, 1.5)
        torch._foreach_mul_(params_npu, 1.5)
        assert all(torch.equal(p, q.cpu()) for p, q in zip(params, params_npu)), f"call {call}"


def test_a_kernel_that_conjugates_its_out_argument():
    # linalg.lu_solve(left=False, out=) solves A^H X^H = B^H in `out`, then marks `out` conjugated (a lazy
    # conj bit set by the CPU kernel): the npu tensor must carry the bit, on every call.
    torch.manual_seed(0)
    A, B = torch.randn(3, 3, dtype=torch.complex64), torch.randn(2, 3, dtype=torch.complex64)
    LU, pivots = torch.linalg.lu_factor(A)
    ref = torch.empty(2, 3, dtype=torch.complex64)
    torch.linalg.lu_solve(LU, pivots, B, left=False, out=ref)
    for call in range(3):
        out = torch.empty(2, 3, dtype=torch.complex64, device="npu")
        torch.linalg.lu_solve(LU.npu(), pivots.npu(), B.npu(), left=False, out=out)
        assert out.is_conj() == ref.is_conj() and torch.equal(out.cpu(), ref), f"call {call}"


@pytest.mark.parametrize("form", ["out_resize", "inplace_broadcast"])
def test_meta_inference_warns_nothing_of_its_own(form):
    # The op path runs an op's Meta kernel to infer its outputs; Python meta kernels warn about resizing a
    # wrongly shaped out= tensor or an in-place self that does not broadcast. Only the CPU kernel's own
    # warnings and errors may reach the caller.
    def call(device):
        x, y = torch.ones(5, 1, device=device), torch.ones(5, 3, device=device)
        if form == "out_resize":
            out = torch.empty(2, device=device)
            torch.add(x, y, out=out)
            return out
        return x.eq_(y)  # raises: self (5, 1) does not broadcast to (5, 3)

    results = []
    for device in ("cpu", "npu", "npu"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                value, error = call(device), None
                torch.npu.synchronize()
            except RuntimeError as e:
                value, error = None, str(e).splitlines()[0]
        results.append((None if value is None else value.cpu(), error, [str(w.message)[:60] for w in caught]))
    (cpu_value, cpu_error, cpu_warnings) = results[0]
    for value, error, caught in results[1:]:
        assert caught == cpu_warnings and error == cpu_error
        assert (value is None) == (cpu_value is None) and (value is None or torch.equal(value, cpu_value))


def test_out_forms_with_composite_kernels_run_the_cpu_kernel():
    # mode.values (torch.mode(..., out=)) has only a composite kernel, which checks the device first; its
    # functional form runs CPU's kernel on npu, so the out= form must too.
    x = torch.randn(4, 5)
    ref = torch.mode(x, 1)
    for call in range(2):
        values, indices = torch.empty(4, device="npu"), torch.empty(4, dtype=torch.long, device="npu")
        torch.mode(x.npu(), 1, out=(values, indices))
        assert torch.equal(values.cpu(), ref.values) and torch.equal(indices.cpu(), ref.indices), f"call {call}"
