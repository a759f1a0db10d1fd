"""torch_npu.utils.FlopsCounter (the FLOPs of npu matmuls, convolutions and fused attention, with Ascend's
recorded / traversed totals) and torch_npu.optim.NpuFusedOptimizerBase (parameters combined into one buffer per
dtype, a subclass's step against torch.optim)."""
import warnings

import pytest
import torch

import torch_npu
from torch_npu.utils import FlopsCounter


@pytest.fixture
def counter():
    fc = FlopsCounter()
    fc.stop()
    yield fc
    fc.stop()


def _npu(*shape, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to("npu").requires_grad_(grad)


# ---------------------------------------------------------------------------------------------------------
# FlopsCounter

def test_flops_counter_names():
    assert torch_npu.utils.FlopsCounter is torch_npu.utils.flops_count._FlopsCounter
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch_npu.utils.flops_count.FlopsCounter()
    assert any(issubclass(x.category, FutureWarning) and "will be deprecated" in str(x.message) for x in w)


def test_not_started_counts_nothing(counter):
    assert counter.get_flops() == [0, 0]
    _npu(4, 5) @ _npu(5, 6)
    assert counter.get_flops() == [0, 0]


def test_mm_forward_backward(counter):
    m, k, n = 4, 5, 6
    a, b = _npu(m, k, grad=True), _npu(k, n, grad=True, seed=1)
    counter.start()
    c = a @ b
    assert counter.get_flops() == [2 * m * n * k] * 2
    c.sum().backward()   # grad_a = g @ b^T, grad_b = a^T @ g
    assert counter.get_flops() == [3 * 2 * m * n * k] * 2
    assert isinstance(counter.get_flops()[0], int)


def test_linear_bmm_baddbmm_matmul(counter):
    counter.start()
    lin = torch.nn.Linear(5, 7).to("npu")
    lin(_npu(3, 5))                                     # addmm: 2*3*7*5
    assert counter.get_flops()[1] == 2 * 3 * 7 * 5
    torch.bmm(_npu(2, 3, 4), _npu(2, 4, 5))
    assert counter.get_flops()[1] == 2 * 3 * 7 * 5 + 2 * 2 * 3 * 5 * 4
    counter.stop()
    counter.start()
    torch.baddbmm(_npu(2, 3, 5), _npu(2, 3, 4), _npu(2, 4, 5))
    torch.matmul(_npu(2, 3, 4), _npu(4, 6))            # batched matmul through mm/bmm
    assert counter.get_flops() == [2 * 2 * 3 * 5 * 4 + 2 * 2 * 3 * 6 * 4] * 2


def test_conv2d_forward_backward(counter):
    x, w = _npu(2, 3, 8, 8, grad=True), _npu(4, 3, 3, 3, grad=True, seed=1)
    counter.start()
    y = torch.nn.functional.conv2d(x, w, padding=1)
    fwd = 2 * (8 * 8) * (3 * 3) * 2 * 4 * 3             # out pixels * filter * batch * c_out * c_in * 2
    assert counter.get_flops() == [fwd, fwd]
    y.sum().backward()                                  # grad input + grad weight, each as many
    assert counter.get_flops() == [3 * fwd, 3 * fwd]


def test_cpu_ops_not_counted(counter):
    counter.start()
    torch.randn(4, 5) @ torch.randn(5, 6)
    torch.nn.functional.conv2d(torch.randn(1, 1, 4, 4), torch.randn(1, 1, 3, 3))
    assert counter.get_flops() == [0, 0]


def test_pause_resume(counter):
    unit = 2 * 4 * 6 * 5
    a, b = _npu(4, 5), _npu(5, 6)
    counter.start()
    a @ b
    counter.pause()
    a @ b                    # recomputation: traversed only
    a @ b
    assert counter.get_flops() == [unit, 3 * unit]
    counter.resume()
    a @ b
    assert counter.get_flops() == [2 * unit, 4 * unit]


def test_checkpoint_recompute_is_counted(counter):
    """Activation checkpointing's recomputed forward is traversed again (HFU); pausing around it keeps it out of
    recordedCount (MFU), as MindSpeed does."""
    from torch.utils.checkpoint import checkpoint

    w = _npu(8, 8, grad=True)
    x = _npu(4, 8, grad=True, seed=1)
    unit = 2 * 4 * 8 * 8

    def block(t):
        return torch.tanh(t @ w)

    counter.start()
    checkpoint(block, x, use_reentrant=False).sum().backward()
    assert counter.get_flops() == [4 * unit, 4 * unit]   # forward, recomputed forward, two backward matmuls
    counter.stop()
    counter.start()
    y = checkpoint(block, x, use_reentrant=False)
    counter.pause()
    y.sum().backward()
    counter.resume()
    assert counter.get_flops() == [unit, 4 * unit]


def test_stop_resets_and_disables(counter):
    a, b = _npu(4, 5), _npu(5, 6)
    counter.start()
    counter.pause()
    a @ b
    assert counter.get_flops() == [0, 2 * 4 * 6 * 5]
    counter.stop()
    assert counter.get_flops() == [0, 0]
    a @ b
    assert counter.get_flops() == [0, 0]
    counter.start()          # stop cleared the pause flag too
    a @ b
    assert counter.get_flops() == [2 * 4 * 6 * 5] * 2
    counter.stop()
    assert not torch.utils._python_dispatch._get_current_dispatch_mode_stack()


def test_singleton_state(counter):
    other = FlopsCounter()
    counter.start()
    _npu(2, 3) @ _npu(3, 4)
    assert other.get_flops() == counter.get_flops() == [48, 48]
    other.stop()
    assert counter.get_flops() == [0, 0]


def test_context_manager(counter):
    with FlopsCounter() as fc:
        _npu(2, 3) @ _npu(3, 4)
    _npu(2, 3) @ _npu(3, 4)
    assert fc.get_flops() == [48, 48]
    assert not torch.utils._python_dispatch._get_current_dispatch_mode_stack()


def test_stop_under_another_mode(counter):
    """A mode entered after start() stays on the stack when the counter stops."""
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    counter.start()
    inner = Passthrough()
    inner.__enter__()
    try:
        counter.stop()
        assert _get_current_dispatch_mode_stack() == [inner]
    finally:
        inner.__exit__(None, None, None)
    assert not _get_current_dispatch_mode_stack()


def test_fusion_attention_flops(counter):
    b, s, n, d = 2, 8, 4, 16
    q, k, v = (_npu(b, s, n, d, grad=True, seed=i) for i in range(3))
    counter.start()
    out = torch_npu.npu_fusion_attention(q, k, v, n, "BSND", scale=d ** -0.5)[0]
    fwd = 2 * b * n * s * s * d + 2 * b * n * s * s * d      # QK^T and P V
    assert counter.get_flops() == [fwd, fwd]
    out.sum().backward()                                   # dS, dV, dQ, dK
    assert counter.get_flops() == [3 * fwd, 3 * fwd]


def test_fusion_attention_layouts(counter):
    n, d = 2, 8
    counter.start()
    # BSH with grouped kv heads (1 kv head) and a different value head dim is not allowed by the operator;
    # the same shapes in BSH and BNSD count the same
    q = _npu(1, 6, n * d)
    kv = _npu(1, 10, n * d, seed=1)
    torch_npu.npu_fusion_attention(q, kv, kv, n, "BSH", scale=0.3)
    bsh = counter.get_flops()[1]
    assert bsh == 2 * 1 * n * 6 * 10 * (d + d)
    counter.stop()
    counter.start()
    # TND: two sequences (3 and 5 queries, 4 and 6 keys) count per sequence
    q, kv = _npu(8, n, d), _npu(10, n, d, seed=1)
    torch_npu.npu_fusion_attention(q, kv, kv, n, "TND", scale=0.3, actual_seq_qlen=[3, 8], actual_seq_kvlen=[4, 10])
    assert counter.get_flops()[1] == 2 * n * (3 * 4 + 5 * 6) * (d + d)


def test_flop_counter_mode_counts_fusion_attention():
    from torch.utils.flop_counter import FlopCounterMode

    q = _npu(1, 4, 2, 8)
    with FlopCounterMode(display=False) as mode:
        torch_npu.npu_fusion_attention(q, q, q, 2, "BSND", scale=0.3)
    assert mode.get_total_flops() == 2 * 2 * 4 * 4 * (8 + 8)


def test_autograd_thread_counts_backward(counter):
    """The backward runs on the autograd engine's device thread; its matmuls are counted."""
    a, b = _npu(3, 4, grad=True), _npu(4, 5, grad=True, seed=1)
    counter.start()
    (a @ b).sum().backward()
    assert counter.get_flops()[1] == 3 * 2 * 3 * 4 * 5
