"""torch_npu's MX-quantised grouped matmul accumulated in place, ``npu_add_quant_gmm_`` (the micro-batch gradient
accumulation of ``npu_grouped_matmul_add_`` on float8 operands).

``npu_add_quant_gmm_(self, x1, x2, x2_scale, group_list, *, x1_scale, group_list_type=0, ...)``: ``x1`` (K, M) and
``x2`` (K, N) float8 (e4m3fn / e5m2) split along K into the groups ``group_list`` gives (cumulative ends with
``group_list_type`` 0, sizes with 1); ``self`` (g, M, N) float32 gets ``self[i] += x1_i^T x2_i`` of the
dequantised operands, each element times its MX scale: within group ``i``, runs of 32 rows of K share one e8m0
scale per column, laid out as npu_grouped_dynamic_mx_quant writes them -- ((K / 64) + g, M or N, 2): each group's
blocks in pairs ``[p, column, 0 / 1]``, the groups one after another. So ``x1 = npu_grouped_dynamic_mx_quant(a)``
and ``x2 = ...(b)`` with one ``group_list`` give ``self[i] += a_i^T b_i`` up to the float8 rounding. Rows of K
past the last group do not take part. Returns ``self``.

The scales are e8m0 codes: ``torch.float8_e8m0fnu`` tensors, or 8-bit tensors (uint8) with ``x1_scale_dtype`` /
``x2_scale_dtype`` = 293 (torch_npu.float8_e8m0fnu) as the page asks.

Refused with a ValueError naming the argument: the T-T / T-C modes (float32 scales: the page documents them for
hifloat8 operands only, an Ascend format without a torch dtype or documented bit layout; ``x1_dtype`` /
``x2_dtype`` hifloat8 likewise) and ``group_sizes`` (only None is supported).
"""
from __future__ import annotations

import torch
from torch.library import custom_op

_OP = "npu_add_quant_gmm_"
_E8M0 = 293
_BLOCK = 32


def _fail(msg):
    raise ValueError(f"{_OP}: {msg}")


def _scale_codes(name, t, declared):
    if t is None:
        _fail(f"{name} is required (the MX mode scales both operands)")
    if t.dtype == torch.float8_e8m0fnu:
        return t.view(torch.uint8)
    if t.dtype in (torch.float32, torch.float16, torch.bfloat16):
        _fail(f"{name}: float scales (the T-T / T-C modes) are documented for hifloat8 operands only, which have no "
              f"torch dtype; pass e8m0 scales (MX mode)")
    if t.element_size() != 1 or declared != _E8M0:
        _fail(f"{name} must be torch.float8_e8m0fnu, or 8-bit with {name}_dtype={_E8M0} (float8_e8m0fnu), got "
              f"{t.dtype} with {name}_dtype={declared}")
    return t.view(torch.uint8)


def _check(y, x1, x2, group_list, group_list_type):
    if x1.dim() != 2 or x2.dim() != 2 or x1.shape[0] != x2.shape[0]:
        _fail(f"x1 (K, M) and x2 (K, N) must be 2-D with one K, got {tuple(x1.shape)} and {tuple(x2.shape)}")
    for name, t in (("x1", x1), ("x2", x2)):
        if t.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
            _fail(f"{name} must be float8_e4m3fn or float8_e5m2 (hifloat8 has no torch dtype), got {t.dtype}")
    if group_list.dim() != 1 or group_list.is_floating_point():
        _fail(f"group_list must be a 1-D integer tensor, got {group_list.dtype} {tuple(group_list.shape)}")
    g = group_list.shape[0]
    if y.dtype != torch.float32 or tuple(y.shape) != (g, x1.shape[1], x2.shape[1]):
        _fail(f"self must be float32 (g, M, N) = ({g}, {x1.shape[1]}, {x2.shape[1]}), got {y.dtype} "
              f"{tuple(y.shape)}")
    if group_list_type not in (0, 1):
        _fail(f"group_list_type must be 0 (cumsum) or 1 (sizes), got {group_list_type}")


def _dequantised(x, codes, ends, width):
    """float64 x with each group's 32-row blocks times their e8m0 scale (codes ((K/64)+g, width, 2))."""
    sizes = [end - start for start, end in zip([0] + ends, ends)]
    needed = sum((-(-size // _BLOCK) + 1) // 2 for size in sizes)
    if codes.dim() != 3 or needed > codes.shape[0] or codes.shape[1] != width or codes.shape[2] != 2:
        _fail(f"the scales must be ((K / 64) + g, {width}, 2) with room for {needed} block pairs, got "
              f"{tuple(codes.shape)}")
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    pair_row, start = 0, 0
    for end in ends:
        blocks = -(-(end - start) // _BLOCK)
        for b in range(blocks):
            a, z = start + b * _BLOCK, min(start + (b + 1) * _BLOCK, end)
            scale = torch.pow(2.0, codes[pair_row + b // 2, :, b % 2].double() - 127)
            out[a:z] = x[a:z].double() * scale
        pair_row += (blocks + 1) // 2
        start = end
    return out


@custom_op("npu::_add_quant_gmm_", mutates_args=("y",), device_types="npu",
           schema="(Tensor(a!) y, Tensor x1, Tensor x2, Tensor x1_codes, Tensor x2_codes, Tensor group_list, "
                  "int group_list_type) -> ()")
def _add_quant_gmm(y, x1, x2, x1_codes, x2_codes, group_list, group_list_type):
    _check(y, x1, x2, group_list, group_list_type)
    values = [int(v) for v in group_list.tolist()]
    ends = values if group_list_type == 0 else [sum(values[:i + 1]) for i in range(len(values))]
    if any(v < 0 for v in values) or any(b < a for a, b in zip([0] + ends, ends)) or (ends and ends[-1] > x1.shape[0]):
        _fail(f"group_list must describe groups within x1's {x1.shape[0]} rows of K, got {values}")
    a = _dequantised(x1, x1_codes, ends, x1.shape[1])
    b = _dequantised(x2, x2_codes, ends, x2.shape[1])
    start = 0
    for i, end in enumerate(ends):
        y[i] += (a[start:end].t() @ b[start:end]).to(y.dtype)
        start = end


@_add_quant_gmm.register_fake
def _(y, x1, x2, x1_codes, x2_codes, group_list, group_list_type):
    _check(y, x1, x2, group_list, group_list_type)


def npu_add_quant_gmm_(self, x1, x2, x2_scale, group_list, *, x1_scale=None, group_list_type=0, group_sizes=None,
                       x1_dtype=None, x2_dtype=None, x1_scale_dtype=None, x2_scale_dtype=None):
    if group_sizes is not None:
        _fail(f"group_sizes must be None (the only supported value), got {group_sizes}")
    for name, v in (("x1_dtype", x1_dtype), ("x2_dtype", x2_dtype)):
        if v is not None:
            _fail(f"{name} (hifloat8) is not supported: it has no torch dtype or documented bit layout")
    c1 = _scale_codes("x1_scale", x1_scale, x1_scale_dtype)
    c2 = _scale_codes("x2_scale", x2_scale, x2_scale_dtype)
    torch.ops.npu._add_quant_gmm_(self, x1, x2, c1, c2, group_list, 0 if group_list_type is None else group_list_type)
    return self


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_add_quant_gmm_(Tensor(a!) self, Tensor x1, Tensor x2, Tensor x2_scale, Tensor group_list, *, "
            "Tensor? x1_scale=None, int? group_list_type=0, int[]? group_sizes=None, int? x1_dtype=None, "
            "int? x2_dtype=None, int? x1_scale_dtype=None, int? x2_scale_dtype=None) -> Tensor(a!)")
_lib.impl("npu_add_quant_gmm_", npu_add_quant_gmm_, "CompositeImplicitAutograd")
