"""Copies of an OpInfo sample's arguments for one call on cpu or npu.

Every call gets fresh tensors (a call may write its inputs: in-place and out= forms, and some function
forms), with the same storage size, strides and offset as the sample's: a partial, overlapping or expanded
view stays one (``.to("npu")`` would compact it and change what the op sees). ``grad=True`` keeps the
sample's ``requires_grad`` (the function form, whose backward is compared); the other forms run on
detached copies, as PyTorch's test_out and in-place variant tests do.
"""
import torch


def copy_to(obj, device: str, grad: bool):
    """A fresh copy of a sample structure on ``device``; on npu, cpu devices (also spelled as strings: op_db
    passes the device under test as 'cpu', e.g. ``to('cpu', ...)``) become npu."""
    if isinstance(obj, torch.Tensor):
        return _copy_tensor(obj, device, grad)
    if isinstance(obj, torch.device):
        return torch.device("npu") if device == "npu" and obj.type == "cpu" else obj
    if isinstance(obj, str) and obj == "cpu":
        return device
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(copy_to(x, device, grad) for x in obj)
    if isinstance(obj, list):
        return [copy_to(x, device, grad) for x in obj]
    if isinstance(obj, dict):
        return {k: copy_to(v, device, grad) for k, v in obj.items()}
    return obj


def _copy_tensor(t: torch.Tensor, device: str, grad: bool) -> torch.Tensor:
    requires_grad = grad and t.requires_grad
    if (requires_grad and t.grad_fn is None and t._base is not None and t._base.requires_grad
            and copies_storage(t)):
        return _view_of_grad_base(t, device)
    with torch.no_grad():
        c = _same_layout(t.detach(), device)
    return c.requires_grad_(True) if requires_grad else c


def _view_of_grad_base(view: torch.Tensor, device: str) -> torch.Tensor:
    """A view taken under no_grad of a base that requires grad (istft's sample slices its window that
    way): it reports requires_grad but has no autograd edge, so CPU autograd gives it no gradient. A
    fresh leaf would get one; rebuild the same history instead so both devices see the same graph."""
    storage = _storage_on(view, device).requires_grad_(True)  # a leaf, as the sample's base is
    with torch.no_grad():
        return storage.as_strided(view.size(), view.stride(), view.storage_offset())


def _same_layout(t: torch.Tensor, device: str) -> torch.Tensor:
    if not copies_storage(t):
        return t.to(device) if device != "cpu" else t.clone()
    return _storage_on(t, device).as_strided(t.size(), t.stride(), t.storage_offset())


def copies_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` can be rebuilt from a raw copy of its storage (not for lazy conj/neg views, whose bit
    a raw copy would drop, nor for non-strided or quantized layouts)."""
    return not (t.layout != torch.strided or t.is_quantized or t.is_conj() or t.is_neg() or t.dtype.itemsize == 0)


def _storage_on(t: torch.Tensor, device: str) -> torch.Tensor:
    """All of ``t``'s storage, as a fresh 1-D tensor of its dtype on ``device``."""
    n = t.untyped_storage().nbytes() // t.element_size()
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,)).detach()
    return whole.clone() if device == "cpu" else whole.to(device)


def mentions_npu(obj) -> bool:
    if isinstance(obj, torch.Tensor):
        return obj.device.type == "npu"
    if isinstance(obj, torch.device):
        return obj.type == "npu"
    if isinstance(obj, str):
        return obj == "npu"
    if isinstance(obj, (list, tuple)):
        return any(mentions_npu(x) for x in obj)
    if isinstance(obj, dict):
        return any(mentions_npu(x) for x in obj.values())
    return False


def tensors(obj):
    """Tensors of a nested structure, in a deterministic order."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from tensors(x)
