"""``torch_npu.utils.FlopsCounter``: the FLOPs of the matmul-family, convolution and fused attention operators run
on npu tensors (docs/torch_npu.md).

As on Ascend the counter is one process-wide state shared by every ``FlopsCounter()`` (Ascend: a C++ singleton)
with two totals: ``traversedCount`` counts every counted operator while the counter is started (recomputation
included: hardware FLOPs utilisation), ``recordedCount`` only those run while it is not paused (model FLOPs
utilisation; MindSpeed pauses it around activation checkpointing's recomputation). ``get_flops()`` returns
``[recordedCount, traversedCount]``; ``stop()`` disables the counter, clears the pause flag and resets both to 0.

Where Ascend's kernels add their FLOPs in C++, here ``start()`` enters a ``TorchDispatchMode`` that looks every
operator up in torch's FLOP registry (``torch.utils.flop_counter``: mm, addmm, bmm, baddbmm, the convolutions
and their backward, torch's attention kernels) and counts those with an npu tensor among their arguments (the
operators Ascend's npu kernels count; cpu operators are not counted). npudist registers formulas there for
``npu_fusion_attention`` and its gradient (so ``FlopCounterMode`` counts them too): Ascend's, the dense
attention's matmuls ``2·B·N·Sq·Sk·(Dq + Dv)`` forward and ``2·B·N·Sq·Sk·2·(Dq + Dv)`` backward, summed per
sequence under TND, masks and sparse modes not discounted. Composite operators (``matmul``, ``linear``, the MC2
matmuls) are counted by the matmuls they run. ``aten::matmul_backward`` (npudist's npu kernel) counts its two
matmuls.

The mode lives on the dispatch-mode stack of the thread that called ``start()`` (the autograd engine carries it
to its threads for that thread's backward); operators launched from other Python threads are not counted.
"""
from __future__ import annotations

import threading
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack, _pop_mode, _push_mode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, register_flop_formula

__all__ = []


# ---------------------------------------------------------------------------------------------------------
# FLOP formulas for npudist's npu operators (registered in torch's registry)

def _layout_dims(shape, layout: str, heads: int | None, head_dim: int | None):
    """(B, N, S, D) of one of q/k/v in ``layout``; BSH/SBH need the heads (q) or the head dim (k/v)."""
    if layout == "BSND":
        b, s, n, d = shape
    elif layout == "BNSD":
        b, n, s, d = shape
    elif layout in ("BSH", "SBH"):
        b, s, h = shape if layout == "BSH" else (shape[1], shape[0], shape[2])
        if heads is not None:
            n, d = heads, h // heads
        else:
            n, d = h // head_dim, head_dim
    elif layout == "TND":
        t, n, d = shape
        b, s = 1, t
    else:
        raise ValueError(f"npu_fusion_attention flops: unknown input_layout {layout!r}")
    return b, n, s, d


def _attention_terms(query, key, value, head_num, input_layout, actual_seq_qlen, actual_seq_kvlen):
    """[(B·N·Sq·Sk, Dq, Dv)] per sequence (one entry unless TND with cumulative lengths)."""
    b, n, sq, dq = _layout_dims(query, input_layout, head_num, None)
    _, n_kv, sk, _ = _layout_dims(key, input_layout, None, dq)
    if input_layout in ("BSH", "SBH"):
        dv = value[-1] // n_kv          # value's hidden size over the kv heads
    else:
        dv = value[-1]
    if input_layout == "TND" and actual_seq_qlen and actual_seq_kvlen:
        q_ends, kv_ends = list(actual_seq_qlen), list(actual_seq_kvlen)
        q_lens = [e - s for s, e in zip([0] + q_ends[:-1], q_ends)]
        kv_lens = [e - s for s, e in zip([0] + kv_ends[:-1], kv_ends)]
        return [(n * lq * lk, dq, dv) for lq, lk in zip(q_lens, kv_lens)]
    return [(b * n * sq * sk, dq, dv)]


def _seq_lens(args, kwargs, first):
    """actual_seq_qlen / actual_seq_kvlen, positional from ``args[first]`` or keywords."""
    q = args[first] if len(args) > first else kwargs.get("actual_seq_qlen")
    kv = args[first + 1] if len(args) > first + 1 else kwargs.get("actual_seq_kvlen")
    return q, kv


def _fa_forward_flop(query, key, value, head_num, input_layout, *args, out_shape=None, **kwargs) -> int:
    # after input_layout: pse, padding_mask, atten_mask, scale, keep_prob, pre_tockens, next_tockens,
    # inner_precise, prefix, actual_seq_qlen (9), actual_seq_kvlen (10), ...
    qlen, kvlen = _seq_lens(args, kwargs, 9)
    terms = _attention_terms(query, key, value, head_num, input_layout, qlen, kvlen)
    return sum(2 * bnss * (dq + dv) for bnss, dq, dv in terms)


def _fa_backward_flop(query, key, value, dy, head_num, input_layout, *args, out_shape=None, **kwargs) -> int:
    # after input_layout: pse, padding_mask, atten_mask, softmax_max, softmax_sum, softmax_in, attention_in,
    # scale_value, keep_prob, pre_tockens, next_tockens, inner_precise, seed, offset, numels, prefix,
    # actual_seq_qlen (16), actual_seq_kvlen (17), ...
    qlen, kvlen = _seq_lens(args, kwargs, 16)
    terms = _attention_terms(query, key, value, head_num, input_layout, qlen, kvlen)
    return sum(4 * bnss * (dq + dv) for bnss, dq, dv in terms)


def _matmul_backward_flop(grad, self, other, mask, *, out_shape=None, **kwargs) -> int:
    """Two matmuls of torch.matmul's shapes: ``grad @ other^T`` and ``self^T @ grad`` (2·M·N·K each)."""
    s = (1,) + tuple(self) if len(self) == 1 else tuple(self)
    o = tuple(other) + (1,) if len(other) == 1 else tuple(other)
    batch = torch.broadcast_shapes(s[:-2], o[:-2])
    m, k, n = s[-2], s[-1], o[-1]
    count = 2 * m * n * k
    for d in batch:
        count *= d
    return 2 * count


def _register_formulas() -> None:
    ops = torch.ops.npu
    for name, formula in (("npu_fusion_attention", _fa_forward_flop),
                          ("npu_fusion_attention_grad", _fa_backward_flop)):
        packet = getattr(ops, name, None)
        if packet is not None and packet not in flop_registry:
            register_flop_formula(packet)(formula)
    if torch.ops.aten.matmul_backward not in flop_registry:
        register_flop_formula(torch.ops.aten.matmul_backward)(_matmul_backward_flop)


_register_formulas()


# ---------------------------------------------------------------------------------------------------------
# The process-wide counter

_SKIPPED = {torch.ops.aten.is_contiguous.default, torch.ops.aten.is_contiguous.memory_format,
            torch.ops.aten.is_strides_like_format.default, torch.ops.aten.is_non_overlapping_and_dense.default,
            torch.ops.aten.size.default, torch.ops.aten.sym_size.default, torch.ops.aten.stride.default,
            torch.ops.aten.sym_stride.default, torch.ops.aten.storage_offset.default,
            torch.ops.aten.sym_storage_offset.default, torch.ops.aten.numel.default,
            torch.ops.aten.sym_numel.default, torch.ops.aten.dim.default, torch.ops.prim.layout.default}


def _on_npu(args, kwargs) -> bool:
    leaves, _ = tree_flatten((args, kwargs))
    return any(isinstance(x, torch.Tensor) and x.device.type == "npu" for x in leaves)


class _FlopCountContext:
    """Ascend's FlopCountContext: the flags and the two totals (one instance per process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.enabled = False
        self.paused = False
        self.recorded = 0
        self.traversed = 0
        self.mode: _NpuFlopMode | None = None
        self.mode_thread: int | None = None

    def add(self, flops: int) -> None:
        with self.lock:
            if not self.enabled:
                return
            self.traversed += flops
            if not self.paused:
                self.recorded += flops

    def enable(self) -> None:
        with self.lock:
            self.enabled = True
            if self.mode is not None:
                return
            self.mode = _NpuFlopMode(self)
            self.mode_thread = threading.get_ident()
        self.mode.__enter__()

    def disable(self) -> None:
        with self.lock:
            self.enabled = False
            mode, thread = self.mode, self.mode_thread
            if mode is None or thread != threading.get_ident():
                return   # another thread's stack: the mode stays there, inert until that thread stops it
            self.mode = self.mode_thread = None
        stack = _get_current_dispatch_mode_stack()
        if mode not in stack:
            return
        above = []
        while _get_current_dispatch_mode_stack()[-1] is not mode:
            above.append(_pop_mode())
        mode.__exit__(None, None, None)
        for m in reversed(above):
            _push_mode(m)

    def reset(self) -> None:
        with self.lock:
            self.paused = False
            self.recorded = 0
            self.traversed = 0


class _NpuFlopMode(TorchDispatchMode):
    """Counts the FLOPs of the registry's operators run on npu tensors into the context."""

    def __init__(self, context: _FlopCountContext) -> None:
        super().__init__()
        self.context = context

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SKIPPED:
            return NotImplemented
        packet = func._overloadpacket
        if packet not in flop_registry and func is not torch.ops.prim.device.default:
            with self:
                out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
        out = func(*args, **kwargs)
        if self.context.enabled and packet in flop_registry and _on_npu(args, kwargs):
            self.context.add(int(flop_registry[packet](*args, **kwargs, out_val=out)))
        return out


_CONTEXT = _FlopCountContext()


class _FlopsCounter:
    """``torch_npu.utils.FlopsCounter()``: a handle on the process-wide FLOP counter (every instance is the same
    counter). ``start()`` counts, ``pause()``/``resume()`` exclude a region from ``recordedCount`` only,
    ``get_flops()`` -> ``[recordedCount, traversedCount]``, ``stop()`` stops and resets both to 0."""

    def __init__(self):
        self.flop_count_instance = _CONTEXT

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        # Ascend's __enter__/__exit__ call methods it does not define; here the block counts and the totals stay
        # readable after it (stop() resets them)
        _CONTEXT.disable()
        return False

    def start(self):
        _CONTEXT.enable()

    def stop(self):
        _CONTEXT.disable()
        _CONTEXT.reset()

    def pause(self):
        _CONTEXT.paused = True

    def resume(self):
        _CONTEXT.paused = False

    def get_flops(self):
        with _CONTEXT.lock:
            return [_CONTEXT.recorded, _CONTEXT.traversed]


class FlopsCounter(_FlopsCounter):
    """The deprecated spelling ``torch_npu.utils.flops_count.FlopsCounter`` (warns; use torch_npu.utils's)."""

    def __init__(self):
        super().__init__()
        warnings.warn("torch_npu.utils.flops_count.FlopsCounter() will be deprecated. "
                      "If necessary, please use torch_npu.utils.FlopsCounter().", FutureWarning, stacklevel=2)
