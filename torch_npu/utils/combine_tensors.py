"""torch_npu's combined tensors: several npu tensors moved into one flat buffer, each becoming a view of its
part (so one kernel can update all of them, as fused optimizers do)."""
from __future__ import annotations

import torch


def _storage_numel(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


def npu_combine_tensors(list_of_tensor, require_copy_value=True):
    """Allocate one flat npu buffer holding every tensor's storage in order and make each tensor use its part
    (same shape, strides and offset); the values are copied over when ``require_copy_value``. Returns the
    buffer (None for an empty list or zero elements)."""
    if len(list_of_tensor) == 0:
        return None
    if any(t is None for t in list_of_tensor):
        raise RuntimeError("Tensors to combine must not have `None`.")
    dtype = list_of_tensor[0].dtype
    total = 0
    for t in list_of_tensor:
        if t.dtype != dtype:
            raise RuntimeError("Tensors to combine must have the same dtype.")
        if t.device.type != "npu":
            raise RuntimeError(f"Tensors to combine must be on NPU, got {t.device.type}.")
        if not t.is_contiguous():
            raise RuntimeError("Tensors to combine must be contiguous.")
        total += _storage_numel(t)
    if total == 0:
        return None
    combined = torch.zeros(total, dtype=dtype, device=list_of_tensor[0].device)
    index = 0
    with torch.no_grad():
        for t in list_of_tensor:
            size = _storage_numel(t)
            if require_copy_value:
                combined[index:index + size].copy_(torch.empty(0, dtype=dtype, device=t.device).set_(
                    t.untyped_storage(), 0, (size,)))
            t.set_(combined.untyped_storage(), index + t.storage_offset(), t.shape, t.stride())
            index += size
    return combined


def get_part_combined_tensor(combined_tensor, index, size):
    """The ``size`` elements of ``combined_tensor`` from ``index`` on, as a tensor sharing its memory."""
    if combined_tensor is None or size == 0:
        return None
    if index + size > _storage_numel(combined_tensor):
        raise RuntimeError(f"(index + size) ({index + size}) > torch_npu.get_storage_size(combined_tensor) "
                           f"({_storage_numel(combined_tensor)})")
    return torch.empty(0, dtype=combined_tensor.dtype, device=combined_tensor.device).set_(
        combined_tensor.untyped_storage(), index, (size,))


def is_combined_tensor_valid(combined_tensor, list_of_tensor):
    """True when every tensor is contiguous and starts inside ``combined_tensor``'s memory."""
    if len(list_of_tensor) == 0:
        return True
    if combined_tensor is None:
        return False
    start = combined_tensor.untyped_storage().data_ptr()
    end = start + combined_tensor.untyped_storage().nbytes()
    return all(t is not None and start <= t.data_ptr() < end and t.is_contiguous() for t in list_of_tensor)
