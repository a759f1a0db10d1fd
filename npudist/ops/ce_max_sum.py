"""The second half of torch_npu's vocabulary-parallel cross entropy (Megatron's ``VocabParallelCrossEntropy``
after its all-reduces) and the backward of the whole linear + cross entropy, continuing the protocol of
``npu_fused_linear_online_max_sum`` (npudist.ops.online_max_sum): ``predicted_logits`` is the target's logit
minus the row maximum, ``target_mask`` the bit-packed "target outside this shard" flags (8 rows a byte, the first
row in the most significant bit) and ``masked_target`` the target's index within the shard.

* ``npu_fused_cross_entropy_loss_with_max_sum(logits_max, sum_exp_logits, predicted_logits, *,
  label_smoothing=0.0, input=None, weight=None, vocab_parallel_logits=None) -> (loss, softmax)``:
  ``loss = log(sum_exp_logits) - predicted_logits`` (float32, per row) and, given ``vocab_parallel_logits``
  (N, V), ``softmax = exp(vocab_parallel_logits - logits_max) / sum_exp_logits`` (float32, N x V), else None.
* ``npu_fused_linear_cross_entropy_loss_with_max_sum_backward(grad, input, weight, target_mask, masked_target,
  label_smoothing=0.0, logits_max=None, sum_exp_logits=None, softmax=None) -> (input_grad, weight_grad)``: the
  gradient of the loss with respect to the logits ``d = (softmax - onehot(masked_target) * inside) * grad``,
  with ``softmax`` given (the fast mode) or recomputed from ``input @ weight.T``, ``logits_max`` and
  ``sum_exp_logits`` (the memory-saving mode); ``input_grad = d @ weight``, ``weight_grad = d.T @ input``,
  computed in float32 (float64 for float64) and returned in input's dtype.

Refused with a ValueError naming the argument: ``label_smoothing`` other than 0 and ``input`` / ``weight`` of the
forward operator (documented as "only 0" / "only None").
"""
from __future__ import annotations

import torch

_FWD = "npu_fused_cross_entropy_loss_with_max_sum"
_BWD = "npu_fused_linear_cross_entropy_loss_with_max_sum_backward"


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _rows(op, n, **vectors):
    for name, t in vectors.items():
        if t is not None and (t.dim() != 1 or t.shape[0] != n):
            _fail(op, f"{name} must be 1-D with {n} entries (one per row), got {tuple(t.shape)}")


def npu_fused_cross_entropy_loss_with_max_sum(logits_max, sum_exp_logits, predicted_logits, *, label_smoothing=0.0,
                                              input=None, weight=None, vocab_parallel_logits=None):
    op = _FWD
    if label_smoothing not in (None, 0.0):
        _fail(op, f"label_smoothing must be 0.0 (the only documented value), got {label_smoothing}")
    if input is not None or weight is not None:
        _fail(op, "input and weight must be None (documented as the only supported value)")
    if logits_max.dim() != 1:
        _fail(op, f"logits_max must be 1-D (one entry per row), got {tuple(logits_max.shape)}")
    _rows(op, logits_max.shape[0], sum_exp_logits=sum_exp_logits, predicted_logits=predicted_logits)
    loss = torch.log(sum_exp_logits.float()) - predicted_logits.float()
    if vocab_parallel_logits is None:
        return loss, None
    if vocab_parallel_logits.dim() != 2 or vocab_parallel_logits.shape[0] != logits_max.shape[0]:
        _fail(op, f"vocab_parallel_logits must be (N, V) with N = {logits_max.shape[0]}, got "
                  f"{tuple(vocab_parallel_logits.shape)}")
    softmax = torch.exp(vocab_parallel_logits.float() - logits_max.float().unsqueeze(-1)) / \
        sum_exp_logits.float().unsqueeze(-1)
    return loss, softmax


def _unpack_bits(packed, n):
    """bool (n,) of the MSB-first bytes ``npu_fused_linear_online_max_sum`` writes."""
    shifts = torch.arange(7, -1, -1, device=packed.device, dtype=torch.int32)
    bits = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & 1
    return bits.reshape(-1)[:n].bool()


def npu_fused_linear_cross_entropy_loss_with_max_sum_backward(grad, input, weight, target_mask, masked_target,
                                                              label_smoothing=0.0, logits_max=None,
                                                              sum_exp_logits=None, softmax=None):
    op = _BWD
    if label_smoothing not in (None, 0.0):
        _fail(op, f"label_smoothing must be 0.0 (the only documented value), got {label_smoothing}")
    if input.dim() != 2 or weight.dim() != 2 or input.shape[1] != weight.shape[1]:
        _fail(op, f"input (N, H) and weight (V, H) must be 2-D with equal H, got {tuple(input.shape)} and "
                  f"{tuple(weight.shape)}")
    if input.dtype != weight.dtype:
        _fail(op, f"input and weight must share a dtype, got {input.dtype} and {weight.dtype}")
    n, v = input.shape[0], weight.shape[0]
    _rows(op, n, grad=grad, masked_target=masked_target, logits_max=logits_max, sum_exp_logits=sum_exp_logits)
    if target_mask.dtype != torch.uint8 or tuple(target_mask.shape) != ((n + 7) // 8,):
        _fail(op, f"target_mask must be uint8 of ceil(N / 8) = {(n + 7) // 8} bytes, got {target_mask.dtype} "
                  f"{tuple(target_mask.shape)}")
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    if softmax is None:
        if logits_max is None or sum_exp_logits is None:
            _fail(op, "without softmax, logits_max and sum_exp_logits must both be given (memory-saving mode)")
        logits = input.to(acc) @ weight.to(acc).t()
        softmax = torch.exp(logits - logits_max.to(acc).unsqueeze(-1)) / sum_exp_logits.to(acc).unsqueeze(-1)
    elif tuple(softmax.shape) != (n, v):
        _fail(op, f"softmax must be (N, V) = ({n}, {v}), got {tuple(softmax.shape)}")
    inside = ~_unpack_bits(target_mask, n)
    onehot = torch.nn.functional.one_hot(masked_target.long().clamp(0, v - 1), v).to(acc)
    d = (softmax.to(acc) - onehot * inside.unsqueeze(-1)) * grad.to(acc).unsqueeze(-1)
    return (d @ weight.to(acc)).to(input.dtype), (d.t() @ input.to(acc)).to(input.dtype)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_fused_cross_entropy_loss_with_max_sum(Tensor logits_max, Tensor sum_exp_logits, "
            "Tensor predicted_logits, *, float? label_smoothing=0.0, Tensor? input=None, Tensor? weight=None, "
            "Tensor? vocab_parallel_logits=None) -> (Tensor, Tensor)")
_lib.define("npu_fused_linear_cross_entropy_loss_with_max_sum_backward(Tensor grad, Tensor input, Tensor weight, "
            "Tensor target_mask, Tensor masked_target, float label_smoothing=0.0, Tensor? logits_max=None, "
            "Tensor? sum_exp_logits=None, Tensor? softmax=None) -> (Tensor, Tensor)")
for _fn in (npu_fused_cross_entropy_loss_with_max_sum, npu_fused_linear_cross_entropy_loss_with_max_sum_backward):
    _lib.impl(_fn.__name__, _fn, "CompositeImplicitAutograd")
