"""torch_npu's task-queue level (docs/torch_npu.md, "set_task_queue_enable"): TASK_QUEUE_ENABLE at start,
torch.npu.set_task_queue_enable at run time; 0 launches synchronously, 1 and 2 queue. Fresh interpreters: the
level is process-wide."""
from .conftest import run_python

ASYNC = {"ASCEND_LAUNCH_BLOCKING": "0", "NPUDIST_LAUNCH_BLOCKING": "0", "PYTHONPATH": "tests",
         "NPUDIST_LAUNCH_INLINE_NS": "0"}  # never inline: every queueable kernel is counted as queued

SWITCH = """
import torch, npudist
from npudist.device import kernel_queue as kq
from runtime_ext import launch_host_fill
x = torch.randn(256, 256, device='npu')
for _ in range(3):
    y = x @ x  # the first call runs synchronously; later ones queue
torch.npu.synchronize()
print("start", torch.npu.get_task_queue_enable(), kq.is_blocking())

# The switch drains: a slow fill queued before it has run when it returns.
slow = torch.zeros(8, device='npu')
launch_host_fill(slow, 3.0, 200_000, torch.npu.current_stream().stream_id)
torch.npu.set_task_queue_enable(0)
print("drained", torch.npu.current_stream().query())
print("level0", torch.npu.get_task_queue_enable(), kq.is_blocking())
kq.reset_launch_counts()
z0 = x @ x
print("queued0", kq.launch_counts()["queued"])

torch.npu.set_task_queue_enable("2")
print("level2", torch.npu.get_task_queue_enable(), kq.is_blocking())
kq.reset_launch_counts()
z2 = x @ x
print("queued2", kq.launch_counts()["queued"])
print("equal", torch.equal(z0.cpu(), z2.cpu()), torch.equal(z0.cpu(), y.cpu()), float(slow.sum().item()))
for bad in (3, -1, "x", True, 1.5):
    try:
        torch.npu.set_task_queue_enable(bad)
    except ValueError as e:
        print("bad", bad, "|", e)
print("after bad", torch.npu.get_task_queue_enable())
"""


def test_set_task_queue_enable_switches_the_launch_mode_after_draining():
    res = run_python(SWITCH, env=ASYNC, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "start 1 False" in out, out
    assert "drained True" in out, out  # the fill queued before the switch ran first
    assert "level0 0 True" in out and "queued0 0" in out, out
    assert "level2 2 False" in out and "queued2 1" in out, out
    assert "equal True True 24.0" in out, out
    assert out.count("mode must be 0, 1 or 2") == 5, out
    assert "after bad 2" in out, out


def test_task_queue_enable_variable_sets_the_first_level():
    script = "import torch, npudist\nfrom npudist.device import kernel_queue as kq\n" \
             "print(torch.npu.get_task_queue_enable(), kq.is_blocking())\n" \
             "torch.npu.set_task_queue_enable(1)\nprint(torch.npu.get_task_queue_enable(), kq.is_blocking())"
    res = run_python(script, env={**ASYNC, "TASK_QUEUE_ENABLE": "0"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split("\n")[:2] == ["0 True", "1 False"], res.stdout
    # Blocking launch wins over any level, as on Ascend.
    res = run_python(script, env={**ASYNC, "TASK_QUEUE_ENABLE": "2", "ASCEND_LAUNCH_BLOCKING": "1",
                                  "NPUDIST_LAUNCH_BLOCKING": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split("\n")[:2] == ["0 True", "0 True"], res.stdout
    res = run_python("import torch, npudist\ntorch.ones(2, device='npu')", env={**ASYNC, "TASK_QUEUE_ENABLE": "3"})
    assert res.returncode != 0 and "TASK_QUEUE_ENABLE='3'" in res.stderr, res.stderr[-2000:]
