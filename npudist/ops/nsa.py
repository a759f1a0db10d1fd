"""torch_npu's Native Sparse Attention token compression, ``npu_nsa_compress``, as aten ops (autograd, fake
tensors and compile come from them).

``npu_nsa_compress(input, weight, compress_block_size, compress_stride, *, actual_seq_len)``: ``input`` (T, N, D)
holds the batches' tokens back to back, ``actual_seq_len`` their cumulative ends. Each batch of length ``L``
gives ``max(0, (L - compress_block_size) // compress_stride + 1)`` windows of ``compress_block_size`` tokens,
window ``w`` starting at token ``w * compress_stride`` of the batch, compressed per head by the learned weights
``weight`` (compress_block_size, N): ``out[w, n, :] = sum_k weight[k, n] * input[start_w + k, n, :]``. The
windows of all batches are stacked in batch order: (total windows, N, D), in input's dtype (accumulated in
float32; float64 for float64).
"""
from __future__ import annotations

import torch

_OP = "npu_nsa_compress"


def _fail(msg):
    raise ValueError(f"{_OP}: {msg}")


def _window_starts(ends, block, stride):
    starts, begin = [], 0
    for end in ends:
        length = end - begin
        if length >= block:
            starts += [begin + w * stride for w in range((length - block) // stride + 1)]
        begin = end
    return starts


def npu_nsa_compress(input, weight, compress_block_size, compress_stride, *, actual_seq_len=None):
    if input.dim() != 3:
        _fail(f"input must be 3-D (T, N, D), got {tuple(input.shape)}")
    t, n, _ = input.shape
    if compress_block_size < 1 or compress_stride < 1 or compress_stride > compress_block_size:
        _fail(f"compress_block_size and compress_stride must be positive with compress_stride <= "
              f"compress_block_size, got {compress_block_size} and {compress_stride}")
    if tuple(weight.shape) != (compress_block_size, n):
        _fail(f"weight must be (compress_block_size, N) = ({compress_block_size}, {n}), got {tuple(weight.shape)}")
    if weight.dtype != input.dtype:
        _fail(f"weight's dtype {weight.dtype} must equal input's {input.dtype}")
    if actual_seq_len is None:
        _fail("actual_seq_len (the batches' cumulative token ends) is required")
    ends = [int(e) for e in actual_seq_len]
    if not ends or any(b < a for a, b in zip([0] + ends, ends)) or ends[-1] != t:
        _fail(f"actual_seq_len must be non-decreasing cumulative ends finishing at T = {t}, got {ends}")
    starts = _window_starts(ends, compress_block_size, compress_stride)
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    if not starts:
        return input.new_zeros(0, n, input.shape[2])
    index = (torch.tensor(starts, device=input.device)[:, None]
             + torch.arange(compress_block_size, device=input.device)[None, :])  # (W, block)
    windows = input.to(acc)[index]  # (W, block, N, D)
    return torch.einsum("wknd,kn->wnd", windows, weight.to(acc)).to(input.dtype)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_nsa_compress(Tensor input, Tensor weight, int compress_block_size, int compress_stride, *, "
            "int[]? actual_seq_len=None) -> Tensor")
_lib.impl("npu_nsa_compress", npu_nsa_compress, "CompositeImplicitAutograd")
