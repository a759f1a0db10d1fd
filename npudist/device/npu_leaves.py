"""The npu tensors an op touches, as the dispatch modes that watch npu ops see them (the stream sanitizer,
op dump): tensors with device memory behind them, found anywhere in an op's arguments or results."""
from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils import _pytree as pytree

NO_DATA = (FakeTensor, FunctionalTensor)   # tensors without device memory


def npu_tensors(value: Any) -> list[torch.Tensor]:
    """The npu tensors with memory among ``value``'s pytree leaves."""
    return [t for t in pytree.tree_leaves(value)
            if isinstance(t, torch.Tensor) and t.device.type == "npu" and not isinstance(t, NO_DATA)]
