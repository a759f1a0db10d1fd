"""``torch_npu.HiFloat8Tensor``: a tensor that stores HiFloat8 codes and presents a higher-precision dtype.

The API is torch_npu 2.14.0's ``torch_npu.utils.hif8_tensor._HiFloat8Tensor``: ``HiFloat8Tensor(data=uint8
codes, dtype=nominal dtype)``, ``HiFloat8Tensor.to_hifloat8(tensor)``, ``t.from_hifloat8(dtype=None)``,
``float`` / ``bfloat16`` / ``half`` / ``cpu`` (decoded), ``clone`` / ``view`` / ``reshape`` / ``contiguous`` /
``transpose`` / ``to_dtype`` (HiFloat8 again), and pickling by (codes, dtype). As upstream, the codes live on
the npu (a cpu buffer or input is moved there), the casts are straight-through for autograd (the gradient of
to_hifloat8 and from_hifloat8 is the incoming gradient, unquantised), and any other operator runs on the
decoded values in the nominal dtype; an in-place operator, or a copy into a HiFloat8Tensor, encodes the result
back into the codes. The bit conversion is npudist.formats.hifloat8 (tensor ops, round half away from zero).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils._pytree import tree_map

from npudist.formats import hifloat8 as _hif8

aten = torch.ops.aten


def _check_nominal(dtype: torch.dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.is_complex:
        raise ValueError(f"HiFloat8Tensor's nominal dtype must be a floating dtype (float32, bfloat16, float16), "
                         f"got {dtype}")


class _FromHiFloat8Func(torch.autograd.Function):
    """Decode to ``dtype``; the gradient passes through unchanged (it is wanted in full precision)."""

    @staticmethod
    def forward(ctx, tensor: HiFloat8Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        dtype = tensor.dtype if dtype is None else dtype
        _check_nominal(dtype)
        return _hif8.from_hifloat8(tensor._data.detach(), dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _ToHiFloat8Func(torch.autograd.Function):
    """Encode to a HiFloat8Tensor on the npu; the gradient passes through to the input's device unchanged."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> HiFloat8Tensor:
        ctx.input_device = tensor.device
        tensor = tensor.detach()
        if tensor.device.type != "npu":
            tensor = tensor.npu()
        if tensor.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            tensor = tensor.float()  # the nominal dtype of anything else is float32, as upstream
        return HiFloat8Tensor(data=_hif8.to_hifloat8(tensor), dtype=tensor.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # A cpu input's gradient must be on the cpu (autograd checks the device).
        return grad.to(ctx.input_device)


class _IdentityFunc(torch.autograd.Function):
    """Return the tensor, or a new HiFloat8Tensor built from its attributes and ``init_kwargs``."""

    @staticmethod
    def forward(ctx, tensor: HiFloat8Tensor, init_kwargs: Optional[dict[str, Any]] = None):
        ctx.input_dtype = tensor.dtype
        if init_kwargs is None:
            return tensor
        kwargs = {"data": tensor._data, "dtype": tensor.dtype, **init_kwargs}
        return HiFloat8Tensor(**kwargs)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.input_dtype), None


class _ReshapeFunc(torch.autograd.Function):
    """``view`` (``method="view"``) or ``reshape`` of the codes; the gradient goes back to the input's shape."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, shape: tuple, method: str):
        ctx.shape, ctx.method = tensor.shape, method
        if not shape:
            return tensor
        if isinstance(tensor, HiFloat8Tensor):
            return HiFloat8Tensor.make_like(tensor, data=getattr(tensor._data, method)(*shape))
        return getattr(tensor, method)(*shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if isinstance(grad, HiFloat8Tensor):
            return HiFloat8Tensor.make_like(grad, data=getattr(grad._data, ctx.method)(ctx.shape)), None, None
        return getattr(grad, ctx.method)(ctx.shape), None, None


class _TransposeFunc(torch.autograd.Function):
    """Transpose of the codes; the gradient is transposed back."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, dim0: int, dim1: int):
        ctx.dims = (dim0, dim1)
        if isinstance(tensor, HiFloat8Tensor):
            return HiFloat8Tensor.make_like(tensor, data=tensor._data.transpose(dim0, dim1))
        return tensor.transpose(dim0, dim1)

    @staticmethod
    def backward(ctx, grad):
        if isinstance(grad, HiFloat8Tensor):
            return HiFloat8Tensor.make_like(grad, data=grad._data.transpose(*ctx.dims)), None, None
        return grad.transpose(*ctx.dims), None, None


class HiFloat8Tensor(torch.Tensor):
    """A tensor whose data are HiFloat8 codes (uint8) and whose dtype is the nominal, higher-precision dtype.

    Parameters: ``data`` — the HiFloat8 codes, an 8-bit tensor that does not require grad (moved to the npu);
    ``dtype`` — the nominal dtype (default float32) that operators compute in.
    """

    _data: torch.Tensor

    def __new__(cls, *, data: torch.Tensor, dtype: torch.dtype = torch.float32):
        if not isinstance(data, torch.Tensor) or data.element_size() != 1 or data.is_floating_point():
            raise ValueError(f"HiFloat8Tensor's data must be an 8-bit integer tensor of HiFloat8 codes (got "
                             f"{getattr(data, 'dtype', type(data).__name__)}); encode floats with "
                             f"HiFloat8Tensor.to_hifloat8(tensor)")
        if data.requires_grad:
            raise ValueError("HiFloat8Tensor's data must not require grad (codes are not differentiable): pass "
                             "data.detach(), or build it with HiFloat8Tensor.to_hifloat8(tensor)")
        _check_nominal(dtype)
        if data.device.type != "npu":
            data = data.npu()
        self = torch.Tensor._make_wrapper_subclass(
            cls, data.size(), strides=data.stride(), storage_offset=data.storage_offset(), dtype=dtype,
            layout=data.layout, requires_grad=False, device=data.device)
        self._data = data
        return self

    @classmethod
    def make_like(cls, tensor: HiFloat8Tensor, *, data: torch.Tensor, **kwargs) -> HiFloat8Tensor:
        """A HiFloat8Tensor with ``tensor``'s attributes (its nominal dtype) unless ``kwargs`` give them."""
        kwargs.setdefault("dtype", tensor.dtype)
        return HiFloat8Tensor(data=data, **kwargs)

    def __repr__(self, *, tensor_contents=None):
        return f"HiFloat8Tensor(data={self.from_hifloat8(dtype=self.dtype)})"

    def from_hifloat8(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The decoded values as a plain tensor of ``dtype`` (default: the nominal dtype)."""
        return _FromHiFloat8Func.apply(self, dtype)

    @classmethod
    def to_hifloat8(cls, tensor: torch.Tensor) -> HiFloat8Tensor:
        """Encode ``tensor`` (round half away from zero); its dtype, or float32, becomes the nominal dtype."""
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"HiFloat8Tensor.to_hifloat8 takes a tensor, got {type(tensor).__name__}")
        return _ToHiFloat8Func.apply(tensor)

    def float(self) -> torch.Tensor:
        return self.from_hifloat8(dtype=torch.float32)

    def bfloat16(self) -> torch.Tensor:
        return self.from_hifloat8(dtype=torch.bfloat16)

    def half(self) -> torch.Tensor:
        return self.from_hifloat8(dtype=torch.float16)

    def cpu(self) -> torch.Tensor:
        return self.from_hifloat8().cpu()

    def clone(self) -> HiFloat8Tensor:
        return _IdentityFunc.apply(self, {"data": self._data.detach().clone()})

    def view(self, *shape) -> HiFloat8Tensor:
        return _ReshapeFunc.apply(self, shape, "view")

    def reshape(self, *shape) -> HiFloat8Tensor:
        return _ReshapeFunc.apply(self, shape, "reshape")

    def transpose(self, dim0: int, dim1: int) -> HiFloat8Tensor:
        return _TransposeFunc.apply(self, dim0, dim1)

    def contiguous(self, *, memory_format: torch.memory_format = torch.contiguous_format) -> HiFloat8Tensor:
        """``self`` when its codes are already in ``memory_format``, else a copy of the codes in it."""
        if self._data.is_contiguous(memory_format=memory_format):
            return self
        return _IdentityFunc.apply(self, {"data": self._data.detach().contiguous(memory_format=memory_format)})

    def to_dtype(self, dtype: torch.dtype) -> HiFloat8Tensor:
        """The same codes with nominal dtype ``dtype``."""
        return HiFloat8Tensor.make_like(self, data=self._data, dtype=dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == aten.copy_.default:
            dst, src = args[0], args[1]
            if isinstance(dst, HiFloat8Tensor):
                if isinstance(src, HiFloat8Tensor):
                    dst._data.copy_(src._data)
                else:
                    src = src.expand(dst.size()).to(device=dst.device)
                    dst._data.copy_(_hif8.to_hifloat8(src))
            else:
                dst.copy_(src.from_hifloat8())
            return dst
        if func in (aten.slice.Tensor, aten.view.default, aten.detach.default, aten.alias.default):
            # Views keep the codes (no decode and re-encode).
            tensor = args[0]
            return HiFloat8Tensor.make_like(tensor, data=func(tensor._data, *args[1:], **kwargs))

        def unwrap(t):
            return t.from_hifloat8() if isinstance(t, HiFloat8Tensor) else t

        new_args, new_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        out = func(*new_args, **new_kwargs)
        if not func._schema.is_mutable:
            return out
        # In place (or out=): the decoded copy was written, so encode it back into the codes it came from, and
        # return the HiFloat8Tensor in place of its decoded copy.
        written = {}
        schema_args = func._schema.arguments
        positional = list(zip(args, new_args, schema_args))
        keyword = [(kwargs[a.name], new_kwargs[a.name], a) for a in schema_args if a.name in kwargs]
        for orig, new, schema_arg in positional + keyword:
            alias = schema_arg.alias_info
            if isinstance(orig, HiFloat8Tensor) and alias is not None and alias.is_write:
                orig._data.copy_(_hif8.to_hifloat8(new))
                written[id(new)] = orig
        return tree_map(lambda t: written.get(id(t), t), out)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def _make_in_reduce_ex(cls, data: torch.Tensor, dtype: torch.dtype) -> HiFloat8Tensor:
        return HiFloat8Tensor(data=data, dtype=dtype)

    def __reduce_ex__(self, protocol: int) -> tuple:
        """Pickles as its codes and nominal dtype."""
        return HiFloat8Tensor._make_in_reduce_ex, (self._data, self.dtype)

    def _get_data(self) -> HiFloat8Tensor:
        return super().data

    def _set_data(self, tensor: torch.Tensor) -> None:
        """``t.data = x`` encodes ``x`` into the codes."""
        with torch.no_grad():
            self.copy_(tensor)

    data = property(_get_data, _set_data)
