"""Quantised linear layers of torch_npu.contrib over ``npu_quant_matmul`` (int8/int4 activations and weights) and
``npu_weight_quant_batchmatmul`` (floating activations, int8/int4 weights). The parameters are made empty, not
trainable, in torch_npu's shapes; a quantised checkpoint fills them (``load_state_dict`` or assignment)."""
from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn.parameter import Parameter

import torch_npu


def _frozen(*shape, dtype=None, device=None):
    return Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class LinearQuant(nn.Module):
    """``y = npu_quant_matmul(x, weight.T, scale, offset=, pertoken_scale=, bias=, output_dtype=)``: the exact integer
    product of int8 (or packed-int4 int32) ``x`` and ``weight`` (out_features, in_features), an int32 ``bias`` added,
    scaled per output column by ``scale`` (and per row by ``pertoken_scale``), ``offset`` added for an int8 output,
    cast to ``output_dtype`` (None: int8). A float32 ``scale`` is used as it is (Ascend first packs it into the
    int64 form ``npu_trans_quant_param`` makes for its kernel; the value computed is the same)."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, offset: bool = False,
                 pertoken_scale: bool = False, device=None, dtype=None, output_dtype=None) -> None:
        super().__init__()
        self.in_features, self.out_features, self.output_dtype = in_features, out_features, output_dtype
        self.weight = _frozen(out_features, in_features)
        self.scale = _frozen(out_features)
        for name, wanted, dt in (("offset", offset, torch.float32), ("pertoken_scale", pertoken_scale, torch.float32),
                                 ("bias", bias, torch.int32)):
            if wanted:
                setattr(self, name, _frozen(out_features, dtype=dt))
            else:
                self.register_parameter(name, None)

    def _check(self, x):
        name = type(self).__name__
        if not ((x.dtype == torch.int32 and self.weight.dtype == torch.int32)
                or (x.dtype == torch.int8 and self.weight.dtype == torch.int8)):
            raise ValueError(f"{name}: input and weight must both be int8 (or both int32, packed int4), got "
                             f"{x.dtype} and {self.weight.dtype}; load the quantised weight first")

    def forward(self, linear_quant_input):
        self._check(linear_quant_input)
        return torch_npu.npu_quant_matmul(linear_quant_input, self.weight.transpose(-2, -1), self.scale,
                                          offset=self.offset, pertoken_scale=self.pertoken_scale, bias=self.bias,
                                          output_dtype=self.output_dtype)


class LinearA8W8Quant(LinearQuant):
    """LinearQuant under its former name (deprecated in torch_npu, with a FutureWarning), checking each
    parameter's dtype before the call."""

    _DTYPES = {"scale": (torch.int64, torch.float32, torch.bfloat16), "offset": (torch.float32,),
               "bias": (torch.int32, torch.bfloat16, torch.float16, torch.float32),
               "pertoken_scale": (torch.float32,)}

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, offset: bool = False,
                 pertoken_scale: bool = False, device=None, dtype=None, output_dtype=None) -> None:
        warnings.warn("torch_npu.contrib.module.LinearA8W8Quant is deprecated: use LinearQuant", FutureWarning,
                      stacklevel=2)
        super().__init__(in_features, out_features, bias=bias, offset=offset, pertoken_scale=pertoken_scale,
                         device=device, dtype=dtype, output_dtype=output_dtype)

    def _check(self, x):
        super()._check(x)
        for name, allowed in self._DTYPES.items():
            value = getattr(self, name)
            if value is not None and value.dtype not in allowed:
                raise ValueError(f"LinearA8W8Quant: {name} must be one of {allowed}, got {value.dtype}")
        if self.output_dtype not in (None, torch.int8, torch.float16, torch.bfloat16):
            raise ValueError(f"LinearA8W8Quant: output_dtype must be int8, float16 or bfloat16, got "
                             f"{self.output_dtype}")


class LinearWeightQuant(nn.Module):
    """Weight-only quantised linear: ``y = x @ ((weight.T + antiquant_offset) * antiquant_scale) + bias`` in
    ``x``'s dtype (``npu_weight_quant_batchmatmul``), the scale/offset per output channel (out_features,) or per
    group of ``antiquant_group_size`` input rows (out_features, groups)."""

    def __init__(self, in_features, out_features, bias: bool = True, device=None, dtype=None,
                 antiquant_offset: bool = False, quant_scale: bool = False, quant_offset: bool = False,
                 antiquant_group_size: int = 0, inner_precise: int = 0, weight_dtype=None) -> None:
        super().__init__()
        self.weight = _frozen(out_features, in_features, device=device)
        self.antiquant_scale = _frozen(out_features, device=device)
        for name, wanted in (("antiquant_offset", antiquant_offset), ("quant_scale", quant_scale),
                             ("quant_offset", quant_offset), ("bias", bias)):
            if wanted:
                setattr(self, name, _frozen(out_features, device=device))
            else:
                self.register_parameter(name, None)
        self.antiquant_group_size, self.inner_precise, self.weight_dtype = (antiquant_group_size, inner_precise,
                                                                            weight_dtype)

    def forward(self, x):
        scale, offset = self.antiquant_scale, self.antiquant_offset
        if scale.dim() == 2:       # stored (out_features, groups); the operator takes (groups, out_features)
            scale = scale.transpose(-1, -2)
        if offset is not None and offset.dim() == 2:
            offset = offset.transpose(-1, -2)
        return torch_npu.npu_weight_quant_batchmatmul(x, self.weight.transpose(-1, -2), scale, offset,
                                                      self.quant_scale, self.quant_offset, self.bias,
                                                      self.antiquant_group_size, self.inner_precise,
                                                      weight_dtype=self.weight_dtype)
