"""The ways an OpInfo op is called, each building fresh arguments for every call.

``function`` (``op.op``), ``method`` (``op.method_variant``), ``inplace`` (``op.inplace_variant`` on a copy
of the input; the result and the written input are compared, and whether the result is the input), ``out``
(``op.op(..., out=...)`` where ``op.supports_out``, modelled on PyTorch's test_ops.py ``test_out``:
pre-allocated outputs of the reference result's shape and dtype on the call's device; the result, the out
tensors and whether the result is the out tensor are compared) and ``out_resize`` (the same on the first
sample with a wrongly-shaped non-empty out, which PyTorch resizes with a warning, and a zero-element out,
resized silently). Those are compared with the same call on cpu.

``inference`` (the function form inside ``torch.inference_mode()``, on arguments made inside it, so they are
inference tensors) and ``autocast`` (the function form under ``torch.autocast("npu")``) run on npu only: their
reference is the same npu call made synchronously (``sync_reference``), as "equals blocking launch" asks, not cpu,
whose autocast casts to another dtype (bfloat16) than npu's (float16).
"""
import torch

from .names import SYNC_FORMS
from .samples import copy_to

RESIZE_CASES = ("wrong shape", "empty")


def forms_of(op, grad: bool) -> list:
    """The forms ``op`` defines (``backward``: of the function form, where the dtype is differentiable)."""
    forms = ["function"]
    if op.method_variant is not None:
        forms.append("method")
    if op.inplace_variant is not None:
        forms.append("inplace")
    if op.supports_out:
        forms += ["out", "out_resize"]
    if grad:
        forms.append("backward")
    return forms + list(SYNC_FORMS)


def args_of(sample):
    return sample.input, sample.args, sample.kwargs


def method_call(op, pristine, device):
    """A call of the Tensor-method form on fresh copies of the sample's arguments."""
    inp, args, kwargs = copy_to(pristine, device, grad=False)
    return lambda: op.method_variant(inp, *args, **kwargs)


def inplace_call(op, pristine, device):
    inp, args, kwargs = copy_to(pristine, device, grad=False)

    def call():
        res = op.inplace_variant(inp, *args, **kwargs)
        return res, inp, _is_same(res, inp)
    return call


def inference_call(op, pristine, device):
    """The function form inside ``torch.inference_mode()``, on inference tensors made for this call."""
    with torch.inference_mode():
        inp, args, kwargs = copy_to(pristine, device, grad=False)

    def call():
        with torch.inference_mode():
            return op.op(inp, *args, **kwargs)
    return call


def autocast_call(op, pristine, device):
    """The function form under ``torch.autocast(device)`` (its default dtype: float16 on npu)."""
    inp, args, kwargs = copy_to(pristine, device, grad=False)

    def call():
        with torch.autocast(device):
            return op.op(inp, *args, **kwargs)
    return call


SYNC_CALLS = {"inference": inference_call, "autocast": autocast_call}  # form -> its call builder


def out_call(op, pristine, device, reference, case):
    """A call of the out= form; None when the reference result is not a tensor or a sequence of tensors."""
    out = _make_out(reference, device, case)
    if out is None:
        return None
    inp, args, kwargs = copy_to(pristine, device, grad=False)

    def call():
        res = op.op(inp, *args, out=out, **kwargs)
        return res, out, _is_same(res, out)
    return call


def _make_out(ref, device, case):
    if isinstance(ref, torch.Tensor):
        if ref.layout != torch.strided or ref.is_quantized:
            return None
        return _out_tensor(ref, device, case)
    if isinstance(ref, (tuple, list)) and ref and all(isinstance(t, torch.Tensor) for t in ref):
        outs = [_make_out(t, device, case) for t in ref]
        return None if any(o is None for o in outs) else tuple(outs)
    return None


def _out_tensor(ref: torch.Tensor, device: str, case: str) -> torch.Tensor:
    if case == "empty":
        shape = (0,)
    elif case == "wrong shape":
        shape = tuple(ref.shape[:-1]) + (ref.shape[-1] + 1,) if ref.dim() else (2,)
    else:
        shape = tuple(ref.shape)
    t = torch.empty(shape, dtype=ref.dtype, device=device)
    if t.numel():  # a set value, so an element the op fails to write differs from cpu's deterministically
        t.fill_(1)
    return t


def _is_same(res, target) -> bool:
    """Whether the returned tensor(s) are the given ones (same data pointer, as test_out checks)."""
    if isinstance(res, torch.Tensor) and isinstance(target, torch.Tensor):
        return res.data_ptr() == target.data_ptr()
    if isinstance(res, (tuple, list)) and isinstance(target, (tuple, list)) and len(res) == len(target):
        return all(_is_same(r, t) for r, t in zip(res, target))
    return False
