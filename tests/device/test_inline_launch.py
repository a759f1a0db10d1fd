"""Inline launch (docs/device.md, "Launch window"): under asynchronous launch a small kernel whose runs on the
host are faster than a hand-off to the stream's worker runs on the launching thread when its stream is idle,
never ahead of queued work. Whether a kernel is that fast is measured; these tests set the bound
(NPUDIST_LAUNCH_INLINE_NS) to 1 s or 0 so that the outcome does not depend on the machine's speed."""
from .conftest import run_python

ENV = {"ASCEND_LAUNCH_BLOCKING": "0", "NPUDIST_LAUNCH_BLOCKING": "0", "PYTHONPATH": "tests"}

INLINE = """
import torch, npudist
from npudist.device import kernel_queue as kq
from runtime_ext import HostGate
x = torch.randn(64, 64, device='npu')
xc = x.cpu()
idx = torch.tensor([0, 2], device='npu')
for _ in range(20):  # the first call runs synchronously, the next ones are queued and sampled, then tried inline
    x + 1, x * 2, torch.index_select(x, 0, idx)
torch.npu.synchronize()

kq.reset_launch_counts()
ys = [x + i for i in range(50)]
c = kq.launch_counts()
assert (c['inline'], c['queued'], c['synchronous']) == (50, 0, 0), c
assert all(torch.equal(y.cpu(), xc + i) for i, y in enumerate(ys))

# Behind queued work (here a closed gate) nothing runs inline: the kernels queue, in launch order.
with HostGate(0, torch.npu.current_stream().stream_id) as gate:
    kq.reset_launch_counts()
    z = x * 2
    w = z + 1
    c = kq.launch_counts()
    assert (c['inline'], c['queued']) == (0, 2), c
    gate.open()
assert torch.equal(w.cpu(), xc * 2 + 1)

# An inline kernel that fails raises at the call, as under blocking launch.
bad = torch.tensor([0, 99], device='npu')
try:
    torch.index_select(x, 0, bad)
except (RuntimeError, IndexError) as e:
    assert 'out of range' in str(e), e
else:
    raise AssertionError('no error at the call')
torch.npu.synchronize()  # nothing left to report
print('ok')
"""


def test_small_kernels_run_inline_on_an_idle_stream_and_never_ahead_of_queued_work():
    res = run_python(INLINE, env={**ENV, "NPUDIST_LAUNCH_INLINE_NS": "1000000000"}, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


def test_inline_bound_zero_queues_every_kernel_and_a_malformed_bound_is_named():
    code = """
import torch, npudist
from npudist.device import kernel_queue as kq
x = torch.randn(64, 64, device='npu')
for _ in range(20):
    x + 1
torch.npu.synchronize()
kq.reset_launch_counts()
ys = [x + i for i in range(50)]
c = kq.launch_counts()
assert (c['inline'], c['queued']) == (0, 50), c
print('ok')
"""
    res = run_python(code, env={**ENV, "NPUDIST_LAUNCH_INLINE_NS": "0"}, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]
    code = "import torch, npudist\nx = torch.ones(4, device='npu')\nfor _ in range(20): x + 1\n"
    res = run_python(code, env={**ENV, "NPUDIST_LAUNCH_INLINE_NS": "fast"}, timeout=120)
    assert res.returncode != 0 and "NPUDIST_LAUNCH_INLINE_NS='fast' is not a kernel time" in res.stderr, res.stderr[-3000:]
