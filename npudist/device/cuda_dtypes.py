"""npu kernels for the dtypes that CUDA (and Ascend) accept but PyTorch's CPU kernels refuse.

The npu device runs CPU kernels, so it inherits their dtype gaps: ``torch.histc`` on an int64 npu tensor
raised ``"histogram_cpu" not implemented for 'Long'`` although CUDA computes it (torchtitan's MoE router calls
it on expert indices). ``scripts/cuda_dtype_gaps.py`` finds the whole class from OpInfo (CUDA's dtype lists
against CPU's, each pair run on the cpu) and records it in tests/data/cuda_dtype_gaps.json; the pairs closed
here are computed exactly, with CUDA's semantics, through dtypes the CPU kernels accept:

* ``histc`` on integer tensors: CUDA's integer binning (bounds converted to int64; ``bin = (v - min) * bins //
  (max - min)``, ``v == max`` in the last bin, values outside ``[min, max]`` ignored; ``min == max`` takes the
  data's range, widened by 1 on each side if still empty), counts in the input dtype.
* ``trace`` on bool tensors: the diagonal's sum as int64 (what CUDA's sum gives).
* ``nansum`` (and so ``nanmean``, except on complex32) on complex tensors: an element counts as zero when its real or imaginary
  part is NaN (CUDA's ``_isnan`` on complex).

An aten operator gets one npu kernel for all dtypes, so the dtypes the CPU kernel does accept run the CPU
kernel on a host copy of the arguments (bitwise the CPU's result; it costs a device-to-host and a host-to-device
copy, a synchronization). The pairs not closed here are the hot elementwise and reduction ops on complex32 and
bool (``sin``, ``sum``, ``abs`` ...) and a few pooling/loss/fft kernels on float16/bfloat16: overriding those
kernels for every dtype would cost every call that copy; they need a per-dtype cast in the C++ fallback
(docs/torch_npu.md, "dtypes").
"""
from __future__ import annotations

import torch

__all__ = ["register", "COMPUTED"]

_lib: torch.library.Library | None = None
_INTEGER = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_COMPLEX = (torch.complex32, torch.complex64, torch.complex128)

# OpInfo name -> the dtypes CUDA accepts, the CPU kernel refuses and the npu computes here.
# (nanmean on complex32 divides in complex32, whose CPU division kernel is another gap.)
COMPUTED = {"histc": _INTEGER, "trace": (torch.bool,), "nansum": _COMPLEX,
            "nanmean": (torch.complex64, torch.complex128)}


def _on_cpu(op, args: tuple, kwargs: dict, device: torch.device):
    """``op`` by its CPU kernel on host copies of the tensor arguments; tensor results copied back to ``device``."""
    cpu_args = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    out = op(*cpu_args, **kwargs)
    if isinstance(out, torch.Tensor):
        return out.to(device)
    return type(out)(o.to(device) if isinstance(o, torch.Tensor) else o for o in out)


def _histc(self: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:  # noqa: A002
    if self.dtype not in _INTEGER:
        return _on_cpu(torch.ops.aten.histc.default, (self, bins, min, max), {}, self.device)
    if bins <= 0:
        raise RuntimeError(f"torch.histc(): bins must be > 0, but got {bins} for dimension 0")
    lo, hi = int(min), int(max)         # CUDA converts the bounds to the integer accumulate type (int64)
    if lo > hi:
        raise RuntimeError(f"torch.histc(): max must be larger than min, got min={min}, max={max}")
    values = self.reshape(-1).to(torch.int64)
    if lo == hi and values.numel() > 0:
        lo, hi = int(values.min()), int(values.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    inside = values[(values >= lo) & (values <= hi)]
    index = torch.div((inside - lo) * bins, hi - lo, rounding_mode="floor").clamp_(max=bins - 1)
    return torch.bincount(index, minlength=bins).to(self.dtype)


def _trace(self: torch.Tensor) -> torch.Tensor:
    if self.dtype != torch.bool:
        return _on_cpu(torch.ops.aten.trace.default, (self,), {}, self.device)
    if self.dim() != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {self.dim()}")
    return self.diagonal().to(torch.int64).sum()


def _nansum(self: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    if not self.is_complex():
        return _on_cpu(torch.ops.aten.nansum.default, (self, dim, keepdim), {"dtype": dtype}, self.device)
    compute = torch.complex64 if self.dtype == torch.complex32 else self.dtype
    x = self.to(compute)
    zeroed = torch.where(torch.isnan(x), torch.zeros((), dtype=compute, device=x.device), x)
    out = zeroed.sum(dim=dim if dim not in (None, []) else None, keepdim=keepdim)
    return out.to(dtype if dtype is not None else self.dtype)


def _into(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """The out= form: ``out`` resized as ATen's resize_output does, then filled with ``result``."""
    if out.dtype != result.dtype:
        raise RuntimeError(f"Expected out tensor to have dtype {result.dtype}, but got {out.dtype} instead")
    if out.shape != result.shape:
        if out.numel():
            # ATen's deprecation warning for resizing a non-empty out, word for word: a CPU out= op of the
            # same shapes emits it (small bool tensors, no data of the caller's).
            torch.logical_not(torch.zeros(result.shape, dtype=torch.bool), out=torch.zeros(out.shape, dtype=torch.bool))
        out.resize_(result.shape)
    return out.copy_(result)


def _histc_out(self, bins=100, min=0, max=0, *, out):  # noqa: A002
    return _into(out, _histc(self, bins, min, max))


def _nansum_out(self, dim=None, keepdim=False, *, dtype=None, out):
    return _into(out, _nansum(self, dim, keepdim, dtype=dtype))


def register() -> None:
    """Register the npu kernels (once)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("histc", _histc, "PrivateUse1")
    _lib.impl("trace", _trace, "PrivateUse1")
    _lib.impl("nansum", _nansum, "PrivateUse1")
    _lib.impl("histc.out", _histc_out, "PrivateUse1")
    _lib.impl("nansum.out", _nansum_out, "PrivateUse1")
