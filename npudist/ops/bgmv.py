"""torch_npu's batched gather matrix-vector product (BGMV, the multi-LoRA kernel), as aten ops (fake tensors,
compile and autograd come from them).

``npu_batch_gather_matmul(input, x, weight_b, indices, weight_a=None, layer_idx=0, scale=1e-3, y_offset=0,
y_slice_size=-1)``: row ``i`` with ``w = indices[i]`` gets
``y[i, y_offset : y_offset + H2] += scale * weight_b[w, layer_idx] @ (weight_a[w, layer_idx] @ x[i])``
(without ``weight_a``: ``scale * weight_b[w, layer_idx] @ x[i]``), ``x`` (batch, H1), ``weight_a`` (W, L, R, H1),
``weight_b`` (W, L, H2, R) or (W, L, H2, H1); the rest of ``y`` is unchanged. ``y_slice_size`` is the width of
the updated range: -1 (the page's default) or H2, the rows ``weight_b`` produces. A negative index leaves its
row unchanged (the page's example draws indices from {-1, 0, 1}: -1 is the no-adapter slot of the BGMV kernels
this op stands for). Products accumulate in float32 (float64 for float64); the result has input's dtype.
``npu_batch_gather_matmul`` returns the updated copy, ``npu_batch_gather_matmul_`` updates ``input`` in place
and returns it.
"""
from __future__ import annotations

import torch

_OP = "npu_batch_gather_matmul"


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _update(op, y, x, weight_b, indices, weight_a, layer_idx, scale, y_offset, y_slice_size):
    """The (batch, H2) update (float32; float64 for float64) and the column where it starts."""
    if y.dim() != 2 or x.dim() != 2 or y.shape[0] != x.shape[0]:
        _fail(op, f"input must be (batch, y_column) and x (batch, H1) with one batch, got {tuple(y.shape)} and "
                  f"{tuple(x.shape)}")
    if indices.dim() != 1 or indices.shape[0] != x.shape[0] or indices.is_floating_point():
        _fail(op, f"indices must be an integer (batch,) = ({x.shape[0]},) tensor, got {indices.dtype} "
                  f"{tuple(indices.shape)}")
    if weight_b.dim() != 4:
        _fail(op, f"weight_b must be 4-D (W, L, H2, R), got {tuple(weight_b.shape)}")
    w_count, layers, h2, inner = weight_b.shape
    if not 0 <= layer_idx < layers:
        _fail(op, f"layer_idx must be in [0, {layers}) (weight_b's L), got {layer_idx}")
    if weight_a is not None:
        if weight_a.dim() != 4 or tuple(weight_a.shape) != (w_count, layers, inner, x.shape[1]):
            _fail(op, f"weight_a must be (W, L, R, H1) = ({w_count}, {layers}, {inner}, {x.shape[1]}), got "
                      f"{tuple(weight_a.shape)}")
    elif inner != x.shape[1]:
        _fail(op, f"without weight_a, weight_b must be (W, L, H2, H1) with H1 = {x.shape[1]}, got "
                  f"{tuple(weight_b.shape)}")
    if y_slice_size not in (-1, h2):
        _fail(op, f"y_slice_size must be -1 or H2 = {h2} (the rows weight_b produces), got {y_slice_size}")
    if y_offset < 0 or y_offset + h2 > y.shape[1]:
        _fail(op, f"y_offset {y_offset} + H2 {h2} must fit in input's {y.shape[1]} columns")
    active = indices >= 0
    idx = indices.long().clamp_min(0)
    acc = torch.float64 if y.dtype == torch.float64 else torch.float32
    h = x.to(acc)
    if weight_a is not None:
        h = torch.einsum("brh,bh->br", weight_a[:, layer_idx].to(acc)[idx], h)
    out = torch.einsum("bor,br->bo", weight_b[:, layer_idx].to(acc)[idx], h) * scale
    return out * active.unsqueeze(-1), y_offset


def npu_batch_gather_matmul(input, x, weight_b, indices, weight_a=None, layer_idx=0, scale=1e-3, y_offset=0,
                            y_slice_size=-1):
    upd, start = _update(_OP, input, x, weight_b, indices, weight_a, layer_idx, scale, y_offset, y_slice_size)
    cols = upd.shape[1]
    mid = (input[:, start:start + cols].to(upd.dtype) + upd).to(input.dtype)
    return torch.cat((input[:, :start], mid, input[:, start + cols:]), dim=1)


def npu_batch_gather_matmul_(input, x, weight_b, indices, weight_a=None, layer_idx=0, scale=1e-3, y_offset=0,
                             y_slice_size=-1):
    upd, start = _update(_OP + "_", input, x, weight_b, indices, weight_a, layer_idx, scale, y_offset, y_slice_size)
    cols = upd.shape[1]
    target = input[:, start:start + cols]
    target.copy_((target.to(upd.dtype) + upd).to(input.dtype))
    return input


_ARGS = ("Tensor x, Tensor weight_b, Tensor indices, Tensor? weight_a=None, int layer_idx=0, float scale=1e-3, "
         "int y_offset=0, int y_slice_size=-1")
_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define(f"npu_batch_gather_matmul(Tensor self, {_ARGS}) -> Tensor")
_lib.define(f"npu_batch_gather_matmul_(Tensor(a!) self, {_ARGS}) -> Tensor(a!)")
for _fn in (npu_batch_gather_matmul, npu_batch_gather_matmul_):
    _lib.impl(_fn.__name__, _fn, "CompositeImplicitAutograd")
