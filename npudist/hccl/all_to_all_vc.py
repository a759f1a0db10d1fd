"""``torch_npu.distributed.all_to_all_vc``: a variable-count all-to-all driven by the full send-count matrix
(``send_count_matrix[i][j]`` = elements rank i sends to rank j; every rank passes the same matrix), composed from
``all_to_all_single`` on the flattened buffers: this rank sends row ``rank`` and receives column ``rank``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def all_to_all_vc(output: torch.Tensor, input: torch.Tensor, send_count_matrix, group=None,  # noqa: A002
                  async_op: bool = False):
    """Send ``input``'s consecutive parts (``send_count_matrix[rank][j]`` elements to rank j) and receive into
    ``output`` the parts of every source rank in rank order (``send_count_matrix[i][rank]`` elements from i).
    Returns a work handle with ``async_op=True``, else None."""
    what = "all_to_all_vc"
    group = group if group is not None else dist.group.WORLD
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank < 0:
        return None   # not a member of the group, as torch's collectives
    if len(send_count_matrix) != ws or any(len(row) != ws for row in send_count_matrix):
        raise ValueError(f"{what}: send_count_matrix must be a square [{ws}][{ws}] matrix (group size {ws}), "
                         f"got {[len(row) for row in send_count_matrix]} row lengths")
    matrix = [[int(v) for v in row] for row in send_count_matrix]
    if any(v < 0 for row in matrix for v in row):
        raise ValueError(f"{what}: send counts must be non-negative")
    send = matrix[rank]
    recv = [matrix[i][rank] for i in range(ws)]
    if input.numel() != sum(send):
        raise ValueError(f"{what}: input has {input.numel()} elements, but row {rank} of send_count_matrix sends "
                         f"{sum(send)}")
    if output.numel() != sum(recv):
        raise ValueError(f"{what}: output has {output.numel()} elements, but column {rank} of send_count_matrix "
                         f"receives {sum(recv)}")
    if not output.is_contiguous() or not input.is_contiguous():
        raise ValueError(f"{what}: output and input must be contiguous (parts are laid out one after another)")
    if output.dtype != input.dtype:
        raise ValueError(f"{what}: output ({output.dtype}) and input ({input.dtype}) need one dtype")
    if output.data_ptr() == input.data_ptr() and output.numel():
        raise ValueError(f"{what}: output and input must not share memory (in-place is not supported)")
    return dist.all_to_all_single(output.view(-1), input.view(-1), output_split_sizes=recv,
                                  input_split_sizes=send, group=group, async_op=async_op)
