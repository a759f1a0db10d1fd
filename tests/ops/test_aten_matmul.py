"""aten.matmul_backward's npu kernel equals autograd's gradients of torch.matmul, for every operand rank form."""
import pytest
import torch

NPU = torch.device("npu:0")


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                   ((4,), (4, 5)), ((2, 3, 4), (4,)), ((4,), (4,)), ((1, 3, 4), (2, 4, 5))])
def test_matmul_backward_matches_autograd(sa, sb):
    a = torch.randn(sa, dtype=torch.float64, requires_grad=True)
    b = torch.randn(sb, dtype=torch.float64, requires_grad=True)
    out = torch.matmul(a, b)
    g = torch.randn_like(out)
    da, db = torch.autograd.grad(out, (a, b), g)
    dan, dbn = torch.ops.aten.matmul_backward(g.to(NPU), a.detach().to(NPU), b.detach().to(NPU), [True, True])
    torch.testing.assert_close(dan.cpu(), da)
    torch.testing.assert_close(dbn.cpu(), db)
    meta = torch.ops.aten.matmul_backward(g.to("meta"), a.to("meta"), b.to("meta"), [True, True])
    assert [t.shape for t in meta] == [a.shape, b.shape]
