"""torch_npu's quantised matmuls with a fused epilogue, on the integer product of npudist.ops.quant (exact in
float64, the int32 bias added to it, then the scales, then a floating bias). Inference operators: no backward;
fake tensors and compile come from the aten ops.

* ``npu_quant_matmul_gelu(x1, x2, x1_scale, x2_scale, *, bias=None, approximate="gelu_erf")``:
  ``gelu((x1 @ x2 [+ int32 bias]) * x1_scale[m] * x2_scale[n] [+ float bias])``, ``x1_scale`` per token (m,),
  ``x2_scale`` per channel (n,) or per tensor (1,); x1/x2 int8 (A8W8) or int32 holding 8 int4 each (A4W4, packed
  along the last dim as npudist.ops.quant describes); batch dims broadcast. ``approximate`` "gelu_erf" or
  "gelu_tanh". The output is float16 for a float32 ``x2_scale`` and bfloat16 for a bfloat16 one.
* ``npu_quant_matmul_reduce_sum(x1, x2, *, x1_scale, x2_scale)``: ``sum_i (x1[i] @ x2[i]) * x1_scale[i, :, None]
  * x2_scale[None, :]`` over the batch, x1 (batch, m, k) int8, x2 (batch, k, n) int8, x1_scale (batch, m)
  float32, x2_scale (n,) bfloat16; the (m, n) result is bfloat16.

Refused with a ValueError naming the argument: ``torch.quint4x2`` operands of ``npu_quant_matmul_gelu`` (pass
the int32-packed form: torch has no plain int4 tensors to compute on).
"""
from __future__ import annotations

import torch

from npudist.ops.quant import dequant_product

_GELU = {"gelu_erf": "none", "gelu_tanh": "tanh"}


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def npu_quant_matmul_gelu(x1, x2, x1_scale, x2_scale, *, bias=None, approximate="gelu_erf"):
    op = "npu_quant_matmul_gelu"
    approximate = "gelu_erf" if approximate is None else approximate
    if approximate not in _GELU:
        _fail(op, f"approximate must be 'gelu_erf' or 'gelu_tanh', got {approximate!r}")
    if torch.quint4x2 in (x1.dtype, x2.dtype):
        _fail(op, "x1/x2 of torch.quint4x2 are not supported; pass int4 packed 8 per int32 (dtype torch.int32)")
    if x1.dtype != x2.dtype or x1.dtype not in (torch.int8, torch.int32):
        _fail(op, f"x1 and x2 must both be int8 (A8W8), or both int32 holding int4 (A4W4), got {x1.dtype} and "
                  f"{x2.dtype}")
    if not 2 <= x1.dim() <= 6 or not 2 <= x2.dim() <= 6:
        _fail(op, f"x1 and x2 must have 2 to 6 dims, got {x1.dim()} and {x2.dim()}")
    if x2_scale.dtype not in (torch.float32, torch.bfloat16):
        _fail(op, f"x2_scale must be float32 (float16 output) or bfloat16 (bfloat16 output), got {x2_scale.dtype}")
    if x1_scale.dim() != 1:
        _fail(op, f"x1_scale must be 1-D (m,) (one scale per token), got {tuple(x1_scale.shape)}")
    y = dequant_product(op, x1, x2, x2_scale, x1_scale, bias)
    y = torch.nn.functional.gelu(y, approximate=_GELU[approximate])
    return y.to(torch.float16 if x2_scale.dtype == torch.float32 else torch.bfloat16)


def npu_quant_matmul_reduce_sum(x1, x2, *, x1_scale=None, x2_scale=None):
    op = "npu_quant_matmul_reduce_sum"
    if x1_scale is None or x2_scale is None:
        _fail(op, "x1_scale and x2_scale are required (the formula scales every product)")
    if x1.dtype != torch.int8 or x2.dtype != torch.int8:
        _fail(op, f"x1 and x2 must be int8, got {x1.dtype} and {x2.dtype}")
    if x1.dim() != 3 or x2.dim() != 3 or x1.shape[0] != x2.shape[0] or x1.shape[2] != x2.shape[1]:
        _fail(op, f"x1 must be (batch, m, k) and x2 (batch, k, n), got {tuple(x1.shape)} and {tuple(x2.shape)}")
    b, m, _ = x1.shape
    n = x2.shape[2]
    if tuple(x1_scale.shape) != (b, m):
        _fail(op, f"x1_scale must be (batch, m) = ({b}, {m}), got {tuple(x1_scale.shape)}")
    if tuple(x2_scale.shape) != (n,):
        _fail(op, f"x2_scale must be (n,) = ({n},), got {tuple(x2_scale.shape)}")
    # exact integer products in float64 (|sum| < 2^53 for any k below 2^38)
    acc = torch.bmm(x1.double(), x2.double())
    y = (acc * x1_scale.double()[:, :, None] * x2_scale.double()[None, None, :]).sum(0)
    return y.to(torch.bfloat16)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_quant_matmul_gelu(Tensor x1, Tensor x2, Tensor x1_scale, Tensor x2_scale, *, Tensor? bias=None, "
            "str? approximate='gelu_erf') -> Tensor")
_lib.define("npu_quant_matmul_reduce_sum(Tensor x1, Tensor x2, *, Tensor? x1_scale=None, Tensor? x2_scale=None) "
            "-> Tensor")
for _fn in (npu_quant_matmul_gelu, npu_quant_matmul_reduce_sum):
    _lib.impl(_fn.__name__, _fn, "CompositeImplicitAutograd")
