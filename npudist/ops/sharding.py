"""DTensor sharding rules for the npu operators (``torch.distributed.tensor.experimental.register_sharding``).

Rules: every operator accepts all-Replicate inputs; the row-wise operators (rms_norm, swiglu, geglu, rotary_mul,
scaled_masked_softmax) also accept inputs sharded on a leading (batch/sequence/head) dim they do not reduce
over, giving outputs sharded the same way; backward operators produce ``Partial`` (summed) gradients for
replicated weights. The MoE token permute/unpermute kernels (both forms) move whole token rows, so tokens sharded
on the hidden dim (Shard(1)) with replicated indices, routing map and probs give hidden-sharded outputs; the
gradient of the replicated probs is then ``Partial`` (a sum over hidden). The elementwise activations
(fast_gelu, silu, mish) take any sharding, gelu_mul any but the last dim, add_rms_norm, gemma_rms_norm and
layer_norm_eval a leading dim they do not normalise over. aten.matmul and aten.matmul_backward have rules for
the linear ((..., m, k) @ (k, n)) and equal-batch forms: batch/row sharding, and the column- and
row-parallel (Partial) splits of the weight (see _register_matmul_rules). npu_fusion_attention, apply_adam_w
and grouped_matmul have no rule: on DTensors they raise DTensor's error naming the operator (run them on local
shards, e.g. under ``local_map``).

``torch.distributed.tensor`` costs seconds to import, so ``import npudist`` does not register these;
``import torch_npu`` does, and npudist-only programs call :func:`register` once.
"""
from __future__ import annotations

import torch

_registered = False


def _batch_dims(ndim: int, reduced_trailing: int) -> range:
    return range(max(ndim - reduced_trailing, 0))


def _register_rules() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    ops = torch.ops.npu
    R = Replicate()

    def rowwise_dim(x, dim):
        return dim % x.ndim

    @register_sharding(ops.npu_rms_norm.default)
    def _(x, gamma, epsilon=1e-6):
        rules = [([R, R], [R, R, None])]
        for d in _batch_dims(x.ndim, gamma.ndim):
            rules.append(([Shard(d), Shard(d)], [Shard(d), R, None]))
        return rules

    @register_sharding(ops.npu_rms_norm_backward.default)
    def _(dy, x, gamma, rstd):
        rules = [([R, R], [R, R, R, R])]
        for d in _batch_dims(x.ndim, gamma.ndim):
            rules.append(([Shard(d), Partial()], [Shard(d), Shard(d), R, Shard(d)]))
        return rules

    def split_rules(n_out, n_in_tensors, n_scalars):
        def rules(x, dim=-1, *rest):
            out = [([R] * n_out, [R] * n_in_tensors + [None] * n_scalars)]
            for d in range(x.ndim):
                if d != rowwise_dim(x, dim):
                    out.append(([Shard(d)] * n_out, [Shard(d)] * n_in_tensors + [None] * n_scalars))
            return out
        return rules

    register_sharding(ops.npu_swiglu.default)(split_rules(1, 1, 1))
    register_sharding(ops.npu_geglu.default)(split_rules(2, 1, 2))

    @register_sharding(ops.npu_swiglu_backward.default)
    def _(grad, x, dim=-1):
        return [([Shard(d)], [Shard(d), Shard(d), None]) for d in range(x.ndim) if d != rowwise_dim(x, dim)] + [
            ([R], [R, R, None])]

    @register_sharding(ops.npu_geglu_grad.default)
    def _(grad_out, grad_gelu, x, dim=-1, approximate=1):
        return [([Shard(d)], [Shard(d)] * 3 + [None, None]) for d in range(x.ndim) if d != rowwise_dim(x, dim)] + [
            ([R], [R, R, R, None, None])]

    def follow(r, x, d):
        """Placement of a broadcast operand r when x is sharded on d (a size-1/missing dim stays replicated)."""
        rd = d - (x.ndim - r.ndim)
        return Shard(rd) if rd >= 0 and r.shape[rd] == x.shape[d] else R

    @register_sharding(ops.npu_rotary_mul.default)
    def _(x, r1, r2, rotary_mode="half", rotate=None):
        rot = None if rotate is None else R
        rules = [([R], [R, R, R, None, rot])]
        for d in range(x.ndim - 1):
            rules.append(([Shard(d)], [Shard(d), follow(r1, x, d), follow(r2, x, d), None, rot]))
        return rules

    @register_sharding(ops.npu_rotary_mul_backward.default)
    def _(grad, x, r1, r2, rotary_mode="half", rotate=None):
        rot = None if rotate is None else R
        rules = [([R, R, R], [R, R, R, R, None, rot])]
        for d in range(x.ndim - 1):
            p1, p2 = follow(r1, x, d), follow(r2, x, d)
            outs = [Shard(d), p1 if p1 != R else Partial(), p2 if p2 != R else Partial()]
            rules.append((outs, [Shard(d), Shard(d), p1, p2, None, rot]))
        return rules

    @register_sharding(ops.npu_scaled_masked_softmax.default)
    def _(x, mask, scale=1.0, fixed_triu_mask=False):
        rules = [([R], [R, R, None, None])]
        for d in range(x.ndim - 2 if fixed_triu_mask else x.ndim - 1):
            rules.append(([Shard(d)], [Shard(d), follow(mask, x, d), None, None]))
        return rules

    @register_sharding(ops.npu_scaled_masked_softmax_backward.default)
    def _(y_grad, y, mask, scale, fixed_triu_mask):
        rules = [([R], [R, R, R, None, None])]
        for d in range(y.ndim - 2 if fixed_triu_mask else y.ndim - 1):
            rules.append(([Shard(d)], [Shard(d), Shard(d), follow(mask, y, d), None, None]))
        return rules


def _register_moe_rules() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    ops = torch.ops.npu
    R, H = Replicate(), Shard(1)

    def opt(t, p):  # an optional tensor argument: no placement when absent
        return None if t is None else p

    @register_sharding(ops.npu_moe_token_permute.default)
    def _(tokens, indices, num_out_tokens=None, padded_mode=False):
        return [([R, R], [R, R, None, None]), ([H, R], [H, R, None, None])]

    @register_sharding(ops._moe_unpermute.default)
    def _(permuted, sorted_indices, probs, topk):
        return [([R], [R, R, opt(probs, R), None]), ([H], [H, R, opt(probs, R), None])]

    @register_sharding(ops._moe_unpermute_backward.default)
    def _(grad, permuted, sorted_indices, probs, topk):
        return [([R, opt(probs, R)], [R, R, R, opt(probs, R), None]),
                ([H, opt(probs, Partial())], [H, H, R, opt(probs, R), None])]

    @register_sharding(ops._moe_permute_routing_map.default)
    def _(tokens, routing_map, probs, num_out_tokens, drop_and_pad):
        return [([R, R, R], [R, R, opt(probs, R), None, None]), ([H, R, R], [H, R, opt(probs, R), None, None])]

    @register_sharding(ops._moe_permute_routing_map_backward.default)
    def _(grad_permuted, grad_probs, routing_map, sorted_indices, num_out_tokens, drop_and_pad, num_tokens):
        gp = opt(grad_probs, R)
        return [([R, gp], [R, gp, R, R, None, None, None]), ([H, gp], [H, gp, R, R, None, None, None])]

    @register_sharding(ops._moe_unpermute_routing_map.default)
    def _(permuted, sorted_indices, restore_shape, probs, routing_map, drop_and_pad):
        p, m = opt(probs, R), opt(routing_map, R)
        return [([R], [R, R, None, p, m, None]), ([H], [H, R, None, p, m, None])]

    @register_sharding(ops._moe_unpermute_routing_map_backward.default)
    def _(grad, permuted, sorted_indices, probs, routing_map, drop_and_pad):
        p, m = opt(probs, R), opt(routing_map, R)
        return [([R, p], [R, R, R, p, m, None]), ([H, opt(probs, Partial())], [H, H, R, p, m, None])]


def _register_norm_activation_rules() -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    ops = torch.ops.npu
    R = Replicate()

    def elementwise(n_in):  # y = f(x) (and its backward f'(x) * g): any dim
        def rules(x, *rest):
            return [([R], [R] * n_in)] + [([Shard(d)], [Shard(d)] * n_in) for d in range(x.ndim)]
        return rules

    for op, n_in in ((ops.npu_fast_gelu, 1), (ops.npu_fast_gelu_backward, 2), (ops.npu_silu, 1),
                     (ops.npu_silu_backward, 3), (ops.npu_mish, 1), (ops.npu_mish_backward, 2)):
        register_sharding(op.default)(elementwise(n_in))

    @register_sharding(ops.npu_gelu_mul.default)
    def _(x, *, approximate="none"):
        return [([R], [R])] + [([Shard(d)], [Shard(d)]) for d in range(x.ndim - 1)]

    @register_sharding(ops._gelu_mul_backward.default)
    def _(grad, x, approximate):
        return [([R], [R, R, None])] + [([Shard(d)], [Shard(d), Shard(d), None]) for d in range(x.ndim - 1)]

    @register_sharding(ops.npu_add_rms_norm.default)
    def _(x1, x2, gamma, epsilon=1e-6):
        rules = [([R, R, R], [R, R, R, None])]
        for d in _batch_dims(x1.ndim, gamma.ndim):
            rules.append(([Shard(d), Shard(d), Shard(d)], [Shard(d), Shard(d), R, None]))
        return rules

    @register_sharding(ops.npu_gemma_rms_norm.default)
    def _(x, gamma, epsilon=1e-6):
        rules = [([R, R], [R, R, None])]
        for d in _batch_dims(x.ndim, gamma.ndim):
            rules.append(([Shard(d), Shard(d)], [Shard(d), R, None]))
        return rules

    @register_sharding(ops.npu_layer_norm_eval.default)
    def _(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        w, b = (None if t is None else R for t in (weight, bias))
        return [([R], [R, None, w, b, None])] + [
            ([Shard(d)], [Shard(d), None, w, b, None]) for d in _batch_dims(x.ndim, len(normalized_shape))]



def _register_matmul_rules() -> None:
    """aten.matmul and aten.matmul_backward, the aten strategies torch_npu registers (clients look them up in
    DTensor's strategy table and wrap them). In training, torch.matmul on npu DTensors decomposes into mm/bmm
    before DTensor sees it (as upstream torch); aten.matmul reaches these rules under inference mode, and
    aten.matmul_backward when called (npudist has its npu kernel)."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    aten = torch.ops.aten
    R, P = Replicate(), Partial()

    def form(x, w):
        """'linear' for (..., m, k) @ (k, n), 'batched' for equal-rank operands with equal batch dims."""
        if x.ndim >= 2 and w.ndim == 2:
            return "linear"
        if x.ndim == w.ndim > 2 and tuple(x.shape[:-2]) == tuple(w.shape[:-2]):
            return "batched"
        return None

    @register_sharding(aten.matmul.default)
    def _(x, w):
        rules, a, kind = [([R], [R, R])], x.ndim, form(x, w)
        if kind == "linear":
            rules += [([Shard(d)], [Shard(d), R]) for d in range(a - 1)]
            rules += [([P], [Shard(a - 1), Shard(0)]), ([Shard(a - 1)], [R, Shard(1)])]
        elif kind == "batched":
            rules += [([Shard(d)], [Shard(d), Shard(d)]) for d in range(a - 2)]
            rules += [([Shard(a - 2)], [Shard(a - 2), R]), ([Shard(a - 1)], [R, Shard(a - 1)]),
                      ([P], [Shard(a - 1), Shard(a - 2)])]
        return rules

    @register_sharding(aten.matmul_backward.default)
    def _(grad, x, w, mask):
        rules, a, kind = [([R, R], [R, R, R, None])], x.ndim, form(x, w)
        if kind == "linear":
            rules += [([Shard(d), P], [Shard(d), Shard(d), R, None]) for d in range(a - 1)]
            rules += [([Shard(a - 1), Shard(0)], [R, Shard(a - 1), Shard(0), None]),
                      ([P, Shard(1)], [Shard(a - 1), R, Shard(1), None])]
        elif kind == "batched":
            rules += [([Shard(d), Shard(d)], [Shard(d)] * 3 + [None]) for d in range(a - 2)]
            rules += [([Shard(a - 2), P], [Shard(a - 2), Shard(a - 2), R, None]),
                      ([P, Shard(a - 1)], [Shard(a - 1), R, Shard(a - 1), None]),
                      ([Shard(a - 1), Shard(a - 2)], [R, Shard(a - 1), Shard(a - 2), None])]
        return rules


def register() -> None:
    """Register the DTensor rules (idempotent); imports torch.distributed.tensor."""
    global _registered
    if not _registered:
        _register_rules()
        _register_moe_rules()
        _register_norm_activation_rules()
        _register_matmul_rules()
        _registered = True
