"""torch_npu's causal depthwise conv1d over variable-length sequences with a per-sequence state cache,
``npu_fused_causal_conv1d`` (vLLM's ``causal_conv1d_fn`` with initial states, as the page describes it).

``npu_fused_causal_conv1d(x, weight, conv_states, *, query_start_loc=None, cache_indices=None, pad_slot_id=-1,
residual_connection=0, max_query_len=-1, block_size=128, conv_mode="default", ...)``: ``x`` is (cu_seq_len, dim)
with ``query_start_loc`` (batch + 1) cumulative sequence starts, or (batch, seq_len, dim); ``weight`` (K, dim);
``conv_states`` (..., state_len, dim) with ``state_len >= K - 1``, sequence ``b`` using the state row
``cache_indices[b]`` (``b`` without ``cache_indices``). Each sequence is padded at its head with the last K - 1
rows of its state, ``y[t] = sum_k weight[k] * padded[t + k]`` (the conv1d tap order: ``weight[K - 1]`` on the
current token), plus ``x[t]`` with ``residual_connection`` 1; then the state row is updated in place to the last
``state_len`` rows of (old state ++ the sequence). A sequence whose ``cache_indices`` entry is ``pad_slot_id`` is
skipped: its state is untouched and its output rows are 0. Accumulated in float32 (float64 for float64), y in
x's dtype.

Refused with a ValueError naming the argument, as the page marks them unsupported ("暂不支持") or leaves them
undefined: ``bias``, ``initial_state_mode``, ``activation`` other than "None", ``run_mode`` other than 0,
``num_accepted_tokens`` (speculative decoding), ``conv_mode`` "pangu" and its ``num_computed_tokens`` (which
tokens it zeroes is not given) and the APC mode (2-D ``cache_indices``, ``block_idx_first/last_scheduled_token``,
``initial_state_idx``: its block bookkeeping is not described). ``max_query_len`` and ``block_size`` are sizing
hints of Ascend's kernel and do not change the result.
"""
from __future__ import annotations

import torch
from torch.library import custom_op

_OP = "npu_fused_causal_conv1d"


def _fail(msg):
    raise ValueError(f"{_OP}: {msg}")


def _check(x, weight, conv_states, query_start_loc, cache_indices):
    if x.dim() not in (2, 3):
        _fail(f"x must be (cu_seq_len, dim) or (batch, seq_len, dim), got {tuple(x.shape)}")
    dim = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != dim or weight.shape[0] < 1:
        _fail(f"weight must be (K, dim) with dim = {dim}, got {tuple(weight.shape)}")
    if conv_states.dim() < 2 or conv_states.shape[-1] != dim or conv_states.shape[-2] < weight.shape[0] - 1:
        _fail(f"conv_states must be (..., state_len, dim) with state_len >= K - 1 = {weight.shape[0] - 1}, got "
              f"{tuple(conv_states.shape)}")
    if x.dim() == 2 and query_start_loc is None:
        _fail("query_start_loc is required for a 2-D x")
    if cache_indices is not None and cache_indices.dim() != 1:
        _fail("a 2-D cache_indices (the APC mode) is not supported")


@custom_op("npu::_fused_causal_conv1d", mutates_args=("conv_states",), device_types="npu",
           schema="(Tensor x, Tensor weight, Tensor(a!) conv_states, Tensor? query_start_loc, Tensor? cache_indices, "
                  "int pad_slot_id, int residual_connection) -> Tensor")
def _fused_causal_conv1d(x, weight, conv_states, query_start_loc, cache_indices, pad_slot_id, residual_connection):
    _check(x, weight, conv_states, query_start_loc, cache_indices)
    k = weight.shape[0]
    states = conv_states.view(-1, *conv_states.shape[-2:])
    if x.dim() == 2:
        starts = [int(s) for s in query_start_loc.tolist()]
        seqs = [(starts[b], starts[b + 1]) for b in range(len(starts) - 1)]
        rows = x
    else:
        seqs = [(b * x.shape[1], (b + 1) * x.shape[1]) for b in range(x.shape[0])]
        rows = x.reshape(-1, x.shape[-1])
    slots = list(range(len(seqs))) if cache_indices is None else [int(c) for c in cache_indices.tolist()]
    if len(slots) < len(seqs):
        _fail(f"cache_indices must have one entry per sequence ({len(seqs)}), got {len(slots)}")
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    w = weight.to(acc)
    y = torch.zeros(rows.shape, dtype=acc, device=x.device)
    for (start, end), slot in zip(seqs, slots[:len(seqs)]):
        if slot == pad_slot_id:
            continue
        if not 0 <= slot < states.shape[0]:
            _fail(f"cache index {slot} is outside conv_states' {states.shape[0]} rows")
        seq = rows[start:end].to(acc)
        padded = torch.cat((states[slot, states.shape[1] - (k - 1):].to(acc), seq))
        n = end - start
        y[start:end] = sum(w[j] * padded[j:j + n] for j in range(k))
        if residual_connection:
            y[start:end] += seq
        history = torch.cat((states[slot].to(acc), seq))
        states[slot] = history[history.shape[0] - states.shape[1]:].to(states.dtype)
    return y.to(x.dtype).reshape(x.shape)


@_fused_causal_conv1d.register_fake
def _(x, weight, conv_states, query_start_loc, cache_indices, pad_slot_id, residual_connection):
    _check(x, weight, conv_states, query_start_loc, cache_indices)
    return torch.empty_like(x)


def npu_fused_causal_conv1d(x, weight, conv_states, *, query_start_loc=None, cache_indices=None,
                            initial_state_mode=None, bias=None, num_accepted_tokens=None, activation="None",
                            pad_slot_id=-1, run_mode=0, residual_connection=0, max_query_len=-1,
                            num_computed_tokens=None, block_idx_first_scheduled_token=None,
                            block_idx_last_scheduled_token=None, initial_state_idx=None, block_size=128,
                            conv_mode="default"):
    for name, value in (("bias", bias), ("initial_state_mode", initial_state_mode),
                        ("num_accepted_tokens", num_accepted_tokens), ("num_computed_tokens", num_computed_tokens),
                        ("block_idx_first_scheduled_token", block_idx_first_scheduled_token),
                        ("block_idx_last_scheduled_token", block_idx_last_scheduled_token),
                        ("initial_state_idx", initial_state_idx)):
        if value is not None:
            _fail(f"{name} is not supported (the page marks it unsupported or leaves its meaning undefined)")
    if activation not in (None, "None"):
        _fail(f"activation must be 'None' (the page marks 'silu' / 'swish' unsupported), got {activation!r}")
    if run_mode not in (None, 0):
        _fail(f"run_mode must be 0 (the page marks other values unsupported), got {run_mode}")
    if conv_mode not in (None, "default"):
        _fail(f"conv_mode must be 'default' ('pangu' zeroes tokens the page does not identify), got {conv_mode!r}")
    if residual_connection not in (None, 0, 1):
        _fail(f"residual_connection must be 0 or 1, got {residual_connection}")
    if cache_indices is not None and cache_indices.dim() == 2:
        _fail("cache_indices: the 2-D APC mode is not supported (its block bookkeeping is not described)")
    return torch.ops.npu._fused_causal_conv1d(x, weight, conv_states, query_start_loc, cache_indices,
                                              -1 if pad_slot_id is None else pad_slot_id, residual_connection or 0)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_fused_causal_conv1d(Tensor x, Tensor weight, Tensor(a!) conv_states, *, Tensor? query_start_loc=None, "
            "Tensor? cache_indices=None, Tensor? initial_state_mode=None, Tensor? bias=None, "
            "Tensor? num_accepted_tokens=None, str? activation=\"None\", int? pad_slot_id=-1, int? run_mode=0, "
            "int? residual_connection=0, int? max_query_len=-1, Tensor? num_computed_tokens=None, "
            "Tensor? block_idx_first_scheduled_token=None, Tensor? block_idx_last_scheduled_token=None, "
            "Tensor? initial_state_idx=None, int? block_size=128, str? conv_mode=\"default\") -> Tensor")
_lib.impl("npu_fused_causal_conv1d", npu_fused_causal_conv1d, "CompositeImplicitAutograd")
