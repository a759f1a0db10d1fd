"""Compiled npu code is compiled CPU code: Inductor generates the same C++ kernels for a model on npu as on cpu.

npu kernels come from Inductor's CPU C++ backend; ``npudist.compile.cpp_parity`` makes Inductor take its CPU
branches for npu wherever it decides by device type. Comparing the generated kernel sources of fwd + bwd, for
models that hit each of those branches, fails if any device-type decision still differs (slower code, different
rounding or a wrong answer on npu). The argmax case is also checked against eager: it was a wrong answer.
"""
import re

import pytest
import torch
from torch import nn
from torch._inductor.utils import run_and_get_code


pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("compile")]

_KERNEL = re.compile(r"cpp_pybinding\(\[.*?\], r?'''(.*?)'''\)", re.S)


class NormAndScale(nn.Module):
    """LayerNorm (variance), division by a constant, cat/stack and an RMSNorm-style reduction."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(48)
        self.proj = nn.Linear(48, 48)

    def forward(self, x):
        h = self.norm(x) / 7.0
        pairs = h.unflatten(-1, (-1, 2))
        rotated = torch.stack((pairs[..., 0] - pairs[..., 1], pairs[..., 0] + pairs[..., 1]), dim=-1).flatten(-2)
        h = torch.cat((rotated, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)), dim=-1)
        return h.var(dim=-1, keepdim=True) + self.proj(x)


def _norm():
    return NormAndScale(), (torch.randn(4, 10, 48),)


def _kernels(make, device: str) -> list[str]:
    torch.manual_seed(0)
    model, inputs = make()
    model = model.to(device)
    inputs = [t.to(device) for t in inputs]
    torch._dynamo.reset()

    def step():
        model(*inputs).square().mean().backward()

    with torch._inductor.config.patch(force_disable_caches=True):
        _, sources = run_and_get_code(torch.compile(step))
    kernels = [k for src in sources for k in _KERNEL.findall(src)]
    assert kernels, "no C++ kernels found in the generated code"
    return kernels


def test_npu_gets_the_cpu_kernels():
    # One model reaches every wrapped branch (the Llama block's RoPE is its stack/cat case); compiling the block too
    # would double the test's CI time (g++ on four graphs) for no branch more. benchmarks/compile.py runs the block.
    cpu, npu = _kernels(_norm, "cpu"), _kernels(_norm, "npu")
    assert len(npu) == len(cpu)
    for i, (c, n) in enumerate(zip(cpu, npu)):
        assert n == c, f"kernel {i} differs between npu and cpu:\n--- cpu\n{c}\n--- npu\n{n}"


def test_argmax_of_a_permuted_tensor_matches_eager():
    x = torch.randn(5, 7, 3, device="npu")

    def f(t):
        p = t.permute(2, 0, 1)
        return p.argmax(), p.argmin()

    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        got = torch.compile(f)(x)
    for g, e in zip(got, f(x)):
        assert torch.equal(g.cpu(), e.cpu()), (g, e)
