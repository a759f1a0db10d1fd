"""``npu::npu_fused_linear_online_max_sum``: the local half of a vocabulary-parallel cross entropy (Megatron's
``VocabParallelCrossEntropy`` pre-communication step) fused with the logits matmul.

For input (N, H), this rank's weight rows (V, H) covering vocabulary ``[vocab_start_index, vocab_end_index)``::

    logits = input @ weight.T                                 (vocab_parallel_logits, input's dtype)
    logits_max = max(logits, -1)                              (float32, local)
    sum_exp_logits = sum(exp(logits - logits_max), -1)        (float32)
    outside = target < vocab_start_index | target >= vocab_end_index
    masked_target = 0 where outside, else target - vocab_start_index
    predicted_logits = 0 where outside, else (logits - logits_max)[masked_target]
    target_mask = outside bit-packed, 8 rows a byte, first row in the most significant bit, the last byte
                  padded with 1s (uint8, ceil(N / 8))

The callers all-reduce logits_max/sum_exp_logits/predicted_logits across the vocabulary shards and finish the
loss; like Ascend's, the operator has no gradient (its backward is a separate Ascend operator).
"""
from __future__ import annotations

import torch
from torch.library import custom_op

_OP = "npu_fused_linear_online_max_sum"


def _check(input, weight, target, vocab_start_index, vocab_end_index):
    if input.dim() != 2 or weight.dim() != 2 or input.shape[1] != weight.shape[1]:
        raise ValueError(f"{_OP}: input (N, H) and weight (V, H) must be 2-D with equal H, got "
                         f"{tuple(input.shape)} and {tuple(weight.shape)}")
    if input.dtype != weight.dtype or not input.is_floating_point():
        raise ValueError(f"{_OP}: input and weight must share one floating dtype, got {input.dtype} and {weight.dtype}")
    if target.dim() != 1 or target.shape[0] != input.shape[0] or target.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{_OP}: target must be 1-D int32/int64 with one entry per row ({input.shape[0]}), got "
                         f"{target.dtype} {tuple(target.shape)}")
    if vocab_start_index < 0 or vocab_end_index < vocab_start_index:
        raise ValueError(f"{_OP}: need 0 <= vocab_start_index <= vocab_end_index, got {vocab_start_index}, "
                         f"{vocab_end_index}")


def _pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """uint8 bytes of a bool vector, 8 entries a byte, MSB first, padded with 1s."""
    n = mask.shape[0]
    padded = torch.ones((n + 7) // 8 * 8, dtype=torch.uint8, device=mask.device)
    padded[:n] = mask.to(torch.uint8)
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=mask.device)
    return (padded.view(-1, 8) * weights).sum(-1, dtype=torch.int32).to(torch.uint8)


@custom_op("npu::npu_fused_linear_online_max_sum", mutates_args=(), device_types="npu", schema=(
    "(Tensor input, Tensor weight, Tensor target, int vocab_start_index, int vocab_end_index, "
    "bool return_logits=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor?)"))
def npu_fused_linear_online_max_sum(input, weight, target, vocab_start_index, vocab_end_index,
                                    return_logits=False):
    _check(input, weight, target, vocab_start_index, vocab_end_index)
    logits = input @ weight.t()
    shifted = logits.float() - logits.float().amax(-1, keepdim=True)
    logits_max = logits.float().amax(-1)
    sum_exp = shifted.exp().sum(-1)
    outside = (target < vocab_start_index) | (target >= vocab_end_index)
    masked_target = torch.where(outside, torch.zeros_like(target), target - vocab_start_index)
    picked = shifted.gather(-1, masked_target.long().clamp(max=max(weight.shape[0] - 1, 0)).unsqueeze(-1))
    predicted = torch.where(outside, 0.0, picked.squeeze(-1))
    return (logits_max, sum_exp, predicted, _pack_bits(outside), masked_target,
            logits if return_logits else None)


@npu_fused_linear_online_max_sum.register_fake
def _(input, weight, target, vocab_start_index, vocab_end_index, return_logits=False):
    _check(input, weight, target, vocab_start_index, vocab_end_index)
    n = input.shape[0]
    f32 = dict(dtype=torch.float32)
    return (input.new_empty(n, **f32), input.new_empty(n, **f32), input.new_empty(n, **f32),
            input.new_empty((n + 7) // 8, dtype=torch.uint8), torch.empty_like(target),
            input.new_empty(n, weight.shape[0]) if return_logits else None)
