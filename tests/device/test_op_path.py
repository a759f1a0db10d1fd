"""The units of the npu op path (docs/op_path.md): the out= overload a queued call may write through, and the
life of a signature (first call inline and checked, later calls queued; what keeps a signature inline)."""
import warnings

import pytest
import torch

from npudist import _C
from npudist.device import kernel_queue

needs_async = pytest.mark.skipif(kernel_queue.is_blocking(), reason="ASCEND_LAUNCH_BLOCKING=1 selected blocking launch")


@pytest.mark.parametrize("name,overload,expected", [
    ("aten::mm", "", "out"),                      # structured: mm is mm.out's delegate
    ("aten::add", "Tensor", "out"),
    ("aten::sum", "dim_IntList", "IntList_out"),
    ("aten::mse_loss", "", "out"),                # structured; the first call's check still refuses it
    ("aten::binary_cross_entropy", "", None),     # its out= kernel reduces into an input-sized buffer
    ("aten::native_layer_norm", "", None),        # not structured
    ("aten::add_", "Tensor", None),               # in place: writes its argument, no out= form needed
])
def test_out_overload_only_for_structured_delegates(name, overload, expected):
    assert _C._op_out_overload(name, overload) == expected


def test_out_overload_of_an_unknown_op_is_an_error():
    with pytest.raises(ValueError, match="no operator aten::no_such_op"):
        _C._op_out_overload("aten::no_such_op", "")


def _paths(fn):
    torch.npu.synchronize()
    kernel_queue.reset_launch_counts()
    fn()
    counts = kernel_queue.launch_counts()
    torch.npu.synchronize()
    # A queueable kernel runs inline instead when the stream is idle and its learned time is under
    # NPUDIST_LAUNCH_INLINE_NS (machine speed decides which): both are the asynchronous path, unlike "synchronous".
    return counts["queued"] + counts["inline"], counts["synchronous"]


@needs_async
def test_a_signature_runs_inline_once_then_queued():
    a, b = torch.randn(13, 7, device="npu"), torch.randn(7, 5, device="npu")
    assert _paths(lambda: a @ b) == (0, 1)
    assert _paths(lambda: a @ b) == (1, 0)
    c = torch.randn(13, 6, device="npu")  # another geometry: another signature
    assert _paths(lambda: c @ b[:6]) == (0, 1)
    assert _paths(lambda: c @ b[:6]) == (1, 0)


@needs_async
def test_a_signature_whose_kernel_warns_stays_inline():
    x = torch.randn(1, 9, device="npu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _paths(lambda: x.std(dim=0)) == (0, 1)
        assert _paths(lambda: x.std(dim=0)) == (0, 1)


@needs_async
def test_a_signature_whose_kernel_conjugates_an_argument_stays_inline():
    lu, pivots = torch.linalg.lu_factor(torch.randn(3, 3, dtype=torch.complex64))
    lu, pivots, b = lu.npu(), pivots.npu(), torch.randn(2, 3, dtype=torch.complex64, device="npu")

    def solve():
        torch.linalg.lu_solve(lu, pivots, b, left=False, out=torch.empty(2, 3, dtype=torch.complex64, device="npu"))

    solve()
    assert _paths(solve) == (0, 1)  # lu_solve ran inline again (empty() does not launch a kernel)


@needs_async
def test_losses_queue_after_the_first_call():
    # binary_cross_entropy takes the functional path, mse_loss too (its out= form failed the check): both queue.
    x, t = torch.rand(4, 4, device="npu"), torch.rand(4, 4, device="npu")
    for loss in (torch.nn.functional.binary_cross_entropy, torch.nn.functional.mse_loss):
        loss(x, t)
        assert _paths(lambda: loss(x, t)) == (1, 0)


@needs_async
@pytest.mark.parametrize("mask", [(True, True, True), (False, True, True), (True, False, False)])
def test_backwards_with_an_output_mask_queue_after_the_first_call(mask):
    # bool[3] output_mask is part of the signature, and the gradients it leaves out are undefined returns: the
    # norm and convolution backwards of every training step queue (a first conv layer's input needs no grad).
    x, w, b = torch.randn(8, 32, device="npu"), torch.randn(32, device="npu"), torch.randn(32, device="npu")
    g = torch.randn(8, 32, device="npu")
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [32], w, b, 1e-5)
    img, cw, cg = (torch.randn(2, 3, 8, 8, device="npu"), torch.randn(4, 3, 3, 3, device="npu"),
                   torch.randn(2, 4, 6, 6, device="npu"))

    def norm():
        return torch.ops.aten.native_layer_norm_backward(g, x, [32], mean, rstd, w, b, list(mask))

    def conv():
        return torch.ops.aten.convolution_backward(cg, img, cw, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                   list(mask))

    for fn in (norm, conv):
        first = fn()
        assert _paths(fn) == (1, 0)
        queued = fn()
        assert [r is None for r in queued] == [not m for m in mask]
        for a, q in zip(first, queued):  # the synchronous first call and a queued one agree bit for bit
            assert (a is None and q is None) or torch.equal(a.cpu(), q.cpu())
