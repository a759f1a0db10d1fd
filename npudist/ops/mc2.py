"""Compute-communication operators (Ascend's MC2), addressed by an hccl communicator name ``hcom``
(``pg._get_backend(torch.device("npu")).get_hccl_comm_name(rank)``), as documented:

* ``npu_all_gather_base_mm(input, x2, hcom, world_size, *, bias=None, gather_index=0, gather_output=True,
  comm_turn=0, ...) -> (output, gather_out)``: ``gather_index=0``: ``gather_out = allgather(input)`` (rank-major
  along dim 0) and ``output = gather_out @ x2 + bias``; ``gather_index=1``: ``gather_out = allgather(x2)`` and
  ``output = input @ gather_out + bias``. Without ``gather_output`` the second result is an empty tensor.
* ``npu_mm_reduce_scatter_base(input, x2, hcom, world_size, *, reduce_op='sum', bias=None, comm_turn=0, ...)``:
  ``reducescatter(input @ x2 + bias)`` along dim 0 (``input``'s rows divisible by ``world_size``).
* ``npu_mm_all_reduce_base(x1, x2, hcom, *, reduce_op='sum', bias=None, x3=None, comm_turn=0, ...)``:
  ``allreduce(x1 @ x2 + bias + x3)``, x1 2-D or 3-D.

The collective runs over the process group ``hcom`` names, optionally chunked along the rows and pipelined (the
matmul of chunk i on the compute stream while chunk i+1 is in flight on the communicator's stream; one chunk by
default, see ``_MAX_CHUNKS``). Ascend's
quantised forms (scales, antiquant, dequant, comm quantisation, output dtypes) are refused; any floating dtype
works (Ascend: float16/bfloat16). ``world_size`` must be the group's size and one of Ascend's 2, 4, 8, 16;
``comm_turn`` must be 0 and ``reduce_op`` 'sum', as in Ascend's kernels; ``comm_mode`` ('ai_cpu'/'aiv') selects
nothing here. As in torch_npu the operators have no autograd formula (their backward is another MC2 call:
npudist.tp.async_tp pairs them). Semantics and differences from Ascend: docs/torch_npu.md.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.library import custom_op


_WORLD_SIZES = (2, 4, 8, 16)   # the group sizes Ascend's MC2 kernels take (A2: 2/4/8, A3: also 16)
_COMM_MODES = (None, "ai_cpu", "aiv")
# Rows per pipeline chunk at least this many, and at most this many chunks. One chunk (no overlap) by default:
# on the emulated device a rank's compute and communicator streams are host threads, and on the 2-core machine
# benchmarks/mc2.py measured 4 chunks at 0.45-1.10x the unfused time (docs/torch_npu.md, "MC2"), i.e. no gain
# when the cores are already busy. Machines with idle cores per rank can raise it (benchmarks/mc2.py
# --max-chunks); tests run the pipelined path with 4.
_MIN_CHUNK_ROWS = 32
_MAX_CHUNKS = 1


def _fail(op: str, msg: str):
    raise ValueError(f"{op}: {msg}")


def group_of(hcom: str, op: str) -> dist.ProcessGroup:
    """The process group whose hccl communicator is named ``hcom``."""
    # Imported here, not at module level: registration imports npudist.ops while npudist.hccl may still be
    # initialising (`python -m npudist.hccl.trace` imports torch from inside npudist.hccl, and torch's autoload
    # registers everything), and comm_name needs the finished package.
    from npudist.hccl.comm_name import backend_of

    try:
        backend = backend_of(hcom)
    except ValueError as e:
        _fail(op, str(e))
    for pg in list(dist.distributed_c10d._world.pg_map):
        try:
            if pg._get_backend(torch.device("npu")) is backend:
                return pg
        except RuntimeError:
            continue
    _fail(op, f"hcom {hcom!r} names no process group of this process")


def _check_common(op, a, x2, hcom, world_size, bias, comm_turn, comm_mode, quantised):
    for name, value in quantised.items():
        if value is not None:
            _fail(op, f"{name} (Ascend's quantised form) is not supported by npudist; pass float inputs")
    if not isinstance(a, torch.Tensor) or not isinstance(x2, torch.Tensor):
        _fail(op, "the matmul operands must be tensors")
    if not a.dtype.is_floating_point or a.dtype != x2.dtype:
        _fail(op, f"the matmul operands must share one floating dtype (int8 is Ascend's quantised form), got "
                  f"{a.dtype} and {x2.dtype}")
    if x2.dim() != 2:
        _fail(op, f"x2 must be 2-D (k, n), got shape {tuple(x2.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != x2.shape[1] or bias.dtype != a.dtype):
        _fail(op, f"bias must be 1-D of size n={x2.shape[1]} and dtype {a.dtype}, got {tuple(bias.shape)} "
                  f"{bias.dtype}")
    if isinstance(comm_turn, bool) or comm_turn != 0:
        _fail(op, f"comm_turn must be 0 (Ascend's only value; the pipeline chunking is chosen by npudist), got "
                  f"{comm_turn!r}")
    if comm_mode not in _COMM_MODES:
        _fail(op, f"comm_mode must be None, 'ai_cpu' or 'aiv', got {comm_mode!r}")
    if world_size is not None:
        if isinstance(world_size, bool) or world_size not in _WORLD_SIZES:
            _fail(op, f"world_size must be one of {_WORLD_SIZES} (the group's size), got {world_size!r}")
        size = group_of(hcom, op).size()
        if world_size != size:
            _fail(op, f"world_size={world_size} but the group hcom names has {size} ranks")


def _check_reduce_op(op, reduce_op):
    if reduce_op != "sum":
        _fail(op, f"reduce_op must be 'sum' (the only reduction Ascend's kernels offer), got {reduce_op!r}")


def _chunks(rows: int) -> list[tuple[int, int]]:
    """[(start, end)] row ranges of the pipeline chunks of ``rows`` rows."""
    n = max(1, min(_MAX_CHUNKS, rows // _MIN_CHUNK_ROWS))
    bounds = [rows * i // n for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(n)]


# --- npu_all_gather_base_mm -------------------------------------------------------------------------------------

def _check_all_gather(a, x2, hcom, world_size, bias, gather_index, comm_turn, comm_mode, quantised):
    op = "npu_all_gather_base_mm"
    _check_common(op, a, x2, hcom, world_size, bias, comm_turn, comm_mode, quantised)
    if a.dim() != 2:
        _fail(op, f"input must be 2-D (m, k), got shape {tuple(a.shape)}")
    if gather_index not in (0, 1) or isinstance(gather_index, bool):
        _fail(op, f"gather_index must be 0 (gather input) or 1 (gather x2), got {gather_index!r}")
    k = x2.shape[0] * (world_size if gather_index == 1 else 1)
    if a.shape[1] != k:
        what = "x2's rows" if gather_index == 0 else f"world_size x x2's rows ({world_size} x {x2.shape[0]})"
        _fail(op, f"input {tuple(a.shape)} and x2 {tuple(x2.shape)} do not multiply: input's k must equal {what}")


def _all_gather_shapes(a, x2, world_size, gather_index, gather_output):
    if gather_index == 0:
        out, gathered = (a.shape[0] * world_size, x2.shape[1]), (a.shape[0] * world_size, a.shape[1])
    else:
        out, gathered = (a.shape[0], x2.shape[1]), (x2.shape[0] * world_size, x2.shape[1])
    return out, gathered if gather_output else (0,)


@custom_op("npu::_all_gather_base_mm", mutates_args=(), device_types="npu", schema=(
    "(Tensor input, Tensor x2, str hcom, int world_size, Tensor? bias, int gather_index, bool gather_output, "
    "int comm_turn, str? comm_mode) -> (Tensor, Tensor)"))
def _all_gather_base_mm(a, x2, hcom, world_size, bias, gather_index, gather_output, comm_turn, comm_mode):
    _check_all_gather(a, x2, hcom, world_size, bias, gather_index, comm_turn, comm_mode, {})
    group = group_of(hcom, "npu_all_gather_base_mm")
    out_shape, gathered_shape = _all_gather_shapes(a, x2, world_size, gather_index, True)
    if gather_index == 1:   # x2 is small next to the activations: gather it whole, then one matmul
        gathered = x2.new_empty(gathered_shape)
        dist.all_gather_single(gathered, x2.contiguous(), group=group)
        out = torch.matmul(a, gathered)
        if bias is not None:
            out += bias
        return out, gathered if gather_output else x2.new_empty((0,))
    m = a.shape[0]
    out = a.new_empty(out_shape)
    gathered = a.new_empty(gathered_shape)
    out_v, gathered_v = out.view(world_size, m, -1), gathered.view(world_size, m, -1)
    chunks = _chunks(m)
    bufs = [a.new_empty((world_size, e - s, a.shape[1])) if len(chunks) > 1 else gathered_v for s, e in chunks]
    # Every chunk's all-gather is queued at once on the communicator's stream (in order); the matmul of
    # chunk i waits only for chunk i, so it runs while chunks i+1.. are in flight.
    works = [dist.all_gather_single(buf, a[s:e].contiguous(), group=group, async_op=True)
             for buf, (s, e) in zip(bufs, chunks)]
    for (s, e), buf, work in zip(chunks, bufs, works):
        work.wait()
        part = torch.matmul(buf, x2)
        if bias is not None:
            part += bias
        out_v[:, s:e] = part
        if len(chunks) > 1 and gather_output:
            gathered_v[:, s:e] = buf
    return out, gathered if gather_output else a.new_empty((0,))


@_all_gather_base_mm.register_fake
def _(a, x2, hcom, world_size, bias, gather_index, gather_output, comm_turn, comm_mode):
    _check_all_gather(a, x2, hcom, world_size, bias, gather_index, comm_turn, comm_mode, {})
    out_shape, gathered_shape = _all_gather_shapes(a, x2, world_size, gather_index, True)
    return a.new_empty(out_shape), a.new_empty(gathered_shape if gather_output else (0,))


def npu_all_gather_base_mm(input, x2, hcom, world_size, *, bias=None, x1_scale=None, x2_scale=None,  # noqa: A002
                           gather_index=0, gather_output=True, comm_turn=0, output_dtype=None, comm_mode=None):
    _check_common("npu_all_gather_base_mm", input, x2, None, None, None, 0, None,
                  {"x1_scale": x1_scale, "x2_scale": x2_scale, "output_dtype": output_dtype})
    return torch.ops.npu._all_gather_base_mm(input, x2, hcom, world_size, bias, gather_index, gather_output,
                                             comm_turn, comm_mode)


# --- npu_mm_reduce_scatter_base ---------------------------------------------------------------------------------

def _check_reduce_scatter(a, x2, hcom, world_size, reduce_op, bias, comm_turn, comm_mode):
    op = "npu_mm_reduce_scatter_base"
    _check_common(op, a, x2, hcom, world_size, bias, comm_turn, comm_mode, {})
    _check_reduce_op(op, reduce_op)
    if a.dim() != 2 or a.shape[1] != x2.shape[0]:
        _fail(op, f"input must be 2-D (m, k) with k = x2's rows, got {tuple(a.shape)} and x2 {tuple(x2.shape)}")
    if a.shape[0] % world_size:
        _fail(op, f"input's rows m={a.shape[0]} must be divisible by world_size={world_size}")


@custom_op("npu::_mm_reduce_scatter_base", mutates_args=(), device_types="npu", schema=(
    "(Tensor input, Tensor x2, str hcom, int world_size, str reduce_op, Tensor? bias, int comm_turn, "
    "str? comm_mode) -> Tensor"))
def _mm_reduce_scatter_base(a, x2, hcom, world_size, reduce_op, bias, comm_turn, comm_mode):
    _check_reduce_scatter(a, x2, hcom, world_size, reduce_op, bias, comm_turn, comm_mode)
    group = group_of(hcom, "npu_mm_reduce_scatter_base")
    rows = a.shape[0] // world_size
    a_v = a.view(world_size, rows, -1) if a.is_contiguous() else a.reshape(world_size, rows, -1)
    out = a.new_empty((rows, x2.shape[1]))
    works = []
    for s, e in _chunks(rows):
        # chunk i's partial product (each rank's rows s:e of every destination block) is reduce-scattered
        # while the matmul of chunk i+1 runs; out[s:e] is contiguous, so the collective writes in place
        part = torch.matmul(a_v[:, s:e], x2)
        if bias is not None:
            part += bias
        works.append(dist.reduce_scatter_single(out[s:e], part, group=group, async_op=True))
    for work in works:
        work.wait()
    return out


@_mm_reduce_scatter_base.register_fake
def _(a, x2, hcom, world_size, reduce_op, bias, comm_turn, comm_mode):
    _check_reduce_scatter(a, x2, hcom, world_size, reduce_op, bias, comm_turn, comm_mode)
    return a.new_empty((a.shape[0] // world_size, x2.shape[1]))


def npu_mm_reduce_scatter_base(input, x2, hcom, world_size, *, reduce_op="sum", bias=None,  # noqa: A002
                               x1_scale=None, x2_scale=None, comm_turn=0, output_dtype=None, comm_mode=None):
    _check_common("npu_mm_reduce_scatter_base", input, x2, None, None, None, 0, None,
                  {"x1_scale": x1_scale, "x2_scale": x2_scale, "output_dtype": output_dtype})
    return torch.ops.npu._mm_reduce_scatter_base(input, x2, hcom, world_size, reduce_op, bias, comm_turn, comm_mode)


# --- npu_mm_all_reduce_base -------------------------------------------------------------------------------------

def _check_all_reduce(x1, x2, hcom, reduce_op, bias, x3, comm_turn, comm_mode):
    op = "npu_mm_all_reduce_base"
    _check_common(op, x1, x2, hcom, None, bias, comm_turn, comm_mode, {})
    _check_reduce_op(op, reduce_op)
    if x1.dim() not in (2, 3) or x1.shape[-1] != x2.shape[0]:
        _fail(op, f"x1 must be 2-D (m, k) or 3-D (b, s, k) with k = x2's rows, got {tuple(x1.shape)} and x2 "
                  f"{tuple(x2.shape)}")
    out_shape = (*x1.shape[:-1], x2.shape[1])
    if x3 is not None and (tuple(x3.shape) != out_shape or x3.dtype != x1.dtype):
        _fail(op, f"x3 must have the output's shape {out_shape} and dtype {x1.dtype}, got {tuple(x3.shape)} "
                  f"{x3.dtype}")
    return out_shape


@custom_op("npu::_mm_all_reduce_base", mutates_args=(), device_types="npu", schema=(
    "(Tensor x1, Tensor x2, str hcom, str reduce_op, Tensor? bias, Tensor? x3, int comm_turn, str? comm_mode) "
    "-> Tensor"))
def _mm_all_reduce_base(x1, x2, hcom, reduce_op, bias, x3, comm_turn, comm_mode):
    out_shape = _check_all_reduce(x1, x2, hcom, reduce_op, bias, x3, comm_turn, comm_mode)
    group = group_of(hcom, "npu_mm_all_reduce_base")
    a = x1.reshape(-1, x1.shape[-1])
    x3_2d = x3.reshape(-1, x2.shape[1]) if x3 is not None else None
    out = x1.new_empty((a.shape[0], x2.shape[1]))
    works = []
    for s, e in _chunks(a.shape[0]):
        # rows s:e are final once summed: all-reduce them in place while the next chunk's matmul runs
        torch.matmul(a[s:e], x2, out=out[s:e])
        if bias is not None:
            out[s:e] += bias
        if x3_2d is not None:
            out[s:e] += x3_2d[s:e]
        works.append(dist.all_reduce(out[s:e], group=group, async_op=True))
    for work in works:
        work.wait()
    return out.view(out_shape)


@_mm_all_reduce_base.register_fake
def _(x1, x2, hcom, reduce_op, bias, x3, comm_turn, comm_mode):
    return x1.new_empty(_check_all_reduce(x1, x2, hcom, reduce_op, bias, x3, comm_turn, comm_mode))


def npu_mm_all_reduce_base(x1, x2, hcom, *, reduce_op="sum", bias=None, antiquant_scale=None, antiquant_offset=None,
                           x3=None, dequant_scale=None, pertoken_scale=None, comm_quant_scale_1=None,
                           comm_quant_scale_2=None, antiquant_group_size=0, comm_turn=0, group_sizes=None,
                           y_dtype=None, x1_dtype=None, x2_dtype=None, dequant_scale_dtype=None,
                           pertoken_scale_dtype=None, comm_quant_mode=0, comm_mode=None):
    quantised = {"antiquant_scale": antiquant_scale, "antiquant_offset": antiquant_offset,
                 "dequant_scale": dequant_scale, "pertoken_scale": pertoken_scale,
                 "comm_quant_scale_1": comm_quant_scale_1, "comm_quant_scale_2": comm_quant_scale_2,
                 "group_sizes": group_sizes, "y_dtype": y_dtype, "x1_dtype": x1_dtype, "x2_dtype": x2_dtype,
                 "dequant_scale_dtype": dequant_scale_dtype, "pertoken_scale_dtype": pertoken_scale_dtype,
                 "antiquant_group_size": antiquant_group_size or None, "comm_quant_mode": comm_quant_mode or None}
    _check_common("npu_mm_all_reduce_base", x1, x2, None, None, None, 0, None, quantised)
    return torch.ops.npu._mm_all_reduce_base(x1, x2, hcom, reduce_op, bias, x3, comm_turn, comm_mode)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_all_gather_base_mm(Tensor self, Tensor x2, str hcom, int world_size, *, Tensor? bias=None, "
            "Tensor? x1_scale=None, Tensor? x2_scale=None, int gather_index=0, bool gather_output=True, "
            "int comm_turn=0, ScalarType? output_dtype=None, str? comm_mode=None) -> (Tensor, Tensor)")
_lib.impl("npu_all_gather_base_mm", npu_all_gather_base_mm, "CompositeImplicitAutograd")
_lib.define("npu_mm_reduce_scatter_base(Tensor self, Tensor x2, str hcom, int world_size, *, str reduce_op='sum', "
            "Tensor? bias=None, Tensor? x1_scale=None, Tensor? x2_scale=None, int comm_turn=0, "
            "ScalarType? output_dtype=None, str? comm_mode=None) -> Tensor")
_lib.impl("npu_mm_reduce_scatter_base", npu_mm_reduce_scatter_base, "CompositeImplicitAutograd")
_lib.define("npu_mm_all_reduce_base(Tensor x1, Tensor x2, str hcom, *, str reduce_op='sum', Tensor? bias=None, "
            "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? x3=None, "
            "Tensor? dequant_scale=None, Tensor? pertoken_scale=None, Tensor? comm_quant_scale_1=None, "
            "Tensor? comm_quant_scale_2=None, int antiquant_group_size=0, int comm_turn=0, int[]? group_sizes=None, "
            "int? y_dtype=None, int? x1_dtype=None, int? x2_dtype=None, int? dequant_scale_dtype=None, "
            "int? pertoken_scale_dtype=None, int comm_quant_mode=0, str? comm_mode=None) -> Tensor")
_lib.impl("npu_mm_all_reduce_base", npu_mm_all_reduce_base, "CompositeImplicitAutograd")
