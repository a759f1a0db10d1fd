"""Layout and cast operators, each the aten composition its documentation describes (so autograd, fake tensors,
torch.compile and DTensor see the aten ops they decompose into).

* ``npu_transpose(self, perm, require_contiguous=True)``: ``self.permute(perm)``, contiguous.
* ``npu_confusion_transpose(self, perm, shape, transpose_first)``: permute then reshape (transpose_first) or
  reshape then permute.
* ``npu_broadcast(self, size)``: ``self.expand(size)``, contiguous (new dims in front).
* ``npu_pad(input, paddings)``: zero padding; ``paddings`` are (before, after) pairs from the first dim on.
* ``npu_one_hot(self, num_classes=-1, depth=1, on_value=1, off_value=0)``: a ``depth``-long one-hot axis inserted
  at axis ``num_classes`` (-1: last, as the documented example), float32 ``on_value`` where the class equals the
  position and ``off_value`` elsewhere (classes outside [0, depth) give a row of ``off_value``).
* ``npu_dtype_cast(self, dtype, input_dtype=None)``: ``self.to(dtype)``; ``input_dtype`` names the input's own
  dtype (Ascend uses it for dtypes torch lacks) and must equal it here.
"""
from __future__ import annotations

import torch


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def npu_transpose(self, perm, require_contiguous=True):
    if sorted(d % max(self.dim(), 1) for d in perm) != list(range(self.dim())):
        _fail("npu_transpose", f"perm {list(perm)} is not a permutation of the {self.dim()} dims")
    return self.permute(perm).contiguous()


def npu_confusion_transpose(self, perm, shape, transpose_first):
    if transpose_first:
        return npu_transpose(self, perm).reshape(shape)
    return npu_transpose(self.reshape(shape), perm)


def npu_broadcast(self, size):
    return self.expand(size).contiguous()


def npu_pad(input, paddings):
    if len(paddings) % 2 or len(paddings) > 2 * input.dim():
        _fail("npu_pad", f"paddings must be (before, after) pairs for at most {input.dim()} dims, got {list(paddings)}")
    pairs = [paddings[i:i + 2] for i in range(0, len(paddings), 2)]
    # torch.nn.functional.pad takes pairs from the last dim backwards
    return torch.nn.functional.pad(input, [p for pair in reversed(pairs) for p in pair])


def npu_one_hot(self, num_classes=-1, depth=1, on_value=1, off_value=0):
    if depth < 1:
        _fail("npu_one_hot", f"depth must be >= 1, got {depth}")
    axis = num_classes if num_classes >= 0 else self.dim() + 1 + num_classes
    if not 0 <= axis <= self.dim():
        _fail("npu_one_hot", f"axis (num_classes) {num_classes} is out of range for a {self.dim()}-D input")
    classes = torch.arange(depth, device=self.device).view(-1, *([1] * (self.dim() - axis)))
    hit = self.unsqueeze(axis) == classes
    on = torch.full((), on_value, dtype=torch.float32, device=self.device)
    off = torch.full((), off_value, dtype=torch.float32, device=self.device)
    return torch.where(hit, on, off)


def npu_dtype_cast(self, dtype, input_dtype=None):
    if input_dtype is not None and input_dtype != self.dtype:
        _fail("npu_dtype_cast", f"input_dtype {input_dtype} differs from the input's dtype {self.dtype} (Ascend uses "
                                f"it for dtypes torch lacks, which npu tensors cannot hold)")
    return self.to(dtype)


_lib = torch.library.Library("npu", "FRAGMENT")
for _name, _schema, _fn in (
        ("npu_transpose", "(Tensor self, int[] perm, bool require_contiguous=True) -> Tensor", npu_transpose),
        ("npu_confusion_transpose", "(Tensor self, int[] perm, SymInt[] shape, bool transpose_first) -> Tensor",
         npu_confusion_transpose),
        ("npu_broadcast", "(Tensor self, SymInt[] size) -> Tensor", npu_broadcast),
        ("npu_pad", "(Tensor input, SymInt[] paddings) -> Tensor", npu_pad),
        ("npu_one_hot", "(Tensor self, int num_classes=-1, int depth=1, Scalar on_value=1, Scalar off_value=0) "
                        "-> Tensor", npu_one_hot),
        ("npu_dtype_cast", "(Tensor self, ScalarType dtype, ScalarType? input_dtype=None) -> Tensor",
         npu_dtype_cast)):
    _lib.define(_name + _schema)
    _lib.impl(_name, _fn, "CompositeImplicitAutograd")
