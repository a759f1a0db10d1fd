"""ActivationSwap and OptimizerStateSwap on one npu, in process: what is copied and what is not, gradients equal
to the unswapped module's, backward twice, autograd.grad inside the block's forward, the device memory a
swapped block leaves behind, the optimizer state's round trip."""
import pytest
import torch
from torch import nn

import npudist  # noqa: F401  (registers the npu device)
from npudist.swap.activations import ActivationSwap, apply_activation_swap
from npudist.swap.optimizer_state import OptimizerStateSwap

pytestmark = pytest.mark.timeout(60)
NPU = torch.device("npu", 0)


class Block(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.a, self.b = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        h = self.a(x)
        return x + self.b(torch.nn.functional.gelu(h) * h)


class Stack(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _pair():
    torch.manual_seed(0)
    plain = Stack().to(NPU)
    swapped = Stack().to(NPU)
    swapped.load_state_dict(plain.state_dict())
    return plain, swapped


def _grads(model):
    return [p.grad.cpu() for p in model.parameters()]


def test_gradients_equal_and_saved_bytes_leave_the_device():
    plain, swapped = _pair()
    swap = apply_activation_swap(swapped, [f"layers.{i}" for i in range(3)], {0, 1, 2})
    x = torch.randn(256, 64, device=NPU)
    plain(x).square().sum().backward()
    base = torch.npu.memory_allocated()
    out = swapped(x)
    # The copies to host are queued on the swap stream and hold their sources until they ran (as a block
    # with a recorded stream stays allocated on CUDA until its event completes): count once they ran.
    torch.npu.synchronize()
    kept = torch.npu.memory_allocated() - base
    out.square().sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(_grads(plain), _grads(swapped)))
    # per block: its input (shared by a.weight's matmul and the residual: copied once), h, gelu(h), the
    # product; weights are parameters and stay
    per_block = 4 * (256 * 64 + 3 * 256 * 256)
    assert swap.bytes_out == 3 * per_block
    # what stays on the device after forward: the output and the tensors between blocks still referenced
    # by nothing but the swap -- far less than the three blocks' saved activations
    assert kept < per_block, (kept, per_block)


def test_parameters_and_unswapped_blocks_are_not_copied():
    _, swapped = _pair()
    swap = ActivationSwap(NPU)
    swap.attach(swapped.layers[1], 1)
    swapped(torch.randn(8, 64, device=NPU)).sum().backward()
    assert swap.bytes_out == 4 * (8 * 64 + 3 * 8 * 256)     # block 1's activations only, no weights


def test_backward_twice_and_grad_inside_forward():
    plain, swapped = _pair()
    apply_activation_swap(swapped, [f"layers.{i}" for i in range(3)], {0, 1, 2})
    x = torch.randn(16, 64, device=NPU)
    for model in (plain, swapped):
        out = model(x).square().sum()
        out.backward(retain_graph=True)
        out.backward()
    assert all(torch.equal(a, b) for a, b in zip(_grads(plain), _grads(swapped)))

    class Inner(nn.Module):   # a block that differentiates its own intermediate inside forward
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x).tanh()
            (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
            return y * g

    torch.manual_seed(1)
    a, b = Inner().to(NPU), Inner().to(NPU)
    b.load_state_dict(a.state_dict())
    ActivationSwap(NPU).attach(b, 0)
    xa = torch.randn(4, 8, device=NPU, requires_grad=True)
    xb = xa.detach().clone().requires_grad_()
    a(xa).sum().backward()
    b(xb).sum().backward()
    assert torch.equal(xa.grad, xb.grad) and torch.equal(a.lin.weight.grad, b.lin.weight.grad)


def test_optimizer_state_round_trip():
    torch.manual_seed(0)
    plain, swapped = nn.Linear(32, 32).to(NPU), nn.Linear(32, 32).to(NPU)
    swapped.load_state_dict(plain.state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=False) for m in (plain, swapped)]
    swap = OptimizerStateSwap(opts[1], NPU)
    for step in range(3):
        x = torch.randn(4, 32, device=NPU)
        for model, opt in zip((plain, swapped), opts):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
        states = [t for st in opts[1].state.values() for t in st.values() if t.device.type == "npu"]
        assert states and all(t.untyped_storage().nbytes() == 0 for t in states)   # off the device
    assert swap.host_bytes == 4 * 2 * (32 * 32 + 32)
    assert torch.equal(plain.weight, swapped.weight)
    with swap.resident():   # e.g. to save a checkpoint
        for p_plain, p_swap in zip(plain.parameters(), swapped.parameters()):
            assert torch.equal(opts[0].state[p_plain]["exp_avg_sq"], opts[1].state[p_swap]["exp_avg_sq"])
    assert all(t.untyped_storage().nbytes() == 0 for t in states)
