"""Ascend storage formats on the emulated npu: ``npu_format_cast``, ``npu_format_cast_``, ``empty_with_format`` and
``get_npu_format``.

On Ascend a format (ND, NCHW, FRACTAL_NZ, ...) is how a tensor's storage is laid out for the AI Core; the
tensor's values and its PyTorch shape and strides are unchanged by a cast. The emulated device keeps every tensor
in PyTorch's own layout, so here a format is a tag: ``npu_format_cast`` returns a copy tagged with the format,
``npu_format_cast_`` tags the tensor itself, ``empty_with_format`` allocates a tagged tensor, and
``get_npu_format`` reports the tag as a ``Format`` (``torch.ops.npu.get_npu_format``: as an int) — of the tensor,
else of the tensor it is a view of — or the format Ascend gives a fresh tensor: NCHW for 4-D, NCDHW for 5-D,
ND otherwise. Every operator computes on the values alone, so math is the same whatever the tags say.

The tags live in a weak dictionary keyed by tensor: a cast traced by ``torch.compile`` computes the same values,
but the tensors the compiled graph returns carry no tag (they report their fresh-tensor format).
"""
from __future__ import annotations

from enum import IntEnum

import torch
from torch.utils.weak import WeakTensorKeyDictionary


class Format(IntEnum):
    """Ascend's storage formats (aclFormat values)."""
    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4
    NC1HWC0_C04 = 12
    HWCN = 16
    NDHWC = 27
    FRACTAL_NZ = 29
    NCDHW = 30
    NDC1HWC0 = 32
    FRACTAL_Z_3D = 33
    NC = 35
    NCL = 47
    FRACTAL_NZ_C0_16 = 50
    FRACTAL_NZ_C0_32 = 51
    FRACTAL_NZ_C0_2 = 52
    FRACTAL_NZ_C0_4 = 53
    FRACTAL_NZ_C0_8 = 54

    def __str__(self):
        return self.name


# the number of dims a format describes (None: any); FRACTAL_NZ tiles the last two dims
_RANK = {Format.NCHW: 4, Format.NHWC: 4, Format.NC1HWC0: 4, Format.FRACTAL_Z: 4, Format.NC1HWC0_C04: 4,
         Format.HWCN: 4, Format.NDHWC: 5, Format.NCDHW: 5, Format.NDC1HWC0: 5, Format.FRACTAL_Z_3D: 5}
_NZ = {Format.FRACTAL_NZ, Format.FRACTAL_NZ_C0_16, Format.FRACTAL_NZ_C0_32, Format.FRACTAL_NZ_C0_2,
       Format.FRACTAL_NZ_C0_4, Format.FRACTAL_NZ_C0_8}

_tags: WeakTensorKeyDictionary = WeakTensorKeyDictionary()


def _format(op: str, acl_format, dim: int) -> Format:
    try:
        fmt = Format(int(acl_format))
    except ValueError:
        raise ValueError(f"{op}: acl_format {acl_format} is not an Ascend format; known: "
                         f"{', '.join(f'{f.value} ({f.name})' for f in Format)}") from None
    want = _RANK.get(fmt)
    if want is not None and dim != want:
        raise ValueError(f"{op}: format {fmt.name} describes {want}-D tensors, got a {dim}-D tensor")
    if fmt in _NZ and dim < 2:
        raise ValueError(f"{op}: format {fmt.name} tiles the last two dims; the tensor is {dim}-D")
    return fmt


def _fresh_format(t: torch.Tensor) -> Format:
    return {4: Format.NCHW, 5: Format.NCDHW}.get(t.dim(), Format.ND)


def get_npu_format(tensor) -> Format:
    """The format of an npu tensor (see the module docstring)."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "npu":
        raise ValueError(f"get_npu_format: expects an npu tensor, got "
                         f"{tensor.device if isinstance(tensor, torch.Tensor) else type(tensor).__name__}")
    for t in (tensor, tensor._base):
        if t is not None and t in _tags:
            return _tags[t]
    return _fresh_format(tensor)


def _format_code(self):
    return int(get_npu_format(self))


def _check_dtypes(op, customize_dtype, input_dtype):
    # both choose how Ascend packs the storage (C0 size, sub-byte dtypes): a layout concern, so no effect here
    for name, v in (("customize_dtype", customize_dtype), ("input_dtype", input_dtype)):
        if v is not None and not isinstance(v, int):
            raise ValueError(f"{op}: {name} must be an int dtype code or None, got {v!r}")


def _cast(self, acl_format, *, customize_dtype=None, input_dtype=None):
    _check_dtypes("npu_format_cast", customize_dtype, input_dtype)
    out = self.clone(memory_format=torch.contiguous_format)
    _tags[out] = _format("npu_format_cast", acl_format, self.dim())
    return out


def _cast_like(self, dst, *, customize_dtype=None, input_dtype=None):
    return _cast(self, get_npu_format(dst), customize_dtype=customize_dtype, input_dtype=input_dtype)


def _cast_(self, acl_format, *, customize_dtype=None, input_dtype=None):
    _check_dtypes("npu_format_cast_", customize_dtype, input_dtype)
    _tags[self] = _format("npu_format_cast_", acl_format, self.dim())
    return self


def _cast_like_(self, src, *, customize_dtype=None, input_dtype=None):
    return _cast_(self, get_npu_format(src), customize_dtype=customize_dtype, input_dtype=input_dtype)


def _empty_with_format(size, *, dtype=None, layout=None, device=None, pin_memory=None, acl_format=2,
                       base_addr_aligned_kb=None):
    op = "empty_with_format"
    if layout not in (None, torch.strided):
        raise ValueError(f"{op}: only the strided layout is supported, got {layout}")
    if base_addr_aligned_kb is not None and base_addr_aligned_kb < 0:
        raise ValueError(f"{op}: base_addr_aligned_kb must be >= 0, got {base_addr_aligned_kb}")
    fmt = _format(op, acl_format, len(size))
    device = torch.device("npu", torch.npu.current_device()) if device is None else torch.device(device)
    if device.type != "npu":
        raise ValueError(f"{op}: formats describe npu tensors; device must be npu, got {device}")
    # the caching allocator already aligns every block beyond base_addr_aligned_kb's granularity
    out = torch.empty(size, dtype=dtype, device=device)
    _tags[out] = fmt
    return out


_lib = torch.library.Library("npu", "FRAGMENT")
for _schema, _fn in (
        ("npu_format_cast(Tensor self, int acl_format, *, int? customize_dtype=None, int? input_dtype=None) -> Tensor",
         _cast),
        ("npu_format_cast.Tensor(Tensor self, Tensor dst, *, int? customize_dtype=None, int? input_dtype=None) "
         "-> Tensor", _cast_like),
        ("npu_format_cast_(Tensor(a!) self, Tensor src, *, int? customize_dtype=None, int? input_dtype=None) "
         "-> Tensor(a!)", _cast_like_),
        ("npu_format_cast_.acl_format(Tensor(a!) self, int acl_format, *, int? customize_dtype=None, "
         "int? input_dtype=None) -> Tensor(a!)", _cast_),
        ("get_npu_format(Tensor self) -> int", _format_code),
        ("empty_with_format(int[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
         "bool? pin_memory=None, int acl_format=2, int? base_addr_aligned_kb=None) -> Tensor", _empty_with_format)):
    _lib.define(_schema)
    # Composite: the values are aten's (clone / empty); the format is a tag recorded beside them
    _lib.impl(_schema.split("(", 1)[0], _fn, "CompositeImplicitAutograd")
