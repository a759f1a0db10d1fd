"""``module.npu()`` / ``module.to("npu")`` keep the Parameter objects (as ``.cuda()`` does), so an optimizer
created before the move — accelerate's ``prepare(model, optimizer)`` — updates the moved parameters."""
import torch


def test_module_move_keeps_parameters_and_optimizer_trains_them():
    m = torch.nn.Linear(3, 2)
    params = list(m.parameters())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m.to("npu")
    assert all(a is b for a, b in zip(params, m.parameters()))
    assert all(p.device.type == "npu" and isinstance(p, torch.nn.Parameter) for p in m.parameters())
    before = m.weight.detach().cpu().clone()
    m(torch.randn(4, 3, device="npu")).sum().backward()
    opt.step()
    assert not torch.equal(m.weight.detach().cpu(), before)
    m.cpu()
    assert all(a is b for a, b in zip(params, m.parameters())) and m.weight.device.type == "cpu"


def test_data_swap_between_cpu_and_npu():
    x = torch.zeros(3)
    x.data = torch.ones(3, device="npu")
    assert x.device.type == "npu" and x.cpu().tolist() == [1.0, 1.0, 1.0]
    sparse = torch.zeros(3).to_sparse()
    assert not torch._has_compatible_shallow_copy_type(torch.zeros(3, device="npu"), sparse)
