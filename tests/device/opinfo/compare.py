"""Compare an npu result with the CPU result of the same call.

Integer and bool tensors must be equal; floating and complex tensors must pass
``torch.testing.assert_close`` and are additionally classified as bitwise equal or not (NaNs in the
same places count as equal). npu results must live on npu wherever CPU results live on cpu. With
``values=False`` (a call that drew random numbers) only the structure, shapes, dtypes, layouts and devices
are compared.
"""
import math

import torch

# Failure kinds of a call, from least to most severe; a form's status is its worst. ``warning``: npu warned
# differently; ``mismatch``: a result's structure, metadata or values differ; ``error``: an exception differs
# or a result is on the wrong device.
AGREE, WARNING, MISMATCH, ERROR = "agree", "warning", "mismatch", "error"


class Mismatch(Exception):
    """The npu result differs from the CPU result; ``kind`` is 'device' or 'value'."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    same = a == b
    if a.is_floating_point() or a.is_complex():
        same = same | (a.isnan() & b.isnan())
    return bool(same.all())


def _to_comparable(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    return t.cpu().resolve_conj().resolve_neg()


def compare_tensors(cpu: torch.Tensor, npu: torch.Tensor, where: str, values: bool = True) -> bool:
    """Raise Mismatch if ``npu`` does not match ``cpu``; return whether they are bitwise equal."""
    if cpu.device.type == "cpu" and npu.device.type != "npu":
        raise Mismatch("device", f"{where}: CPU result is on cpu but npu result is on {npu.device}")
    if cpu.device.type == "npu" and npu.device != cpu.device:  # a synchronous npu run as the reference
        raise Mismatch("device", f"{where}: the reference result is on {cpu.device} but this one is on {npu.device}")
    if cpu.dtype != npu.dtype or cpu.shape != npu.shape or cpu.layout != npu.layout:
        raise Mismatch("value", f"{where}: cpu {cpu.dtype}{tuple(cpu.shape)} {cpu.layout} vs "
                                f"npu {npu.dtype}{tuple(npu.shape)} {npu.layout}")
    if cpu.is_quantized or not values:
        return True  # values are not comparable elementwise; dtype/shape matched
    c, n = _to_comparable(cpu), _to_comparable(npu)
    if not (c.is_floating_point() or c.is_complex()):
        if not torch.equal(c, n):
            raise Mismatch("value", f"{where}: {c.dtype} values differ at {int((c != n).sum())} of "
                                    f"{c.numel()} elements")
        return True
    if _bitwise_equal(c, n):
        return True
    try:
        torch.testing.assert_close(n, c, equal_nan=True, check_device=False)
    except AssertionError as e:
        raise Mismatch("value", f"{where}: " + " ".join(str(e).split("\n")[:4])) from None
    return False


def compare_results(cpu, npu, where: str = "output", values: bool = True) -> bool:
    """Compare two (nested) op results; raise Mismatch on a difference, return bitwise equality."""
    if isinstance(cpu, torch.Tensor):
        if not isinstance(npu, torch.Tensor):
            raise Mismatch("value", f"{where}: CPU gave a tensor, npu gave {type(npu).__name__}")
        return compare_tensors(cpu, npu, where, values)
    if isinstance(cpu, (list, tuple)):
        if not isinstance(npu, (list, tuple)) or len(cpu) != len(npu):
            raise Mismatch("value", f"{where}: CPU gave {type(cpu).__name__} of {len(cpu)}, npu gave "
                                    f"{type(npu).__name__} {getattr(npu, '__len__', lambda: '')()}")
        bitwise = True
        for i, (c, n) in enumerate(zip(cpu, npu)):
            bitwise &= compare_results(c, n, f"{where}[{i}]", values)
        return bitwise
    if isinstance(cpu, dict):
        if not isinstance(npu, dict) or cpu.keys() != npu.keys():
            raise Mismatch("value", f"{where}: dict keys differ")
        bitwise = True
        for k in cpu:
            bitwise &= compare_results(cpu[k], npu[k], f"{where}[{k!r}]", values)
        return bitwise
    if isinstance(cpu, float) and isinstance(npu, float) and math.isnan(cpu) and math.isnan(npu):
        return True
    if isinstance(cpu, torch.device):
        return True  # a device-valued result differs by design
    if isinstance(cpu, (bool, int, float, complex, str, torch.dtype, torch.Size, type(None))):
        drawn_number = not values and isinstance(cpu, (int, float, complex)) and not isinstance(cpu, bool)
        if type(cpu) is not type(npu) or (cpu != npu and not drawn_number):
            raise Mismatch("value", f"{where}: CPU gave {cpu!r}, npu gave {npu!r}")
        return True
    if type(cpu) is not type(npu):
        raise Mismatch("value", f"{where}: CPU gave {type(cpu).__name__}, npu gave {type(npu).__name__}")
    return True
