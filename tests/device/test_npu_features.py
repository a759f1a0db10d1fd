"""What else is expected of a device: save/load, pickling, autocast, pin_memory, assert_close, printing."""
import io
import pickle

import pytest
import torch
import torch.nn as nn


def test_save_load_tensors_and_modules_with_map_location():
    m = nn.Linear(4, 3).to("npu:1")
    t = torch.arange(6.0, device="npu:2").view(2, 3)
    f = io.BytesIO()
    torch.save({"model": m.state_dict(), "t": t, "view": t[:, 1]}, f)
    f.seek(0)
    same = torch.load(f)
    assert same["t"].device == torch.device("npu:2") and same["model"]["weight"].device == torch.device("npu:1")
    assert same["view"].untyped_storage().data_ptr() == same["t"].untyped_storage().data_ptr()
    f.seek(0)
    moved = torch.load(f, map_location="npu:0")
    assert moved["t"].device == torch.device("npu:0") and torch.equal(moved["t"].cpu(), t.cpu())
    f.seek(0)
    on_cpu = torch.load(f, map_location="cpu")
    assert on_cpu["model"]["weight"].device.type == "cpu"
    assert torch.equal(on_cpu["model"]["weight"], m.weight.detach().cpu())
    f.seek(0)
    to_npu = torch.load(io.BytesIO(_saved_cpu()), map_location=torch.device("npu:3"))
    assert to_npu.device == torch.device("npu:3")


def _saved_cpu() -> bytes:
    f = io.BytesIO()
    torch.save(torch.ones(3), f)
    return f.getvalue()


def test_pickle_module_and_tensor():
    m = nn.Sequential(nn.Linear(2, 2)).npu()
    m2 = pickle.loads(pickle.dumps(m))
    assert m2[0].weight.device.type == "npu" and torch.equal(m2[0].weight.cpu(), m[0].weight.cpu())
    t = torch.randn(3, 3, device="npu").t()
    u = pickle.loads(pickle.dumps(t))
    assert u.stride() == t.stride() and torch.equal(u.cpu(), t.cpu())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast(dtype):
    a = torch.randn(8, 8, device="npu")
    b = torch.randn(8, 8, device="npu")
    with torch.autocast("npu", dtype=dtype):
        mm = a @ b
        lin = nn.functional.linear(a, b)
        sm = torch.softmax(mm, dim=-1)  # fp32 policy
        e = torch.exp(mm)
    assert mm.dtype == dtype and lin.dtype == dtype
    assert sm.dtype == torch.float32 and e.dtype == torch.float32
    assert torch.equal(mm.cpu(), (a.cpu().to(dtype) @ b.cpu().to(dtype)))
    assert torch.npu.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    with torch.npu.amp.autocast(dtype=dtype):
        assert (a @ b).dtype == dtype
    assert (a @ b).dtype == torch.float32


def test_autocast_training_step_with_grad_scaler():
    model = nn.Linear(4, 2).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("npu")
    with torch.autocast("npu", dtype=torch.float16):
        loss = model(torch.randn(3, 4, device="npu")).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert model.weight.grad is not None and model.weight.dtype == torch.float32


def test_pin_memory():
    t = torch.randn(16)
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned()
    assert torch.equal(p, t)
    n = p.to("npu", non_blocking=True)
    assert torch.equal(n.cpu(), t)
    with pytest.raises(ValueError, match="pinned"):
        torch.empty(2, device="npu", pin_memory=True)


def test_assert_close_and_printing():
    c = torch.randn(5)
    n = c.npu()
    torch.testing.assert_close(n, n.clone())
    torch.testing.assert_close(n, c, check_device=False)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(n, (c + 1).npu())
    assert "npu:0" in str(n) and str(n.cpu()) in str(n).replace(", device='npu:0'", "")
    assert "dtype=torch.float16" in repr(n.half())
