"""Attention on npu DTensors: SDPA runs PyTorch's flash-attention operator, which DTensor and context parallelism know.

On CUDA, ``scaled_dot_product_attention`` is a composite kernel that asks a backend chooser and calls
``aten::_scaled_dot_product_flash_attention`` (or the memory-efficient / cuDNN operator). Those operators carry
DTensor sharding strategies (heads, batch, and under ``context_parallel()`` the sequence) and are what
``torch.distributed.tensor.experimental.context_parallel`` turns into ring attention. On npu the chooser is
device_core's ``_fused_sdp_choice`` stub, which asks CPU's chooser and so runs CPU's
``_scaled_dot_product_flash_attention_for_cpu``: an operator without a DTensor strategy. For tensor subclasses it
answers the math decomposition (it cannot alias their data), and that decomposition builds plain-tensor masks
next to DTensor scores (``aten.add.Tensor got mixed torch.Tensor and DTensor``).

This module gives npu what CUDA has, without changing either C++ kernel:

* ``aten::_scaled_dot_product_flash_attention`` and its backward get npu kernels. They compute with CPU's fused
  flash kernels on the npu data (the ones plain npu attention already runs), so a result is bitwise CPU's.
  The returned log-sum-exp has the layout CUDA's has ([batch, heads, seq], float32), which ring attention
  merges blocks with.
* ``aten::scaled_dot_product_attention`` gets an ``AutogradPrivateUse1`` kernel (it runs before the composite
  kernel for npu tensors, plain or DTensor). For an npu DTensor that CPU's chooser would run with the flash
  kernel (no mask, no grouped-query attention, no dropout) it calls the flash operator above, through the
  dispatcher, so DTensor propagates its sharding and autograd records the operator's own derivative. Everything
  else keeps its previous path unchanged: plain npu tensors run the C++ composite kernel, and under tracing
  the kernel ``npudist.compile.attention`` traces to.

Registered through ``torch.library`` (public API); the ``AutogradPrivateUse1`` registration is the one place
where npu overrides an ATen composite: the composite kernel reads the chooser directly (a DispatchStub, not
an operator), so no other registration point sees a DTensor before the chooser has answered "math".
"""
from __future__ import annotations

import functools

import torch
from torch._C import DispatchKey

_LIB: torch.library.Library | None = None


def _is_dtensor(t) -> bool:
    if type(t) is torch.Tensor:   # the common case, decided without importing torch.distributed
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """``aten::_scaled_dot_product_flash_attention`` on npu: CPU's flash kernel, CUDA's return signature."""
    if dropout_p != 0.0:
        raise NotImplementedError(
            "aten::_scaled_dot_product_flash_attention on npu: dropout_p > 0 is not supported (the npu flash kernel "
            f"is CPU's, which has no dropout; got dropout_p={dropout_p}). Use dropout_p=0.0, or plain npu tensors "
            "(scaled_dot_product_attention then runs the math backend for dropout)")
    if return_debug_mask:
        raise NotImplementedError("aten::_scaled_dot_product_flash_attention on npu: return_debug_mask=True is not "
                                  "supported (the debug mask exists only for dropout, which npu flash lacks)")
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        query, key, value, 0.0, is_causal, scale=scale)
    # No dropout: the random-number state is empty, shaped as CUDA's meta kernel shapes it.
    rng_state = torch.zeros(2, dtype=torch.uint64, device=query.device)
    unused = torch.zeros((), dtype=torch.uint64, device=query.device)
    debug = torch.empty(0, dtype=query.dtype, device=query.device)
    return out, lse, None, None, query.size(2), key.size(2), rng_state, unused, debug


def _flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                    is_causal, philox_seed, philox_offset, *, scale=None):
    """``aten::_scaled_dot_product_flash_attention_backward`` on npu: CPU's flash backward kernel."""
    if dropout_p != 0.0:
        raise NotImplementedError("aten::_scaled_dot_product_flash_attention_backward on npu: dropout_p > 0 is not "
                                  f"supported (got {dropout_p})")
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        grad_out, query, key, value, out, logsumexp, 0.0, is_causal, scale=scale)


def _wants_flash(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> bool:
    """True when DTensor attention should run the flash operator: CPU's chooser (metadata only, the global
    shapes) picks its flash kernel, and nothing the flash operator lacks (mask, GQA, dropout) is asked for."""
    from npudist.compile.attention import cpu_attention_choice
    from torch.nn.attention import SDPBackend

    if attn_mask is not None or enable_gqa or dropout_p != 0.0:
        return False
    return cpu_attention_choice(query, key, value, dropout_p, is_causal, scale) == int(SDPBackend.FLASH_ATTENTION)


def _npu_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """``scaled_dot_product_attention`` for npu (``AutogradPrivateUse1``): DTensors to the flash operator."""
    if (any(_is_dtensor(t) for t in (query, key, value))
            and _wants_flash(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)):
        return torch.ops.aten._scaled_dot_product_flash_attention.default(
            query, key, value, 0.0, is_causal, scale=scale)[0]
    if torch._C._dispatch_tls_is_dispatch_key_included(_PYTHON_DISPATCHER):
        from npudist.compile.attention import trace_attention   # tracing: what the py_impl there answers

        return trace_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                               enable_gqa=enable_gqa)
    return _SDPA._op_dk(_COMPOSITE, query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                        enable_gqa=enable_gqa)


_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_COMPOSITE = DispatchKey.CompositeImplicitAutograd
_PYTHON_DISPATCHER = DispatchKey.PythonDispatcher


@functools.cache
def register() -> None:
    global _LIB
    _LIB = torch.library.Library("aten", "IMPL")
    _LIB.impl("_scaled_dot_product_flash_attention", _flash_forward, "PrivateUse1")
    _LIB.impl("_scaled_dot_product_flash_attention_backward", _flash_backward, "PrivateUse1")
    _LIB.impl("scaled_dot_product_attention", _npu_sdpa, "AutogradPrivateUse1")
