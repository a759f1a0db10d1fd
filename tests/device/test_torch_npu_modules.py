"""torch_npu.optim, torch_npu.utils, torch_npu.matmul_checksum and the profiler's supported_* names."""
from __future__ import annotations

import os

import pytest
import torch

import torch_npu


@pytest.mark.parametrize("name, ref, kwargs", [
    ("NpuFusedAdam", torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1}),
    ("NpuFusedAdamW", torch.optim.AdamW, {"lr": 1e-2}),
    ("NpuFusedSGD", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    ("NpuFusedAdadelta", torch.optim.Adadelta, {}),
    ("NpuFusedRMSprop", torch.optim.RMSprop, {"centered": True, "momentum": 0.5}),
])
def test_fused_optimizers_step_as_their_algorithm(name, ref, kwargs):
    torch.manual_seed(0)
    w0 = torch.randn(5, 3)
    grads = [torch.randn(5, 3) for _ in range(3)]
    p = torch.nn.Parameter(w0.clone().npu())
    q = torch.nn.Parameter(w0.clone())
    opt, ref_opt = getattr(torch_npu.optim, name)([p], **kwargs), ref([q], **kwargs)
    for g in grads:
        p.grad, q.grad = g.npu(), g.clone()
        opt.step()
        ref_opt.step()
    torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-6, atol=1e-7)
    if name == "NpuFusedSGD":
        with pytest.raises(ValueError, match="lr is required"):
            torch_npu.optim.NpuFusedSGD([p])


def test_combined_tensors_share_one_buffer():
    from torch_npu.utils import get_part_combined_tensor, is_combined_tensor_valid, npu_combine_tensors
    a = torch.arange(3.0, device="npu")
    b = torch.full((2, 2), 7.0, device="npu")
    combined = npu_combine_tensors([a, b])
    assert combined.tolist() == [0, 1, 2, 7, 7, 7, 7] and is_combined_tensor_valid(combined, [a, b])
    combined.mul_(2)     # one update reaches every member
    assert a.tolist() == [0, 2, 4] and b.tolist() == [[14, 14], [14, 14]]
    get_part_combined_tensor(combined, 3, 4).zero_()
    assert b.sum().item() == 0
    assert not is_combined_tensor_valid(combined, [torch.ones(2, device="npu")])
    with pytest.raises(RuntimeError, match="same dtype"):
        npu_combine_tensors([a, torch.ones(2, dtype=torch.int32, device="npu")])


def test_thread_affinity_and_cann_version():
    from torch_npu.utils import get_cann_version, reset_thread_affinity, set_thread_affinity
    start = os.sched_getaffinity(0)
    core = min(start)
    try:
        set_thread_affinity([core, core])
        assert os.sched_getaffinity(0) == {core}
        reset_thread_affinity()
        assert os.sched_getaffinity(0) == start
        with pytest.raises(ValueError, match="core_range"):
            set_thread_affinity([3, 1])
    finally:
        os.sched_setaffinity(0, start)
    info = os.path.join(os.environ["ASCEND_HOME_PATH"], "ascend_toolkit_install.info")
    with open(info) as f:
        version = next(line.split("=", 1)[1].strip() for line in f if line.startswith("version="))
    assert get_cann_version() == version and get_cann_version("HCCL") == ""
    with pytest.raises(ValueError, match="module"):
        get_cann_version("GPU")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_checksum_flags_a_corrupted_product(dtype):
    torch.manual_seed(1)
    a = torch.randn(32, 64, device="npu", dtype=dtype)
    b = torch.randn(64, 16, device="npu", dtype=dtype)
    c = a @ b
    assert not torch_npu.matmul_checksum(a, b, c).item()
    c[3, 4] += c.abs().max() * 0.5
    flag = torch_npu.matmul_checksum(a, b, c)
    assert flag.device.type == "npu" and flag.dtype == torch.bool and flag.item()
    with pytest.raises(TypeError, match="bfloat16 and float32"):
        torch_npu.matmul_checksum(a.half(), b.half(), c.half())


def test_profiler_supported_sets():
    prof = torch_npu.profiler
    assert prof.supported_ai_core_metrics() == {prof.AiCMetrics.AiCoreNone}
    assert prof.supported_export_type() == {prof.ExportType.Text}
    assert prof.ProfilerLevel.Level1 in prof.supported_profiler_level()
    with pytest.warns(UserWarning, match="host_sys"):
        prof._ExperimentalConfig(host_sys=[prof.HostSystem.CPU]).check()
