"""Asynchronous (overlapped) tensor parallelism: the sequence-parallel TP linear pairs run on the MC2 operators,
whose collective is pipelined with the matmul (npudist.ops.mc2), as torchtitan-npu's micro-pipeline TP does.

Under sequence parallelism a block gathers its sequence shard before the column-parallel linears and
reduce-scatters the row-parallel linear's partial sums back to a shard. ``async_plan`` rewrites a resolved TP
plan (FQN -> ParallelStyle) so that:

* a module whose input is gathered (``PrepareModuleInput``: ``Shard(1)`` -> ``Replicate``), together with the
  column-parallel ``nn.Linear``s below it (they all read that gathered input, as q/k/v and w1/w3 do), becomes
  one ``GatherMatmulGroup``: a forward pre-hook computes ``npu_all_gather_base_mm(x_shard, [W_1; W_2; ...]^T)``
  once (one all-gather, as plain TP) and each linear returns its slice; the module body sees the gathered
  input. Backward: ``dx = npu_mm_reduce_scatter_base(dy, W)``, ``dW = dy^T @ gathered``.
* a row-parallel ``nn.Linear`` whose output is the sequence shard (``RowwiseParallel(output_layouts=Shard(1))``)
  becomes ``MatmulReduceScatter``: ``npu_mm_reduce_scatter_base(x, W^T)`` (bias added once after the sum).
  Backward: ``dx, g = npu_all_gather_base_mm(dy, W)``, ``dW = g^T @ x``.

Weights stay DTensors with ColwiseParallel's / RowwiseParallel's placements (checkpoints, FSDP, optimizers and
clipping see the same parameters as under plain TP). The fused linears get a subclass of their own class whose
``forward`` takes the precomputed output (torch's ``fully_shard`` changes a module's class the same way), so
parameter names and state dicts do not change. Other styles (embedding, norms, output head) stay as they are.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, PrepareModuleInput, RowwiseParallel

from npudist.hccl.comm_name import get_hccl_comm_name


class _Comm:
    """The TP group as the MC2 operators address it."""

    def __init__(self, mesh: DeviceMesh):
        if mesh.device_type != "npu":
            raise ValueError(f"parallel.tp.async_tp: the MC2 operators run on npu over hccl, but the tensor-parallel "
                             f"mesh is on {mesh.device_type!r}; set training.device: npu or async_tp: false")
        self.group = mesh.get_group()
        self.world = self.group.size()
        self.hcom = get_hccl_comm_name(self.group._get_backend(torch.device("npu")), dist.get_rank())


def _seq_major(x: torch.Tensor) -> torch.Tensor:
    """(b, s, k) -> (s * b, k): the MC2 operators gather and scatter rows, and the sequence is what is sharded."""
    return x.transpose(0, 1).reshape(-1, x.shape[-1])


def _batch_major(t: torch.Tensor, b: int) -> torch.Tensor:
    """(s * b, n) -> (b, s, n), inverse of ``_seq_major``."""
    return t.view(-1, b, t.shape[-1]).transpose(0, 1)


class _AllGatherMatmul(torch.autograd.Function):
    """(x sequence shard (b, s, k), weight (n, k)) -> (gathered x @ weight^T (b, S, n), gathered x (b, S, k))."""

    @staticmethod
    def forward(ctx, x, weight, comm):
        b = x.shape[0]
        y, gathered = torch.ops.npu.npu_all_gather_base_mm(_seq_major(x), weight.t(), comm.hcom, comm.world)
        ctx.save_for_backward(gathered, weight)
        ctx.comm, ctx.b = comm, b
        ctx.set_materialize_grads(False)
        return _batch_major(y, b), _batch_major(gathered, b)

    @staticmethod
    def backward(ctx, dy, dgathered):
        gathered, weight = ctx.saved_tensors
        comm, b = ctx.comm, ctx.b
        dx = dw = None
        if dy is not None:
            dy2 = _seq_major(dy)
            dx = torch.ops.npu.npu_mm_reduce_scatter_base(dy2, weight, comm.hcom, comm.world)
            dw = dy2.t() @ gathered
        if dgathered is not None:   # the module body used the gathered input itself: its gradient sums over tp
            g2 = _seq_major(dgathered)
            rs = g2.new_empty((g2.shape[0] // comm.world, g2.shape[1]))
            dist.reduce_scatter_single(rs, g2, group=comm.group)
            dx = rs if dx is None else dx + rs
        return None if dx is None else _batch_major(dx, b), dw, None


class _MatmulReduceScatter(torch.autograd.Function):
    """(x (b, S, k_local), weight (n, k_local)) -> the sequence shard of sum_tp(x @ weight^T) (b, s, n)."""

    @staticmethod
    def forward(ctx, x, weight, comm):
        b = x.shape[0]
        a = _seq_major(x)
        y = torch.ops.npu.npu_mm_reduce_scatter_base(a, weight.t(), comm.hcom, comm.world)
        ctx.save_for_backward(a, weight)
        ctx.comm, ctx.b = comm, b
        return _batch_major(y, b)

    @staticmethod
    def backward(ctx, dy):
        a, weight = ctx.saved_tensors
        comm, b = ctx.comm, ctx.b
        dx, gathered_dy = torch.ops.npu.npu_all_gather_base_mm(_seq_major(dy), weight, comm.hcom, comm.world)
        return _batch_major(dx, b), gathered_dy.t() @ a, None


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def _shard_linear(linear: nn.Linear, mesh: DeviceMesh, weight_dim: int) -> None:
    """ColwiseParallel's (weight_dim 0: weight and bias Shard(0)) or RowwiseParallel's (1: weight Shard(1), bias
    Replicate) parameter placements."""
    linear.register_parameter("weight", nn.Parameter(distribute_tensor(linear.weight, mesh, [Shard(weight_dim)])))
    if linear.bias is not None:
        placement = Shard(0) if weight_dim == 0 else Replicate()
        linear.register_parameter("bias", nn.Parameter(distribute_tensor(linear.bias, mesh, [placement])))


_FUSED_CLASSES: dict[tuple[type, type], type] = {}


def _fuse_class(module: nn.Module, mixin: type) -> None:
    """Give ``module`` a subclass of its class whose ``forward`` is ``mixin``'s (one class per pair, so every
    fused linear of a model shares it)."""
    key = (mixin, type(module))
    if key not in _FUSED_CLASSES:
        _FUSED_CLASSES[key] = type(f"MC2{type(module).__name__}", (mixin, type(module)), {})
    module.__class__ = _FUSED_CLASSES[key]


class _GroupMember:
    """forward of a column-parallel linear of a GatherMatmulGroup: its slice of the group's fused result."""

    def forward(self, x):
        group = self._mc2_group
        out = group._mc2_pending.pop(id(self), None)
        if out is None or x is not group._mc2_gathered:
            raise RuntimeError(
                f"parallel.tp.async_tp: a column-parallel linear of {type(group).__name__!r} was called with another input "
                "than the module's gathered input (or twice per forward), so its matmul cannot be fused with the "
                "all-gather; set parallel.tp.async_tp: false for this model")
        if not group._mc2_pending:
            group._mc2_gathered = None   # every member has its slice: hold no activation past the forward
        return out


class _ReduceScatterLinear:
    """forward of a row-parallel linear fused with its reduce-scatter."""

    def forward(self, x):
        y = _MatmulReduceScatter.apply(_local(x), _local(self.weight), self._mc2_comm)
        return y if self.bias is None else y + _local(self.bias)


class GatherMatmulGroup(ParallelStyle):
    """On a module whose sequence-sharded input the column-parallel linears ``members`` (names relative to it)
    all read: one ``npu_all_gather_base_mm`` for all of them."""

    def __init__(self, members: list[str]):
        super().__init__()
        self.members = list(members)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        comm = _Comm(device_mesh)
        linears = [module.get_submodule(n) for n in self.members]
        for linear in linears:
            _shard_linear(linear, device_mesh, 0)
            _fuse_class(linear, _GroupMember)
            linear._mc2_group = module
        module._mc2_pending, module._mc2_gathered = {}, None

        def gather_and_multiply(mod, args, kwargs):
            x = args[0]
            if isinstance(x, DTensor) and tuple(x.placements) != (Shard(1),):
                raise ValueError(f"parallel.tp.async_tp: {type(mod).__name__} expects its input sharded over the "
                                 f"sequence (Shard(1)), got {x.placements}")
            weights = [_local(lin.weight) for lin in linears]
            y, gathered = _AllGatherMatmul.apply(_local(x), torch.cat(weights) if len(weights) > 1 else weights[0],
                                                 comm)
            outs = y.split([w.shape[0] for w in weights], dim=-1)
            mod._mc2_pending = {}
            for lin, out in zip(linears, outs):
                out = out.contiguous()   # as F.linear's result: callers may view() it freely
                mod._mc2_pending[id(lin)] = out if lin.bias is None else out + _local(lin.bias)
            mod._mc2_gathered = gathered
            return (gathered, *args[1:]), kwargs

        module.register_forward_pre_hook(gather_and_multiply, with_kwargs=True)
        return module


class MatmulReduceScatter(ParallelStyle):
    """On a row-parallel ``nn.Linear`` whose output is the sequence shard: one ``npu_mm_reduce_scatter_base``."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _shard_linear(module, device_mesh, 1)
        module._mc2_comm = _Comm(device_mesh)
        _fuse_class(module, _ReduceScatterLinear)
        return module


def _is_gather(style) -> bool:
    return (isinstance(style, PrepareModuleInput) and tuple(style.input_layouts or ()) == (Shard(1),)
            and tuple(style.desired_input_layouts or ()) == (Replicate(),))


def _is_plain_colwise(style) -> bool:
    return (type(style) is ColwiseParallel and tuple(style.input_layouts) == (Replicate(),)
            and tuple(style.output_layouts) == (Shard(-1),) and style.use_local_output)


def _is_seq_rowwise(style) -> bool:
    return (type(style) is RowwiseParallel and tuple(style.output_layouts) == (Shard(1),)
            and tuple(style.input_layouts) == (Shard(-1),) and style.use_local_output)


def async_plan(model: nn.Module, plan: dict[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """``plan`` with its sequence-parallel linear pairs on the MC2 operators (see the module docstring)."""
    modules = dict(model.named_modules())
    out = dict(plan)
    fused = 0
    for name, style in plan.items():
        if not _is_gather(style):
            continue
        prefix = name + "."
        members = [n for n, s in plan.items() if n.startswith(prefix) and _is_plain_colwise(s)
                   and isinstance(modules[n], nn.Linear)]
        if members:
            out[name] = GatherMatmulGroup([n[len(prefix):] for n in members])
            for n in members:
                del out[n]
            fused += len(members)
    for name, style in plan.items():
        if _is_seq_rowwise(style) and isinstance(modules[name], nn.Linear):
            out[name] = MatmulReduceScatter()
            fused += 1
    if not fused:
        raise ValueError("parallel.tp.async_tp: the tensor-parallel plan has no sequence-parallel linear pairs to "
                         "fuse (a prepare_input module over colwise linears, rowwise linears into the sequence "
                         "shard); set parallel.tp.sequence_parallel: true with such a plan, or async_tp: false")
    return out
