"""Devices: count, visibility, capacity, selection, copies, mismatches and bad input."""
import pytest
import torch

from .conftest import run_python


def test_default_count_and_properties():
    r = run_python("import npudist, torch; p = torch.npu.get_device_properties(3);"
                   "print(torch.npu.device_count(), p.total_memory, p.name)")
    assert r.returncode == 0, r.stderr
    count, mem, *_ = r.stdout.split()
    assert int(count) == 8 and int(mem) == 16 << 30


def test_visible_devices_filter_and_renumber():
    code = ("import npudist, torch; print(torch.npu.device_count(),"
            " [torch.npu.get_device_properties(i).physical_index for i in range(torch.npu.device_count())],"
            " torch.npu.get_device_properties(0).total_memory)")
    r = run_python(code, {"NPUDIST_DEVICE_COUNT": "4", "ASCEND_RT_VISIBLE_DEVICES": "3,1",
                          "NPUDIST_DEVICE_MEMORY": "512MiB"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"2 [3, 1] {512 << 20}"


@pytest.mark.parametrize("env,needle", [
    ({"NPUDIST_DEVICE_COUNT": "eight"}, "NPUDIST_DEVICE_COUNT"),
    ({"NPUDIST_DEVICE_COUNT": "4", "ASCEND_RT_VISIBLE_DEVICES": "0,7"}, "ASCEND_RT_VISIBLE_DEVICES"),
    ({"NPUDIST_DEVICE_MEMORY": "16 parsecs"}, "NPUDIST_DEVICE_MEMORY"),
])
def test_malformed_env_is_a_clear_error(env, needle):
    # `import torch` only warns (autoload must not break torch); the script's `import npudist` raises.
    r = run_python("import torch, npudist", env)
    assert r.returncode != 0
    # EnvVarError is a ValueError naming the variable, its value and what it accepts
    assert "npudist.env.EnvVarError: " + needle in r.stderr, r.stderr


def test_bad_device_index():
    with pytest.raises(ValueError, match="Invalid npu device index 99"):
        torch.npu.set_device(99)
    with pytest.raises(ValueError, match="Invalid npu device index"):
        torch.empty(2, device="npu:99")
    with pytest.raises(ValueError, match="Invalid npu device index"):
        torch.npu.get_device_properties(42)


def test_capacity_exhausted():
    code = ("import npudist, torch\n"
            "a = torch.empty(1 << 20, dtype=torch.uint8, device='npu')\n"
            "try:\n"
            "    torch.empty(2 << 20, dtype=torch.uint8, device='npu')\n"
            "except torch.OutOfMemoryError as e:\n"
            "    print('OOM', 'npu' in str(e))\n")
    r = run_python(code, {"NPUDIST_DEVICE_MEMORY": "2MiB"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "OOM True"


def test_set_device_and_contexts():
    assert torch.npu.current_device() == 0
    with torch.npu.device(2):
        assert torch.npu.current_device() == 2
        assert torch.empty(1, device="npu").device == torch.device("npu:2")
    assert torch.npu.current_device() == 0
    t = torch.ones(1, device="npu:3")
    with torch.npu.device_of(t):
        assert torch.npu.current_device() == 3
    assert torch.npu.current_device() == 0


def test_copies_between_devices():
    c = torch.randn(5, 7)
    a = c.to("npu:0")
    b = a.to("npu:1")
    assert b.device == torch.device("npu:1") and a.data_ptr() != b.data_ptr()
    assert torch.equal(b.cpu(), c)
    d = torch.empty(7, 5, device="npu:2")
    d.copy_(b.t())  # non-contiguous source on another device
    assert torch.equal(d.cpu(), c.t())
    half = a.to(torch.float16)
    assert half.device == a.device and torch.equal(half.cpu(), c.half())
    assert torch.tensor(3.5, device="npu").item() == 3.5
    assert a.sum().item() == c.sum().item()


def test_mixing_devices_raises_pytorch_error():
    a = torch.ones(3, device="npu:0")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3, device="npu:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(torch.ones(2, 2, device="npu"), torch.ones(2, 2))
    # 0-dim CPU tensors mix with device tensors, as on CUDA
    assert torch.equal((a * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))


def test_is_initialized_after_first_use():
    r = run_python("import npudist, torch; a = torch.npu.is_initialized(); torch.ones(1, device='npu');"
                   "print(a, torch.npu.is_initialized())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]
