"""Attention under tracing: npu ``scaled_dot_product_attention`` traces to the kernel CPU attention traces to.

Registered with the npu device (``npudist.register``), not with the Inductor backend: AOTAutograd traces a graph
before Inductor looks up its npu code generators, so a registration made then would miss the first compile of a
process. Imports nothing beyond torch itself; the kernel is consulted only while tracing.
"""
import functools

import torch
from torch.nn.attention import SDPBackend


def cpu_attention_choice(query, key, value, dropout_p, is_causal, scale) -> int:
    """The SDPA backend CPU picks for tensors shaped like these fake npu tensors (an ``SDPBackend`` value).

    The CPU chooser reads only metadata (shapes, strides, dtype, requires_grad), but it is reachable only
    through the dispatcher's CPU kernel, so it is asked with real, uninitialised CPU tensors of the same layout
    (allocated untouched, outside every tracing mode)."""
    from torch.utils._python_dispatch import _disable_current_modes

    if any(isinstance(d, torch.SymInt) for t in (query, key, value) for d in (*t.shape, *t.stride())):
        return int(SDPBackend.MATH)   # dynamic shapes: keep the decomposition
    with _disable_current_modes(), torch._C._DisableTorchDispatch():
        like = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).requires_grad_(t.requires_grad)
                for t in (query, key, value)]
        return int(torch._fused_sdp_choice(*like, None, dropout_p, is_causal, scale=scale))


def trace_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    """SDPA while tracing: npu queries that CPU would run with its flash kernel (no mask, no GQA) trace to that
    kernel; everything else, every other device included, to the C++ composite kernel unchanged."""
    from torch._C import DispatchKey

    if (query.device.type == "npu" and attn_mask is None and not enable_gqa
            and cpu_attention_choice(query, key, value, dropout_p, is_causal, scale) == int(SDPBackend.FLASH_ATTENTION)):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
            query, key, value, dropout_p, is_causal, scale=scale)[0]
    return torch.ops.aten.scaled_dot_product_attention.default._op_dk(
        DispatchKey.CompositeImplicitAutograd, query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
        enable_gqa=enable_gqa)


@functools.cache
def register() -> None:
    """Trace ``scaled_dot_product_attention`` on npu to the kernel CPU uses (the fused CPU flash kernel).

    Eager npu attention already runs CPU's choice (device_core's ``_fused_sdp_choice`` stub asks the CPU
    chooser on CPU aliases of the npu data). Under tracing the tensors are fake, there is no data to alias,
    and that stub answers the math decomposition; compiled CPU meanwhile gets the flash kernel (its chooser
    reads only metadata), so compiled npu attention ran a slower algorithm than compiled CPU. The composite
    SDPA kernel calls the chooser directly (a DispatchStub, not an operator), so no device registration can
    answer it; the hook Inductor itself uses for such cases is a Python ``CompositeImplicitAutograd`` kernel,
    which is consulted only while tracing (Python dispatcher). npu tensors reach ``trace_attention`` through
    ``npudist.device.attention``'s ``AutogradPrivateUse1`` kernel, which the Python dispatcher prefers to this
    one; this one serves tensors whose highest key is not npu's.
    """
    from torch._C import DispatchKey

    torch.ops.aten.scaled_dot_product_attention.default.py_impl(DispatchKey.CompositeImplicitAutograd)(
        trace_attention)
