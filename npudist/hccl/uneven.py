"""torch_npu's uneven collectives (``torch_npu.distributed.all_gather_into_tensor_uneven`` and
``reduce_scatter_tensor_uneven``), composed from ``all_to_all_single`` so they work on any backend and
keep asynchronous use: dim 0 is split unevenly across the ranks, every rank passes the same splits.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _splits(sizes, total: int, group, what: str, tensor_name: str) -> list[int]:
    ws = dist.get_world_size(group)
    if sizes is None:
        if total % ws:
            raise ValueError(f"{what}: {tensor_name} dim 0 ({total}) is not divisible by the group size {ws}; "
                             f"pass {tensor_name}_split_sizes")
        return [total // ws] * ws
    sizes = [int(s) for s in sizes]
    if len(sizes) != ws:
        raise ValueError(f"{what}: Number of tensor splits not equal to group size ({len(sizes)} splits, "
                         f"group of {ws})")
    if any(s < 0 for s in sizes):
        raise ValueError(f"{what}: split sizes must be non-negative, got {sizes}")
    if sum(sizes) != total:
        raise ValueError(f"{what}: Split sizes doesn't match total dim 0 size ({sum(sizes)} vs {tensor_name} "
                         f"dim 0 {total})")
    return sizes


def _checked_splits(what: str, output: torch.Tensor, input: torch.Tensor, sizes, group, gather: bool) -> list[int]:
    """The dim-0 splits of the concatenated tensor (gather: output; scatter: input), checked against
    both tensors; this rank's split must be its own tensor's dim 0."""
    if output.dtype != input.dtype or output.device != input.device:
        raise ValueError(f"{what}: output ({output.dtype} on {output.device}) and input ({input.dtype} on "
                         f"{input.device}) need one dtype and device")
    if output.dim() == 0 or input.dim() == 0 or output.shape[1:] != input.shape[1:]:
        raise ValueError(f"{what}: output {tuple(output.shape)} and input {tuple(input.shape)} must agree beyond "
                         "dim 0 (and have a dim 0)")
    whole, own, whole_name, own_name = (output, input, "output", "input") if gather else \
        (input, output, "input", "output")
    splits = _splits(sizes, whole.shape[0], group, what, whole_name)
    me = dist.get_rank(group)
    if splits[me] != own.shape[0]:
        raise ValueError(f"{what}: {whole_name}_split_sizes[{me}] = {splits[me]} but this rank's {own_name} has "
                         f"{own.shape[0]} rows")
    return splits


def all_gather_into_tensor_uneven(output: torch.Tensor, input: torch.Tensor, output_split_sizes=None,
                                  group=None, async_op: bool = False):
    """Rank r's ``input`` (``output_split_sizes[r]`` rows) lands in ``output`` at row
    ``sum(output_split_sizes[:r])``."""
    splits = _checked_splits("all_gather_into_tensor_uneven", output, input, output_split_sizes, group, gather=True)
    ws = len(splits)
    # Every rank sends its whole input to every rank (all_to_all_single writes straight into output).
    send = input.unsqueeze(0).expand(ws, *input.shape).reshape(ws * input.shape[0], *input.shape[1:])
    return dist.all_to_all_single(output, send, output_split_sizes=splits, input_split_sizes=[input.shape[0]] * ws,
                                  group=group, async_op=async_op)


def reduce_scatter_tensor_uneven(output: torch.Tensor, input: torch.Tensor, input_split_sizes=None,
                                 op=dist.ReduceOp.SUM, group=None, async_op: bool = False):
    """``output`` on rank r = the reduction over ranks of their ``input`` rows
    ``[sum(input_split_sizes[:r]), +input_split_sizes[r])``."""
    what = "reduce_scatter_tensor_uneven"
    splits = _checked_splits(what, output, input, input_split_sizes, group, gather=False)
    if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        raise ValueError(f"{what}: op must be SUM, AVG, MAX, MIN or PRODUCT, got {op}")
    ws = len(splits)
    # Rank r receives every rank's chunk r, then reduces the ws chunks locally.
    chunks = torch.empty((ws * output.shape[0], *output.shape[1:]), dtype=output.dtype, device=output.device)
    work = dist.all_to_all_single(chunks, input.contiguous(), output_split_sizes=[output.shape[0]] * ws,
                                  input_split_sizes=splits, group=group, async_op=async_op)

    def reduce_into_output() -> None:
        parts = chunks.view(ws, *output.shape)
        # fp16/bf16 accumulate in fp32, as the backend's own reductions do.
        acc = torch.float32 if output.dtype in (torch.float16, torch.bfloat16) else None
        if op == dist.ReduceOp.SUM:
            output.copy_(parts.sum(0, dtype=acc))
        elif op == dist.ReduceOp.AVG:
            if output.is_floating_point() or output.is_complex():
                output.copy_(parts.sum(0, dtype=acc) / ws)
            else:
                output.copy_(torch.div(parts.sum(0), ws, rounding_mode="trunc"))
        elif op == dist.ReduceOp.MAX:
            output.copy_(parts.amax(0))
        elif op == dist.ReduceOp.MIN:
            output.copy_(parts.amin(0))
        else:
            output.copy_(parts.prod(0, dtype=acc))

    if not async_op:
        reduce_into_output()
        return None

    def finish(fut):
        fut.value()  # re-raises the all_to_all's error
        reduce_into_output()
        return [output]

    return torch._C._distributed_c10d._create_work_from_future(work.get_future().then(finish))
