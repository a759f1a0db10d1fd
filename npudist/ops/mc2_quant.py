"""torch_npu's quantised compute-communication operators over hccl, ``npu_all_gather_quant_mm`` and
``npu_quant_mm_reduce_scatter``, addressed by ``hcom`` like the MC2 operators of npudist.ops.mc2, with the pages'
formulas:

* float16 / bfloat16 ``x1``, ``x2`` (no scales): ``AllGather(x1) @ x2 + bias`` / ``ReduceScatter(x1 @ x2 + bias)``.
* int8 (per token ``x1_scale`` (m, 1), per channel ``x2_scale`` (1, n) or (n,)) and float8 e4m3fn / e5m2 (per
  tensor scales (1,)): ``(x1_scale * x2_scale) * (AllGather(x1) @ x2) + bias`` -- a per-token ``x1_scale`` is
  gathered with x1 -- and ``ReduceScatter((x1_scale * x2_scale) * (x1 @ x2) + bias)`` (each rank's bias inside
  the sum, as the formula has it). The integer / float8 product is exact in float64; ``y_dtype`` (float16,
  bfloat16 or float32, required for these inputs) is the output's dtype; the reduction runs in float32.

``npu_all_gather_quant_mm`` returns ``(output, gather_out, amax)``: ``gather_out = AllGather(x1)`` (rank-major
along dim 0; an empty tensor without ``gather_output``); ``npu_quant_mm_reduce_scatter`` returns ``(output,
amax)``; ``amax`` is the empty tensor the pages give for ``amax_output=False``.

Refused with a ValueError naming the argument: hifloat8 / float4 (``x1_dtype`` / ``x2_dtype``: no torch dtype or
documented bit layout), the per-block and MX scale forms (2-D / 3-D scales of 950 chips), ``quant_scale``,
``group_sizes``, ``block_size`` other than 0, ``amax_output=True`` (the page does not say over what the maximum
is taken), int64 ``x2_scale`` (npu_trans_quant_param's packing), ``gather_index`` other than 0 and
``comm_turn`` other than 0 (as the pages), and ``world_size`` not the group's size.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.library import custom_op

from npudist.ops.mc2 import _COMM_MODES, _WORLD_SIZES, group_of

_AG = "npu_all_gather_quant_mm"
_RS = "npu_quant_mm_reduce_scatter"
_Y_DTYPES = {5: torch.float16, 15: torch.bfloat16, 6: torch.float32}
_LOW = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _check(op, x1, x2, x1_scale, x2_scale, bias, y_dtype, hcom, world_size, comm_turn, comm_mode):
    """The output dtype; every check the real kernel and the fake kernel share."""
    if x1.dim() != 2 or x2.dim() != 2 or x1.shape[1] != x2.shape[0]:
        _fail(op, f"x1 (m, k) and x2 (k, n) must be 2-D and multiply, got {tuple(x1.shape)} and {tuple(x2.shape)}")
    if x1.dtype != x2.dtype and not {x1.dtype, x2.dtype} <= {torch.float8_e4m3fn, torch.float8_e5m2}:
        _fail(op, f"x1 and x2 must share a dtype, got {x1.dtype} and {x2.dtype}")
    m, n = x1.shape[0], x2.shape[1]
    if x1.dtype in (torch.float16, torch.bfloat16):
        if x1_scale is not None or x2_scale is not None:
            _fail(op, "x1_scale / x2_scale must be None for float16 / bfloat16 inputs")
        if y_dtype is not None and _Y_DTYPES.get(y_dtype) != x1.dtype:
            _fail(op, f"y_dtype must be None or x1's dtype {x1.dtype} for float16 / bfloat16 inputs, got {y_dtype}")
        out_dtype = x1.dtype
    elif x1.dtype in _LOW:
        if y_dtype not in _Y_DTYPES:
            _fail(op, f"y_dtype is required for {x1.dtype} inputs: torch.float16, torch.bfloat16 or torch.float32, "
                      f"got {y_dtype}")
        out_dtype = _Y_DTYPES[y_dtype]
        if x1_scale is None or x2_scale is None:
            _fail(op, "x1_scale and x2_scale are required for quantised inputs")
        for name, t in (("x1_scale", x1_scale), ("x2_scale", x2_scale)):
            if t.dtype != torch.float32:
                _fail(op, f"{name} must be float32 (int64 is npu_trans_quant_param's packing), got {t.dtype}")
        if x1.dtype == torch.int8:
            ok1 = tuple(x1_scale.shape) in ((m, 1), (1,))
            ok2 = tuple(x2_scale.shape) in ((1, n), (n,), (1,))
        else:
            ok1, ok2 = x1_scale.numel() == 1 and x1_scale.dim() == 1, x2_scale.numel() == 1 and x2_scale.dim() == 1
        if not (ok1 and ok2):
            _fail(op, f"x1_scale / x2_scale must be per token (m, 1) / per channel (1, n) for int8 and per tensor "
                      f"(1,) for float8 (per-block and MX scales are not supported), got {tuple(x1_scale.shape)} "
                      f"and {tuple(x2_scale.shape)}")
    else:
        _fail(op, f"x1 must be float16, bfloat16, int8, float8_e4m3fn or float8_e5m2, got {x1.dtype}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        _fail(op, f"bias must be 1-D of size n = {n}, got {tuple(bias.shape)}")
    if comm_turn != 0:
        _fail(op, f"comm_turn must be 0 (the pages' only value), got {comm_turn}")
    if comm_mode not in _COMM_MODES:
        _fail(op, f"comm_mode must be None, 'ai_cpu' or 'aiv', got {comm_mode!r}")
    if world_size not in _WORLD_SIZES:
        _fail(op, f"world_size must be one of {_WORLD_SIZES}, got {world_size}")
    return out_dtype


def _product(x1, x2, x1_scale, x2_scale, bias, out_dtype):
    if x1_scale is None:
        out = torch.matmul(x1, x2)
        return out if bias is None else out + bias.to(out.dtype)
    acc = torch.matmul(x1.double(), x2.double()) * x1_scale.double().reshape(-1, 1) * x2_scale.double().reshape(1, -1)
    if bias is not None:
        acc = acc + bias.double()
    return acc.to(out_dtype)


def _refuse_common(op, quant_scale, block_size, group_sizes, amax_output, x1_dtype, x2_dtype, x1_scale_dtype,
                   x2_scale_dtype):
    for name, value in (("x1_dtype", x1_dtype), ("x2_dtype", x2_dtype), ("x1_scale_dtype", x1_scale_dtype),
                        ("x2_scale_dtype", x2_scale_dtype)):
        if value is not None:
            _fail(op, f"{name} is not supported (hifloat8 / float4 / e8m0 have no computable torch dtype here)")
    if quant_scale is not None:
        _fail(op, "quant_scale must be None (the only supported value)")
    if block_size != 0 or group_sizes is not None:
        _fail(op, "block_size must be 0 and group_sizes None (the per-block forms are not supported)")
    if amax_output:
        _fail(op, "amax_output=True is not supported: the page does not say over what the maximum is taken")


@custom_op("npu::_all_gather_quant_mm", mutates_args=(), device_types="npu", schema=(
    "(Tensor x1, Tensor x2, str hcom, int world_size, Tensor? bias, Tensor? x1_scale, Tensor? x2_scale, "
    "bool gather_output, int comm_turn, int? y_dtype, str? comm_mode) -> (Tensor, Tensor)"))
def _all_gather_quant_mm(x1, x2, hcom, world_size, bias, x1_scale, x2_scale, gather_output, comm_turn, y_dtype,
                         comm_mode):
    out_dtype = _check(_AG, x1, x2, x1_scale, x2_scale, bias, y_dtype, hcom, world_size, comm_turn, comm_mode)
    group = group_of(hcom, _AG)
    if group.size() != world_size:
        _fail(_AG, f"world_size={world_size} but the group hcom names has {group.size()} ranks")
    wire = x1.view(torch.uint8) if x1.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else x1
    gathered = wire.new_empty((x1.shape[0] * world_size, x1.shape[1]))
    dist.all_gather_single(gathered, wire.contiguous(), group=group)
    gathered = gathered.view(x1.dtype)
    scale = x1_scale
    if x1_scale is not None and x1_scale.dim() == 2:  # per token: each rank's rows bring their scales
        scale = x1_scale.new_empty((x1_scale.shape[0] * world_size, 1))
        dist.all_gather_single(scale, x1_scale.contiguous(), group=group)
    out = _product(gathered, x2, scale, x2_scale, bias, out_dtype)
    return out, gathered.clone() if gather_output else x1.new_empty((0,))


@_all_gather_quant_mm.register_fake
def _(x1, x2, hcom, world_size, bias, x1_scale, x2_scale, gather_output, comm_turn, y_dtype, comm_mode):
    out_dtype = _check(_AG, x1, x2, x1_scale, x2_scale, bias, y_dtype, hcom, world_size, comm_turn, comm_mode)
    rows = x1.shape[0] * world_size
    return (x1.new_empty((rows, x2.shape[1]), dtype=out_dtype),
            x1.new_empty((rows, x1.shape[1]) if gather_output else (0,)))


def npu_all_gather_quant_mm(self, x2, hcom, world_size, *, bias=None, x1_scale=None, x2_scale=None, quant_scale=None,
                            block_size=0, gather_index=0, gather_output=True, comm_turn=0, group_sizes=None,
                            amax_output=False, y_dtype=None, x1_dtype=None, x2_dtype=None, x1_scale_dtype=None,
                            x2_scale_dtype=None, comm_mode=None):
    _refuse_common(_AG, quant_scale, block_size, group_sizes, amax_output, x1_dtype, x2_dtype, x1_scale_dtype,
                   x2_scale_dtype)
    if gather_index != 0:
        _fail(_AG, f"gather_index must be 0 (gather x1; the page's only value), got {gather_index}")
    out, gathered = torch.ops.npu._all_gather_quant_mm(self, x2, hcom, world_size, bias, x1_scale, x2_scale,
                                                       gather_output, comm_turn, y_dtype, comm_mode)
    return out, gathered, self.new_empty((0,), dtype=torch.float32)


@custom_op("npu::_quant_mm_reduce_scatter", mutates_args=(), device_types="npu", schema=(
    "(Tensor x1, Tensor x2, str hcom, int world_size, str reduce_op, Tensor? bias, Tensor? x1_scale, "
    "Tensor? x2_scale, int comm_turn, int? y_dtype, str? comm_mode) -> Tensor"))
def _quant_mm_reduce_scatter(x1, x2, hcom, world_size, reduce_op, bias, x1_scale, x2_scale, comm_turn, y_dtype,
                             comm_mode):
    out_dtype = _check(_RS, x1, x2, x1_scale, x2_scale, bias, y_dtype, hcom, world_size, comm_turn, comm_mode)
    if reduce_op != "sum":
        _fail(_RS, f"reduce_op must be 'sum' (the pages' only value), got {reduce_op!r}")
    if x1.shape[0] % world_size:
        _fail(_RS, f"x1's rows m={x1.shape[0]} must be divisible by world_size={world_size}")
    group = group_of(hcom, _RS)
    if group.size() != world_size:
        _fail(_RS, f"world_size={world_size} but the group hcom names has {group.size()} ranks")
    part = _product(x1, x2, x1_scale, x2_scale, bias, torch.float32).float().contiguous()
    out = part.new_empty((x1.shape[0] // world_size, x2.shape[1]))
    dist.reduce_scatter_single(out, part, group=group)
    return out.to(out_dtype)


@_quant_mm_reduce_scatter.register_fake
def _(x1, x2, hcom, world_size, reduce_op, bias, x1_scale, x2_scale, comm_turn, y_dtype, comm_mode):
    out_dtype = _check(_RS, x1, x2, x1_scale, x2_scale, bias, y_dtype, hcom, world_size, comm_turn, comm_mode)
    return x1.new_empty((x1.shape[0] // world_size, x2.shape[1]), dtype=out_dtype)


def npu_quant_mm_reduce_scatter(self, x2, hcom, world_size, *, reduce_op="sum", bias=None, x1_scale=None,
                                x2_scale=None, quant_scale=None, block_size=0, comm_turn=0, group_sizes=None,
                                amax_output=False, y_dtype=None, x1_dtype=None, x2_dtype=None, x1_scale_dtype=None,
                                x2_scale_dtype=None, comm_mode=None):
    _refuse_common(_RS, quant_scale, block_size, group_sizes, amax_output, x1_dtype, x2_dtype, x1_scale_dtype,
                   x2_scale_dtype)
    out = torch.ops.npu._quant_mm_reduce_scatter(self, x2, hcom, world_size, reduce_op, bias, x1_scale, x2_scale,
                                                 comm_turn, y_dtype, comm_mode)
    return out, self.new_empty((0,), dtype=torch.float32)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_all_gather_quant_mm(Tensor self, Tensor x2, str hcom, int world_size, *, Tensor? bias=None, "
            "Tensor? x1_scale=None, Tensor? x2_scale=None, Tensor? quant_scale=None, int block_size=0, "
            "int gather_index=0, bool gather_output=True, int comm_turn=0, int[]? group_sizes=None, "
            "bool amax_output=False, int? y_dtype=None, int? x1_dtype=None, int? x2_dtype=None, "
            "int? x1_scale_dtype=None, int? x2_scale_dtype=None, str? comm_mode=None) -> (Tensor, Tensor, Tensor)")
_lib.define("npu_quant_mm_reduce_scatter(Tensor self, Tensor x2, str hcom, int world_size, *, str reduce_op='sum', "
            "Tensor? bias=None, Tensor? x1_scale=None, Tensor? x2_scale=None, Tensor? quant_scale=None, "
            "int block_size=0, int comm_turn=0, int[]? group_sizes=None, bool amax_output=False, int? y_dtype=None, "
            "int? x1_dtype=None, int? x2_dtype=None, int? x1_scale_dtype=None, int? x2_scale_dtype=None, "
            "str? comm_mode=None) -> (Tensor, Tensor)")
for _fn in (npu_all_gather_quant_mm, npu_quant_mm_reduce_scatter):
    _lib.impl(_fn.__name__, _fn, "CompositeImplicitAutograd")
