"""Detection paths of the ecosystem: distribution metadata, torch_npu top level, torch.npu names; and
``import npudist`` alone changes nothing for cpu code."""
import importlib.metadata
import textwrap

import pytest
import torch

from conftest import run_python


def test_distribution_metadata_matches_version():
    import torch_npu

    assert importlib.metadata.version("torch_npu") == torch_npu.__version__
    assert torch_npu.__version__.startswith(torch.__version__.split("+")[0] + "+npudist")


def test_torch_npu_top_level_reexports_the_npu_operators():
    import torch_npu
    from npudist.ops import OPS

    for name in OPS:
        assert callable(getattr(torch_npu, name)), name
        assert hasattr(torch.ops.npu, name), name
    assert torch_npu.npu_fusion_attention is torch.ops.npu.npu_fusion_attention
    with pytest.raises(AttributeError, match="npu_lstm is an Ascend operator"):
        torch_npu.npu_lstm  # noqa: B018


# Names the libraries call on torch.npu (DeepSpeed, accelerate, transformers, LLaMA-Factory); see
# /work/shared/notes/torch_npu-surface.md in the issue.
TORCH_NPU_NAMES = (
    "Stream", "Event", "stream", "current_stream", "default_stream", "synchronize", "is_bf16_supported",
    "get_device_properties", "_lazy_call", "default_generators", "initial_seed", "memory_cached",
    "max_memory_cached", "reset_max_memory_cached", "reset_max_memory_allocated", "BFloat16Tensor", "ByteTensor",
    "DoubleTensor", "FloatTensor", "HalfTensor", "IntTensor", "LongTensor", "set_compile_mode", "get_device_name",
    "device_count", "set_device", "current_device", "mem_get_info", "empty_cache", "manual_seed_all",
    "get_rng_state", "set_rng_state", "get_rng_state_all",
)


def test_torch_npu_has_the_names_libraries_call():
    import torch_npu  # noqa: F401

    missing = [n for n in TORCH_NPU_NAMES if not hasattr(torch.npu, n)]
    assert not missing
    assert torch.npu.random.get_rng_state_all()[0].dtype == torch.uint8  # transformers' Trainer
    free, total = torch.npu.mem_get_info()
    assert 0 < free <= total
    scaler = torch.npu.amp.GradScaler()
    assert scaler._device == "npu"
    t = torch.npu.BFloat16Tensor(2, 3)
    assert t.device.type == "npu" and t.dtype == torch.bfloat16 and isinstance(t, torch.npu.BFloat16Tensor)
    assert not isinstance(torch.zeros(2, dtype=torch.bfloat16), torch.npu.BFloat16Tensor)  # cpu tensor
    assert torch.npu.LongTensor([1, 2]).tolist() == [1, 2]
    torch.npu.set_compile_mode(jit_compile=False)
    assert torch.npu.is_jit_compile_false()
    torch.npu.set_compile_mode(jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile"):
        torch.npu.set_compile_mode(jit_compile="no")
    assert torch.utils.checkpoint.DefaultDeviceType.get_device_type() == "npu"
    assert torch.distributed.is_hccl_available()


def test_libraries_detect_the_npu():
    res = run_python(textwrap.dedent("""
        import importlib.metadata
        from transformers import LlamaConfig  # failed before: transformers imports npu_fusion_attention
        from transformers.utils import is_torch_npu_available
        from accelerate.utils import is_npu_available
        from accelerate import PartialState
        import torch
        assert is_torch_npu_available() and is_npu_available()
        st = PartialState(cpu=False)
        print("DETECTED", st.device, st.distributed_type, importlib.metadata.version("torch_npu"))
    """))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "DETECTED npu" in res.stdout, res.stdout


def test_import_npudist_alone_changes_nothing_for_cpu_code():
    res = run_python(textwrap.dedent("""
        import sys
        import torch
        torch.manual_seed(0)
        x = torch.randn(4, 8)

        def observe():
            return (torch.nn.functional.silu(x[:, :4]) * x[:, 4:],
                    torch.utils.checkpoint.DefaultDeviceType.get_device_type(), torch.Tensor.to, torch.tensor,
                    torch.cuda.is_available(), torch.distributed.is_nccl_available())
        before = observe()
        import npudist
        assert "torch_npu" not in sys.modules and "torch_npu.contrib.transfer_to_npu" not in sys.modules
        after = observe()
        assert torch.equal(before[0], after[0]) and before[1:] == after[1:], (before[1:], after[1:])
        # the operators are there, on npu tensors
        y = torch.ops.npu.npu_swiglu(x.npu(), dim=-1)
        assert torch.equal(y.cpu(), after[0])
        try:
            torch.ops.npu.npu_swiglu(x)
        except NotImplementedError as e:
            assert "npu::npu_swiglu" in str(e) and "'CPU' backend" in str(e)
        else:
            raise AssertionError("npu operator ran on a cpu tensor")
        print("UNCHANGED")
    """))
    assert res.returncode == 0 and "UNCHANGED" in res.stdout, res.stdout + res.stderr[-3000:]
