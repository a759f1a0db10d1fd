"""Mixture-of-experts token permute/unpermute (index and routing-map forms); Ascend's first inference routing trio
(init_routing, finalize_routing, compute_expert_tokens) is in routing.py.

* ``npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False) -> (permuted, sorted_indices)``:
  the (token, k) pairs of ``indices`` (N, topK) (or (N,), topK = 1) are stably sorted by expert;
  ``permuted[j] = tokens[order[j] // topK]`` and ``sorted_indices[i]`` is where pair ``i`` landed
  (``permuted[sorted_indices[i]] == tokens[i // topK]``, int32). ``num_out_tokens`` None/0 keeps every row,
  > 0 the first ``num_out_tokens``, < 0 slices ``[:num_out_tokens]``.
* ``npu_moe_token_unpermute(permuted, sorted_indices, probs=None, padded_mode=False, restore_shape=None)``:
  ``out[t] = sum_k permuted[sorted_indices[t * topK + k]] * probs[t, k]`` (topK = probs.shape[1], else 1);
  an index outside ``permuted``'s rows (a row that permute dropped, or -1) contributes nothing.
* ``npu_moe_token_permute_with_routing_map(tokens, routing_map, *, probs=None, num_out_tokens=None,
  drop_and_pad=False) -> (permuted, permuted_probs, sorted_indices)``: routing_map (N, E) bool/int8.
  Without drop_and_pad, every row routes to topK = num_out_tokens // N experts (num_out_tokens defaults to N);
  the pairs are ordered expert-major (tokens ascending within an expert) and ``sorted_indices`` is as above,
  with pair ``(t, k)`` the k-th expert of token t in ascending expert order. With drop_and_pad each expert takes
  capacity = num_out_tokens // E tokens: its routed tokens in order, padded with its unrouted ones;
  ``sorted_indices`` then holds the token of every slot. ``permuted_probs`` is ``probs[token, expert]`` per slot
  (an empty tensor without probs).
* ``npu_moe_token_unpermute_with_routing_map(permuted, sorted_indices, restore_shape, *, probs=None,
  routing_map=None, drop_and_pad=False)``: the inverse, weighting by ``probs[token, expert]``.
* ``_npu_moe_token_unpermute_with_routing_map`` (same arguments) -> ``(unpermuted, out_index, permuted_token_id,
  permute_probs)`` and ``npu_moe_token_unpermute_with_routing_map_grad(grad, out_index, permuted_token_id,
  routing_map, permuted_tokens, probs, drop_and_pad, restore_shape) -> (permuted_grad, probs_grad)``: the same
  unpermute split into a forward that returns what the gradient reads and the gradient itself (torch_npu's pair
  for hand-written autograd Functions). out_index is sorted_indices; without probs, permuted_tokens may be None.

padded_mode=True / restore_shape of the index forms is reserved on Ascend ("only False is supported") and raises.
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd


def _fail(op: str, msg: str):
    raise ValueError(f"{op}: {msg}")


def _acc_dtype(*ts) -> torch.dtype:
    """Accumulation dtype: at least float32, float64 when an input is float64."""
    dt = torch.float32
    for t in ts:
        if t is not None and t.dtype == torch.float64:
            dt = torch.float64
    return dt


# ---- index form ------------------------------------------------------------------------------------------
def _check_permute(tokens, indices, num_out_tokens, padded_mode) -> tuple[int, int]:
    op = "npu_moe_token_permute"
    if padded_mode:
        _fail(op, "padded_mode=True is reserved (Ascend supports only False)")
    if tokens.dim() != 2:
        _fail(op, f"tokens must be 2-D (num_tokens, hidden), got shape {tuple(tokens.shape)}")
    if indices.dim() not in (1, 2) or indices.dtype not in (torch.int32, torch.int64):
        _fail(op, f"indices must be a 1-D or 2-D int32/int64 tensor, got {indices.dtype} {tuple(indices.shape)}")
    if indices.shape[0] != tokens.shape[0]:
        _fail(op, f"indices has {indices.shape[0]} rows for {tokens.shape[0]} tokens")
    total = indices.numel()
    if num_out_tokens is None or num_out_tokens == 0:
        rows = total
    elif num_out_tokens > 0:
        rows = min(total, num_out_tokens)
    else:
        rows = max(total + num_out_tokens, 0)
    return (indices.shape[1] if indices.dim() == 2 else 1), rows


@custom_op("npu::npu_moe_token_permute", mutates_args=(), device_types="npu",
           schema="(Tensor tokens, Tensor indices, int? num_out_tokens=None, bool padded_mode=False) -> (Tensor, Tensor)")
def npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    topk, rows = _check_permute(tokens, indices, num_out_tokens, padded_mode)
    order = torch.argsort(indices.reshape(-1), stable=True)
    permuted = tokens.index_select(0, order[:rows] // topk)
    sorted_indices = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return permuted, sorted_indices.to(torch.int32)


@npu_moe_token_permute.register_fake
def _(tokens, indices, num_out_tokens=None, padded_mode=False):
    _, rows = _check_permute(tokens, indices, num_out_tokens, padded_mode)
    return tokens.new_empty(rows, tokens.shape[1]), indices.new_empty(indices.numel(), dtype=torch.int32)


def _gather(permuted: torch.Tensor, sorted_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows of permuted at sorted_indices, validity); an index outside permuted's rows selects zeros."""
    idx = sorted_indices.long()
    valid = (idx >= 0) & (idx < permuted.shape[0])
    rows = permuted.index_select(0, torch.where(valid, idx, 0))
    return rows * valid.unsqueeze(-1).to(rows.dtype), valid


def _unpermute(permuted, sorted_indices, weights, topk):
    """out[t] = sum_k permuted[sorted_indices[t*topk+k]] * weights[t, k] (weights None: 1)."""
    acc = _acc_dtype(permuted, weights)
    rows, _ = _gather(permuted.to(acc), sorted_indices)
    rows = rows.unflatten(0, (-1, topk))
    if weights is not None:
        rows = rows * weights.to(acc).unsqueeze(-1)
    return rows.sum(1).to(permuted.dtype)


def _unpermute_grads(grad, permuted, sorted_indices, weights, topk):
    """Gradients of _unpermute w.r.t. permuted and weights."""
    acc = _acc_dtype(permuted, weights, grad)
    g = grad.to(acc).repeat_interleave(topk, dim=0)  # row i of the (token, k) pairs
    if weights is not None:
        rows, _ = _gather(permuted.to(acc), sorted_indices)
        dweights = (rows * g).sum(-1).view(-1, topk).to(weights.dtype)
        g = g * weights.to(acc).reshape(-1, 1)
    else:
        dweights = None
    idx = sorted_indices.long()
    valid = (idx >= 0) & (idx < permuted.shape[0])
    dperm = torch.zeros(permuted.shape, dtype=acc, device=permuted.device).index_add_(
        0, torch.where(valid, idx, 0), g * valid.unsqueeze(-1).to(acc))
    return dperm.to(permuted.dtype), dweights


def _permute_setup(ctx, inputs, output):
    tokens, indices, _, _ = inputs
    ctx.save_for_backward(output[1])
    ctx.topk = indices.shape[1] if indices.dim() == 2 else 1


def _permute_backward(ctx, grad_permuted, _grad_indices):
    (sorted_indices,) = ctx.saved_tensors
    return torch.ops.npu._moe_unpermute(grad_permuted, sorted_indices, None, ctx.topk), None, None, None


register_autograd("npu::npu_moe_token_permute", _permute_backward, setup_context=_permute_setup)


def _check_unpermute(op, permuted, sorted_indices, probs) -> int:
    if permuted.dim() != 2:
        _fail(op, f"permuted_tokens must be 2-D, got shape {tuple(permuted.shape)}")
    if sorted_indices.dim() != 1 or sorted_indices.dtype not in (torch.int32, torch.int64):
        _fail(op, f"sorted_indices must be a 1-D int32 tensor, got {sorted_indices.dtype} "
                  f"{tuple(sorted_indices.shape)}")
    topk = probs.shape[-1] if probs is not None else 1
    if probs is not None and (probs.dim() != 2 or probs.numel() != sorted_indices.numel()):
        _fail(op, f"probs must be (num_tokens, topK) with num_tokens * topK = {sorted_indices.numel()} "
                  f"sorted indices, got {tuple(probs.shape)}")
    return topk


# The shared kernel of unpermute and of permute's backward (which has a topK but no probs).
@custom_op("npu::_moe_unpermute", mutates_args=(), device_types="npu",
           schema="(Tensor permuted, Tensor sorted_indices, Tensor? probs, int topk) -> Tensor")
def _moe_unpermute(permuted, sorted_indices, probs, topk):
    return _unpermute(permuted, sorted_indices, probs, topk)


@_moe_unpermute.register_fake
def _(permuted, sorted_indices, probs, topk):
    return permuted.new_empty(sorted_indices.shape[0] // topk, permuted.shape[1])


@custom_op("npu::_moe_unpermute_backward", mutates_args=(), device_types="npu",
           schema="(Tensor grad, Tensor permuted, Tensor sorted_indices, Tensor? probs, int topk) -> (Tensor, Tensor?)")
def _moe_unpermute_backward(grad, permuted, sorted_indices, probs, topk):
    return _unpermute_grads(grad, permuted, sorted_indices, probs, topk)


@_moe_unpermute_backward.register_fake
def _(grad, permuted, sorted_indices, probs, topk):
    return torch.empty_like(permuted), (torch.empty_like(probs) if probs is not None else None)


def _unpermute_setup(ctx, inputs, output):
    permuted, sorted_indices, probs, topk = inputs
    ctx.save_for_backward(permuted, sorted_indices, probs)
    ctx.topk = topk


def _unpermute_backward(ctx, grad):
    permuted, sorted_indices, probs = ctx.saved_tensors
    dperm, dprobs = torch.ops.npu._moe_unpermute_backward(grad, permuted, sorted_indices, probs, ctx.topk)
    return dperm, None, dprobs, None


register_autograd("npu::_moe_unpermute", _unpermute_backward, setup_context=_unpermute_setup)


def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    op = "npu_moe_token_unpermute"
    if padded_mode or restore_shape is not None:
        _fail(op, "padded_mode=True / restore_shape are reserved (Ascend supports only False / None)")
    topk = _check_unpermute(op, permuted_tokens, sorted_indices, probs)
    return torch.ops.npu._moe_unpermute(permuted_tokens, sorted_indices, probs, topk)


# ---- routing-map form --------------------------------------------------------------------------------------
def _check_routing(op, tokens, routing_map, probs):
    if tokens.dim() != 2 or routing_map.dim() != 2 or routing_map.shape[0] != tokens.shape[0]:
        _fail(op, f"tokens (N, H) and routing_map (N, E) must be 2-D with equal N, got {tuple(tokens.shape)} "
                  f"and {tuple(routing_map.shape)}")
    if routing_map.dtype not in (torch.bool, torch.int8):
        _fail(op, f"routing_map must be bool or int8 (0/1), got {routing_map.dtype}")
    if probs is not None and tuple(probs.shape) != tuple(routing_map.shape):
        _fail(op, f"probs must have routing_map's shape {tuple(routing_map.shape)}, got {tuple(probs.shape)}")


def _routing_rows(tokens, routing_map, num_out_tokens, drop_and_pad) -> int:
    n, e = routing_map.shape
    out = n if num_out_tokens is None else num_out_tokens
    if not 0 <= out <= n * e:
        _fail("npu_moe_token_permute_with_routing_map", f"num_out_tokens must be in [0, {n * e}], got {out}")
    if drop_and_pad:
        if out // e > n:
            _fail("npu_moe_token_permute_with_routing_map", f"capacity {out // e} exceeds the {n} tokens")
        return (out // e) * e
    return (out // n) * n if n else 0


def _routing_slots(routing_map, num_out_tokens, drop_and_pad):
    """(token, expert) of every permuted slot, in permuted order, and sorted_indices."""
    n, e = routing_map.shape
    rm = routing_map.bool()
    out = n if num_out_tokens is None else num_out_tokens
    dev = routing_map.device
    if drop_and_pad:
        cap = out // e
        tok = torch.argsort(rm.t().to(torch.int8), dim=1, descending=True, stable=True)[:, :cap].reshape(-1)
        exp = torch.arange(e, device=dev).repeat_interleave(cap)
        return tok, exp, tok.to(torch.int32)
    topk = out // n if n else 0
    counts = rm.sum(1)
    if n and bool((counts != topk).any()):
        _fail("npu_moe_token_permute_with_routing_map",
              f"every routing_map row must route to num_out_tokens // num_tokens = {topk} experts without "
              f"drop_and_pad; row counts are {counts.tolist()}")
    exp, tok = rm.t().nonzero(as_tuple=True)  # expert-major, tokens ascending
    sorted_indices = torch.argsort(tok * e + exp).to(torch.int32)  # slot of pair (t, k-th expert of t)
    return tok, exp, sorted_indices


# The kernels of the routing-map forms take every argument positionally: torch.library's autograd gives
# gradients to positional arguments only, and probs (keyword-only in Ascend's signature) needs one.
@custom_op("npu::_moe_permute_routing_map", mutates_args=(), device_types="npu", schema=(
    "(Tensor tokens, Tensor routing_map, Tensor? probs, int? num_out_tokens, bool drop_and_pad)"
    " -> (Tensor, Tensor, Tensor)"))
def _moe_permute_routing_map(tokens, routing_map, probs, num_out_tokens, drop_and_pad):
    _check_routing("npu_moe_token_permute_with_routing_map", tokens, routing_map, probs)
    _routing_rows(tokens, routing_map, num_out_tokens, drop_and_pad)
    tok, exp, sorted_indices = _routing_slots(routing_map, num_out_tokens, drop_and_pad)
    permuted = tokens.index_select(0, tok)
    pprobs = probs[tok, exp] if probs is not None else tokens.new_empty(0)
    return permuted, pprobs, sorted_indices


@_moe_permute_routing_map.register_fake
def _(tokens, routing_map, probs, num_out_tokens, drop_and_pad):
    _check_routing("npu_moe_token_permute_with_routing_map", tokens, routing_map, probs)
    rows = _routing_rows(tokens, routing_map, num_out_tokens, drop_and_pad)
    pprobs = probs.new_empty(rows) if probs is not None else tokens.new_empty(0)
    return tokens.new_empty(rows, tokens.shape[1]), pprobs, tokens.new_empty(rows, dtype=torch.int32)


@custom_op("npu::_moe_permute_routing_map_backward", mutates_args=(), device_types="npu", schema=(
    "(Tensor grad_permuted, Tensor? grad_probs, Tensor routing_map, Tensor sorted_indices, int? num_out_tokens, "
    "bool drop_and_pad, int num_tokens) -> (Tensor, Tensor?)"))
def _moe_permute_routing_map_backward(grad_permuted, grad_probs, routing_map, sorted_indices, num_out_tokens,
                                      drop_and_pad, num_tokens):
    n, e = routing_map.shape
    tok, exp, _ = _routing_slots(routing_map, num_out_tokens, drop_and_pad)
    acc = _acc_dtype(grad_permuted)
    dtokens = torch.zeros(n, grad_permuted.shape[1], dtype=acc, device=grad_permuted.device).index_add_(
        0, tok, grad_permuted.to(acc)).to(grad_permuted.dtype)
    dprobs = None
    if grad_probs is not None:
        dprobs = torch.zeros(n * e, dtype=_acc_dtype(grad_probs), device=grad_probs.device).index_add_(
            0, tok * e + exp, grad_probs.to(_acc_dtype(grad_probs))).view(n, e).to(grad_probs.dtype)
    return dtokens, dprobs


@_moe_permute_routing_map_backward.register_fake
def _(grad_permuted, grad_probs, routing_map, sorted_indices, num_out_tokens, drop_and_pad, num_tokens):
    dprobs = grad_probs.new_empty(routing_map.shape) if grad_probs is not None else None
    return grad_permuted.new_empty(num_tokens, grad_permuted.shape[1]), dprobs


def _permute_map_setup(ctx, inputs, output):
    tokens, routing_map, probs, num_out_tokens, drop_and_pad = inputs
    ctx.save_for_backward(routing_map, output[2])
    ctx.has_probs = probs is not None
    ctx.cfg = (num_out_tokens, drop_and_pad, tokens.shape[0])


def _permute_map_backward(ctx, grad_permuted, grad_probs, _grad_indices):
    routing_map, sorted_indices = ctx.saved_tensors
    num_out_tokens, drop_and_pad, num_tokens = ctx.cfg
    dtokens, dprobs = torch.ops.npu._moe_permute_routing_map_backward(
        grad_permuted, grad_probs if ctx.has_probs else None, routing_map, sorted_indices, num_out_tokens,
        drop_and_pad, num_tokens)
    return dtokens, None, dprobs, None, None


register_autograd("npu::_moe_permute_routing_map", _permute_map_backward, setup_context=_permute_map_setup)


def _check_unpermute_map(op, permuted, sorted_indices, restore_shape, probs, routing_map, drop_and_pad):
    if permuted.dim() != 2 or sorted_indices.dim() != 1 or sorted_indices.shape[0] != permuted.shape[0]:
        _fail(op, f"permuted_tokens (P, H) and sorted_indices (P,) must match, got {tuple(permuted.shape)} and "
                  f"{tuple(sorted_indices.shape)}")
    # the hidden size comes from permuted_tokens: a kernel on a hidden-sharded DTensor sees its local shard
    if len(restore_shape) != 2:
        _fail(op, f"restore_shape must be (num_tokens, hidden), got {list(restore_shape)}")
    n = restore_shape[0]
    if probs is not None:
        if routing_map is None or probs.shape != routing_map.shape or probs.dim() != 2 or probs.shape[0] != n:
            _fail(op, f"probs needs routing_map, both ({n}, num_experts), got probs {tuple(probs.shape)} and "
                      f"routing_map {None if routing_map is None else tuple(routing_map.shape)}")
        e = probs.shape[1]
        if drop_and_pad and permuted.shape[0] % e:
            _fail(op, f"drop_and_pad: {permuted.shape[0]} rows are not num_experts ({e}) x capacity")
        if not drop_and_pad and n and permuted.shape[0] % n:
            _fail(op, f"{permuted.shape[0]} rows are not num_tokens ({n}) x topK")


def _slot_weights(sorted_indices, probs, routing_map, drop_and_pad, n):
    """Weight of every sorted_indices entry: probs[token, expert] of the slot."""
    e = probs.shape[1]
    if drop_and_pad:
        cap = sorted_indices.shape[0] // e
        exp = torch.arange(e, device=probs.device).repeat_interleave(cap)
        tok = sorted_indices.long().clamp(0, max(n - 1, 0))
        return probs[tok, exp]
    topk = sorted_indices.shape[0] // n
    rm = routing_map.bool()
    # k-th routed expert of each token, in ascending expert order; slots past a row's count weigh 0
    rank = rm.long().cumsum(1) - 1
    w = torch.zeros(n, topk + 1, dtype=probs.dtype, device=probs.device)
    w.scatter_(1, torch.where(rm, rank.clamp(max=topk), topk), probs * rm)
    return w[:, :topk].reshape(-1)


@custom_op("npu::_moe_unpermute_routing_map", mutates_args=(), device_types="npu", schema=(
    "(Tensor permuted_tokens, Tensor sorted_indices, SymInt[] restore_shape, Tensor? probs, Tensor? routing_map, "
    "bool drop_and_pad) -> Tensor"))
def _moe_unpermute_routing_map(permuted_tokens, sorted_indices, restore_shape, probs, routing_map, drop_and_pad):
    op = "npu_moe_token_unpermute_with_routing_map"
    _check_unpermute_map(op, permuted_tokens, sorted_indices, restore_shape, probs, routing_map, drop_and_pad)
    n = restore_shape[0]
    acc = _acc_dtype(permuted_tokens, probs)
    if drop_and_pad:  # sorted_indices holds the token of each slot
        rows = permuted_tokens.to(acc)
        if probs is not None:
            rows = rows * _slot_weights(sorted_indices, probs, routing_map, True, n).to(acc).unsqueeze(-1)
        idx = sorted_indices.long()
        return torch.zeros(n, rows.shape[1], dtype=acc, device=rows.device).index_add_(
            0, idx, rows).to(permuted_tokens.dtype)
    topk = sorted_indices.shape[0] // n if n else 1
    w = _slot_weights(sorted_indices, probs, routing_map, False, n).view(n, topk) if probs is not None else None
    return _unpermute(permuted_tokens, sorted_indices, w, topk)


@_moe_unpermute_routing_map.register_fake
def _(permuted_tokens, sorted_indices, restore_shape, probs, routing_map, drop_and_pad):
    _check_unpermute_map("npu_moe_token_unpermute_with_routing_map", permuted_tokens, sorted_indices,
                         restore_shape, probs, routing_map, drop_and_pad)
    return permuted_tokens.new_empty(restore_shape[0], permuted_tokens.shape[1])


@custom_op("npu::_moe_unpermute_routing_map_backward", mutates_args=(), device_types="npu", schema=(
    "(Tensor grad, Tensor permuted_tokens, Tensor sorted_indices, Tensor? probs, Tensor? routing_map, "
    "bool drop_and_pad) -> (Tensor, Tensor?)"))
def _moe_unpermute_routing_map_backward(grad, permuted, sorted_indices, probs, routing_map, drop_and_pad):
    n = grad.shape[0]
    acc = _acc_dtype(permuted, probs, grad)
    if drop_and_pad:
        idx = sorted_indices.long()
        g = grad.to(acc).index_select(0, idx)  # gradient reaching each slot
        dprobs = None
        if probs is not None:
            e = probs.shape[1]
            w = _slot_weights(sorted_indices, probs, routing_map, True, n).to(acc)
            dslot = (g * permuted.to(acc)).sum(-1)
            exp = torch.arange(e, device=g.device).repeat_interleave(sorted_indices.shape[0] // e)
            dprobs = torch.zeros(n * e, dtype=acc, device=g.device).index_add_(0, idx * e + exp, dslot)
            dprobs = dprobs.view(n, e).to(probs.dtype)
            g = g * w.unsqueeze(-1)
        return g.to(permuted.dtype), dprobs
    topk = sorted_indices.shape[0] // n if n else 1
    if probs is None:
        return _unpermute_grads(grad, permuted, sorted_indices, None, topk)
    w = _slot_weights(sorted_indices, probs, routing_map, False, n).view(n, topk)
    dperm, dw = _unpermute_grads(grad, permuted, sorted_indices, w, topk)
    # scatter each slot's weight gradient back to its (token, expert)
    rm = routing_map.bool()
    rank = torch.where(rm, (rm.long().cumsum(1) - 1).clamp(max=topk - 1), 0)
    dprobs = torch.gather(dw, 1, rank) * rm
    return dperm, dprobs.to(probs.dtype)


@_moe_unpermute_routing_map_backward.register_fake
def _(grad, permuted_tokens, sorted_indices, probs, routing_map, drop_and_pad):
    return torch.empty_like(permuted_tokens), (torch.empty_like(probs) if probs is not None else None)


def _unpermute_map_setup(ctx, inputs, output):
    permuted, sorted_indices, _, probs, routing_map, drop_and_pad = inputs
    ctx.drop_and_pad = drop_and_pad
    ctx.save_for_backward(permuted, sorted_indices, probs, routing_map)


def _unpermute_map_backward(ctx, grad):
    permuted, sorted_indices, probs, routing_map = ctx.saved_tensors
    dperm, dprobs = torch.ops.npu._moe_unpermute_routing_map_backward(grad, permuted, sorted_indices, probs,
                                                                      routing_map, ctx.drop_and_pad)
    return dperm, None, None, dprobs, None, None


register_autograd("npu::_moe_unpermute_routing_map", _unpermute_map_backward, setup_context=_unpermute_map_setup)


# ---- the public operators whose kernels are the positional ops above ------------------------------------------
def npu_moe_token_permute_with_routing_map(tokens, routing_map, *, probs=None, num_out_tokens=None,
                                           drop_and_pad=False):
    return torch.ops.npu._moe_permute_routing_map(tokens, routing_map, probs, num_out_tokens, drop_and_pad)


def npu_moe_token_unpermute_with_routing_map(permuted_tokens, sorted_indices, restore_shape, *, probs=None,
                                             routing_map=None, drop_and_pad=False):
    return torch.ops.npu._moe_unpermute_routing_map(permuted_tokens, sorted_indices, restore_shape, probs,
                                                    routing_map, drop_and_pad)


_lib = torch.library.Library("npu", "FRAGMENT")
for _name, _schema, _fn in (
        ("npu_moe_token_unpermute", "(Tensor permuted_tokens, Tensor sorted_indices, Tensor? probs=None, "
         "bool padded_mode=False, SymInt[]? restore_shape=None) -> Tensor", npu_moe_token_unpermute),
        ("npu_moe_token_permute_with_routing_map", "(Tensor tokens, Tensor routing_map, *, Tensor? probs=None, "
         "int? num_out_tokens=None, bool drop_and_pad=False) -> (Tensor, Tensor, Tensor)",
         npu_moe_token_permute_with_routing_map),
        ("npu_moe_token_unpermute_with_routing_map", "(Tensor permuted_tokens, Tensor sorted_indices, "
         "SymInt[] restore_shape, *, Tensor? probs=None, Tensor? routing_map=None, bool drop_and_pad=False) "
         "-> Tensor", npu_moe_token_unpermute_with_routing_map)):
    _lib.define(_name + _schema)
    # Composite: autograd and tracing see the positional kernel each decomposes into.
    _lib.impl(_name, _fn, "CompositeImplicitAutograd")


# ---- the routing-map unpermute split into forward-with-indices and gradient (torch_npu's private forward and its
# grad operator: an autograd.Function written against torch_npu, e.g. torchtitan-npu's expert-parallel combine,
# calls the pair itself) -------------------------------------------------------------------------------------------
def _npu_moe_token_unpermute_with_routing_map(permuted_tokens, sorted_indices, restore_shape, *, probs=None,
                                              routing_map=None, drop_and_pad=False):
    """(unpermuted, out_index, permuted_token_id, permute_probs): the unpermute above plus what its gradient reads.
    out_index is sorted_indices (the permuted row of each (token, k) pair; with drop_and_pad the token of each
    slot), permuted_token_id the token of each entry, permute_probs the weight of each entry (None without probs)."""
    out = torch.ops.npu._moe_unpermute_routing_map(permuted_tokens, sorted_indices, restore_shape, probs,
                                                   routing_map, drop_and_pad)
    n = restore_shape[0]
    if drop_and_pad:
        token_id = sorted_indices.clone()
    else:
        topk = sorted_indices.shape[0] // n if n else 1
        token_id = torch.arange(sorted_indices.shape[0], device=sorted_indices.device).div(
            topk, rounding_mode="floor").to(sorted_indices.dtype)
    weights = None
    if probs is not None:
        weights = _slot_weights(sorted_indices, probs, routing_map, drop_and_pad, n).to(probs.dtype)
    return out, sorted_indices.clone(), token_id, weights


def npu_moe_token_unpermute_with_routing_map_grad(unpermuted_tokens_grad, out_index, permuted_token_id,
                                                  routing_map, permuted_tokens, probs, drop_and_pad, restore_shape):
    """(permuted_tokens_grad (len(out_index), H), probs_grad or None) of the unpermute whose forward returned
    out_index and permuted_token_id. Without probs the permuted rows only route the gradient, so permuted_tokens
    may be None; with probs the weights' gradient needs permuted_tokens and routing_map."""
    op = "npu_moe_token_unpermute_with_routing_map_grad"
    if out_index.dim() != 1 or permuted_token_id.shape != out_index.shape:
        _fail(op, f"out_index and permuted_token_id must be the 1-D index tensors the forward returned, got "
                  f"{tuple(out_index.shape)} and {tuple(permuted_token_id.shape)}")
    if unpermuted_tokens_grad.dim() != 2 or len(restore_shape) != 2 or \
            unpermuted_tokens_grad.shape[0] != restore_shape[0]:
        _fail(op, f"unpermuted_tokens_grad must be (num_tokens, hidden) with num_tokens = restore_shape[0], got "
                  f"{tuple(unpermuted_tokens_grad.shape)} and restore_shape {list(restore_shape)}")
    if probs is not None and (permuted_tokens is None or routing_map is None):
        _fail(op, "probs' gradient needs permuted_tokens and routing_map (pass the forward's inputs)")
    n = unpermuted_tokens_grad.shape[0]
    if not drop_and_pad and n and out_index.shape[0] % n:
        _fail(op, f"{out_index.shape[0]} indices are not num_tokens ({n}) x topK")
    if permuted_tokens is None:
        # Only the shape and dtype of the permuted rows matter when no weight gradient is asked for.
        permuted_tokens = unpermuted_tokens_grad.new_empty(out_index.shape[0], unpermuted_tokens_grad.shape[1])
    dperm, dprobs = torch.ops.npu._moe_unpermute_routing_map_backward(
        unpermuted_tokens_grad, permuted_tokens, out_index, probs, routing_map, drop_and_pad)
    return dperm.to(unpermuted_tokens_grad.dtype), (
        None if dprobs is None else dprobs.to(unpermuted_tokens_grad.dtype))


_lib.define("_npu_moe_token_unpermute_with_routing_map(Tensor permuted_tokens, Tensor sorted_indices, "
            "SymInt[] restore_shape, *, Tensor? probs=None, Tensor? routing_map=None, bool drop_and_pad=False) "
            "-> (Tensor, Tensor, Tensor, Tensor?)")
_lib.impl("_npu_moe_token_unpermute_with_routing_map", _npu_moe_token_unpermute_with_routing_map,
          "CompositeImplicitAutograd")
_lib.define("npu_moe_token_unpermute_with_routing_map_grad(Tensor unpermuted_tokens_grad, Tensor out_index, "
            "Tensor permuted_token_id, Tensor? routing_map, Tensor? permuted_tokens, Tensor? probs, "
            "bool drop_and_pad, SymInt[] restore_shape) -> (Tensor, Tensor?)")
_lib.impl("npu_moe_token_unpermute_with_routing_map_grad", npu_moe_token_unpermute_with_routing_map_grad,
          "CompositeImplicitAutograd")
