"""`import npudist` registers the npu device the way PyTorch expects of an accelerator."""
import pickle

import torch
import torch.nn as nn

import npudist
import npudist.device.memory


def test_device_module_and_names():
    assert torch._C._get_privateuse1_backend_name() == "npu"
    assert torch.npu is npudist.device
    assert torch.npu.memory is npudist.device.memory
    assert torch.device("npu:1").type == "npu" and torch.device("npu:1").index == 1
    assert torch.accelerator.current_accelerator() == torch.device("npu")
    assert torch.accelerator.device_count() == torch.npu.device_count()
    assert torch._utils._get_available_device_type() == "npu"


def test_memory_names_reexported():
    for name in npudist.device.memory.__all__:
        assert getattr(torch.npu, name) is getattr(npudist.device.memory, name)


def test_generated_methods():
    t = torch.arange(4.0)
    n = t.npu()
    assert n.device == torch.device("npu:0") and n.is_npu
    assert t.npu(1).device == torch.device("npu:1")
    m = nn.Linear(2, 2).npu()
    assert m.weight.device.type == "npu"
    s = torch.arange(3.0).untyped_storage().npu()
    assert s.device.type == "npu"
    assert torch.equal(n.cpu(), t)


def test_printing_and_pickle():
    t = torch.tensor([1.5, -2.0], device="npu")
    r = repr(t)
    assert "device='npu:0'" in r and "1.5000" in r
    u = pickle.loads(pickle.dumps(t))
    assert u.device == t.device and torch.equal(u.cpu(), t.cpu())
