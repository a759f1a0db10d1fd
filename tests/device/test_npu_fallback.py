"""The zero-copy CPU-kernel fallback: aliasing, views, in-place, out=, accounting, unsupported ops."""
import pytest
import torch


_seen = {}
_lib = torch.library.Library("npudist_test", "DEF")
_lib.define("probe(Tensor x) -> Tensor")
_lib.define("gpu_only(Tensor x) -> Tensor")
_lib.define("probe_fill_(Tensor(a!) x) -> Tensor(a!)")


def _probe_cpu(x):
    _seen["in_ptr"] = x.data_ptr()
    _seen["in_device"] = x.device
    out = x * 2
    _seen["out_ptr"] = out.data_ptr()
    return out


_lib.impl("probe", _probe_cpu, "CPU")
_lib.impl("gpu_only", lambda x: x, "CUDA")


def test_cpu_kernel_runs_on_the_npu_bytes():
    x = torch.arange(6.0, device="npu").reshape(2, 3)[:, 1:]
    y = torch.ops.npudist_test.probe(x)
    assert _seen["in_device"] == torch.device("cpu")
    assert _seen["in_ptr"] == x.data_ptr()  # the CPU kernel saw the npu memory itself
    assert y.device == x.device and _seen["out_ptr"] == y.data_ptr()  # the output was adopted, not copied
    assert torch.equal(y.cpu(), torch.tensor([[2.0, 4.0], [8.0, 10.0]]))


def _probe_fill_cpu(x):
    _seen["alias"] = (x.device, x.data_ptr(), x.stride())
    return x.fill_(1.0)


_lib.impl("probe_fill_", _probe_fill_cpu, "CPU")


def test_cpu_alias_shares_data_pointer():
    x = torch.randn(4, 4, device="npu")
    y = torch.ops.npudist_test.probe_fill_(x.t())  # the CPU kernel gets the fallback's CPU alias of x.t()
    assert _seen["alias"] == (torch.device("cpu"), x.data_ptr(), (1, 4))
    assert y.device == x.device and y.data_ptr() == x.data_ptr()
    assert torch.equal(x.cpu(), torch.ones(4, 4))


def test_outputs_are_counted_by_the_npu_allocator():
    x = torch.ones(1024, device="npu:1")
    before = torch.npu.memory_allocated(1)
    y = torch.exp(x)  # runs the CPU kernel; its output must be npu memory
    assert torch.npu.memory_allocated(1) - before >= y.numel() * 4
    del y
    assert torch.npu.memory_allocated(1) == before


def test_views_alias_the_npu_storage():
    x = torch.arange(12.0, device="npu").reshape(3, 4)
    for v in (x.t(), x[1], x[:, ::2], x.unfold(1, 2, 2), x.view(4, 3), x.reshape(2, 6), x.diagonal()):
        assert v.device == x.device
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    x.t()[0, 1] = 100.0
    assert x[1, 0].item() == 100.0


def test_inplace_returns_self_and_writes_through_views():
    x = torch.zeros(4, 4, device="npu")
    r = x.add_(1.0)
    assert r is x
    x[:, 1].mul_(5.0)
    torch.exp_(x[0])
    expected = torch.ones(4, 4)
    expected[:, 1] *= 5
    expected[0].exp_()
    assert torch.equal(x.cpu(), expected)


def test_out_arguments_including_resize():
    a = torch.randn(3, 4, device="npu")
    b = torch.randn(4, 5, device="npu")
    out = torch.empty(3, 5, device="npu")
    ptr = out.data_ptr()
    r = torch.mm(a, b, out=out)
    assert r is out and out.data_ptr() == ptr
    assert torch.equal(out.cpu(), torch.mm(a.cpu(), b.cpu()))
    small = torch.empty(0, device="npu")
    before = torch.npu.memory_allocated(0)
    torch.add(a, 1.0, out=small)  # the kernel resizes `out`: the new bytes must be npu bytes
    assert small.shape == (3, 4) and small.device.type == "npu"
    assert torch.equal(small.cpu(), a.cpu() + 1.0)
    assert torch.npu.memory_allocated(0) - before >= 12 * 4


def test_multiple_outputs_and_lists():
    x = torch.randn(5, 6, device="npu")
    vals, idx = x.max(dim=1)
    assert vals.device.type == "npu" and idx.device.type == "npu"
    assert torch.equal(idx.cpu(), x.cpu().max(dim=1).indices)
    parts = torch.split(x, 2)
    assert all(p.device.type == "npu" for p in parts)
    ts = [torch.ones(3, device="npu"), torch.zeros(3, device="npu")]
    torch._foreach_add_(ts, 2.0)
    assert torch.equal(ts[1].cpu(), torch.full((3,), 2.0))
    u = torch.unique(torch.tensor([3, 1, 3, 2], device="npu"))
    assert torch.equal(u.cpu(), torch.tensor([1, 2, 3]))


def test_indexing_and_nonzero():
    x = torch.arange(10.0, device="npu")
    assert torch.equal(x[x > 5].cpu(), torch.tensor([6.0, 7.0, 8.0, 9.0]))
    x[torch.tensor([0, 1])] = -1.0  # CPU indices are accepted, as on CUDA
    assert x[:3].tolist() == [-1.0, -1.0, 2.0]
    assert torch.nonzero(x < 0).device.type == "npu"


def test_autograd_through_fallback():
    w = torch.randn(3, 3, device="npu", requires_grad=True)
    x = torch.randn(2, 3, device="npu")
    (x @ w).tanh().sum().backward()
    wc = w.detach().cpu().requires_grad_()
    (x.cpu() @ wc).tanh().sum().backward()
    assert w.grad.device.type == "npu" and torch.equal(w.grad.cpu(), wc.grad)


def test_storage_resize_frees_and_rematerialises():
    x = torch.arange(256.0, device="npu")
    st = x.untyped_storage()
    before = torch.npu.memory_allocated(0)
    st.resize_(0)
    # Under asynchronous launch the old bytes are freed in stream order, once kernels queued before the
    # resize have run (a freed block is never still read by a queued kernel): synchronize to observe it.
    torch.npu.synchronize()
    assert torch.npu.memory_allocated(0) == before - 1024
    st.resize_(1024)
    assert torch.npu.memory_allocated(0) == before
    x.fill_(2.0)
    assert x.sum().item() == 512.0


def test_unsupported_op_is_not_implemented_error_naming_it():
    with pytest.raises(NotImplementedError, match="npudist_test::gpu_only"):
        torch.ops.npudist_test.gpu_only(torch.ones(2, device="npu"))


def test_sdpa_with_a_mask_that_requires_grad_matches_cpu():
    """CPU's SDPA backend choice looks at requires_grad (a mask that requires grad rules out the flash
    kernel, which has no gradient for it); npu must make the same choice, not raise."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 3, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = torch.randn(3, 6)
    outs = []
    for dev in ("cpu", "npu"):
        args = [t.to(dev).requires_grad_(True) for t in (q, k, v, mask)]
        out = torch.nn.functional.scaled_dot_product_attention(*args[:3], attn_mask=args[3])
        outs.append((out, *torch.autograd.grad(out.sum(), args)))
    for cpu, npu in zip(*outs):
        assert torch.equal(cpu, npu.cpu())
