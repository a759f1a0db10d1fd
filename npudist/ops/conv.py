"""torch_npu's convolution operators: ``torch.convolution`` with the documented argument orders.

* ``npu_conv2d`` / ``npu_conv3d`` / ``npu_convolution(input, weight, bias, stride, padding, dilation, groups)``:
  the 2-D, 3-D, or either (by the input's rank) convolution, weight (out_channels, in_channels / groups, k...).
* ``npu_conv_transpose2d`` / ``npu_convolution_transpose(input, weight, bias, padding, output_padding, stride,
  dilation, groups)``: the transposed convolution (2-D; 2-D or 3-D), weight (in_channels, out_channels / groups,
  k...), as ``torch.nn.functional.conv_transpose2d/3d``.

They decompose into ``aten.convolution``, so autograd, fake tensors and compile are PyTorch's.
"""
from __future__ import annotations

import torch

from .tensor_ops import _out_form


def _conv(op, ranks, input, weight, bias, stride, padding, dilation, groups, transposed, output_padding):
    if input.dim() not in ranks or weight.dim() != input.dim():
        want = " or ".join(f"{r}-D" for r in ranks)
        raise ValueError(f"{op}: input and weight must both be {want} (N, C, spatial...), got {input.dim()}-D and "
                         f"{weight.dim()}-D")
    spatial = input.dim() - 2
    for name, v in (("stride", stride), ("padding", padding), ("dilation", dilation),
                    ("output_padding", output_padding)):
        if len(v) not in (1, spatial):
            raise ValueError(f"{op}: {name} needs 1 or {spatial} values, got {list(v)}")
    if groups <= 0 or input.shape[1] % groups:
        raise ValueError(f"{op}: in_channels {input.shape[1]} must be divisible by groups {groups}")

    def full(v):
        return list(v) * spatial if len(v) == 1 else list(v)

    return torch.convolution(input, weight, bias, full(stride), full(padding), full(dilation), transposed,
                             full(output_padding), groups)


def npu_conv2d(input, weight, bias, stride, padding, dilation, groups):
    return _conv("npu_conv2d", (4,), input, weight, bias, stride, padding, dilation, groups, False, [0])


def npu_conv3d(input, weight, bias, stride, padding, dilation, groups):
    return _conv("npu_conv3d", (5,), input, weight, bias, stride, padding, dilation, groups, False, [0])


def npu_convolution(input, weight, bias, stride, padding, dilation, groups):
    return _conv("npu_convolution", (4, 5), input, weight, bias, stride, padding, dilation, groups, False, [0])


def npu_conv_transpose2d(input, weight, bias, padding, output_padding, stride, dilation, groups):
    return _conv("npu_conv_transpose2d", (4,), input, weight, bias, stride, padding, dilation, groups, True,
                 output_padding)


def npu_convolution_transpose(input, weight, bias, padding, output_padding, stride, dilation, groups):
    return _conv("npu_convolution_transpose", (4, 5), input, weight, bias, stride, padding, dilation, groups, True,
                 output_padding)


_FORWARD = "(Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups"
_TRANSPOSED = ("(Tensor input, Tensor weight, Tensor? bias, int[] padding, int[] output_padding, int[] stride, "
               "int[] dilation, int groups")
_lib = torch.library.Library("npu", "FRAGMENT")
for _name, _args, _fn, _with_out in (("npu_conv2d", _FORWARD, npu_conv2d, True),
                                     ("npu_conv3d", _FORWARD, npu_conv3d, True),
                                     ("npu_convolution", _FORWARD, npu_convolution, False),
                                     ("npu_conv_transpose2d", _TRANSPOSED, npu_conv_transpose2d, False),
                                     ("npu_convolution_transpose", _TRANSPOSED, npu_convolution_transpose, False)):
    _lib.define(f"{_name}{_args}) -> Tensor")
    _lib.impl(_name, _fn, "CompositeImplicitAutograd")
    if _with_out:
        _lib.define(f"{_name}.out{_args}, *, Tensor(a!) out) -> Tensor(a!)")
        _lib.impl(f"{_name}.out", _out_form(_fn), "CompositeImplicitAutograd")
