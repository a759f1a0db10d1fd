"""What every operator test module here uses: the npu device, the operator namespace and gradient leaves."""
import torch

NPU = torch.device("npu:0")
ops = torch.ops.npu


def leaf(t):
    """``t`` on npu as a new leaf that records its gradient."""
    return t.detach().to(NPU).requires_grad_(True)


def ref_leaf(t):
    """A copy of ``t`` where it is, as a new leaf for the reference computation."""
    return t.detach().clone().requires_grad_(True)
