"""Dynamo's runtime interface for the npu device (``torch._dynamo.device_interface``).

Dynamo uses it to trace ``torch.npu`` streams and events, and Inductor uses it for device properties and
synchronisation; every method forwards to ``torch.npu``.
"""
import torch
from torch._dynamo.device_interface import DeviceInterface


class NpuInterface(DeviceInterface):
    device = torch.npu.device
    Event = torch.npu.Event
    Stream = torch.npu.Stream

    class Worker:
        # Used by compile workers; the emulated device needs no driver, so these are the plain torch.npu calls.
        set_device = staticmethod(torch.npu.set_device)
        current_device = staticmethod(torch.npu.current_device)
        get_device_properties = staticmethod(torch.npu.get_device_properties)

    @staticmethod
    def current_device() -> int:
        return torch.npu.current_device()

    @staticmethod
    def set_device(device) -> None:
        torch.npu.set_device(device)

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = torch.npu.current_device()
        if device >= 0 and device != previous:
            torch.npu.set_device(device)
        return previous

    maybe_exchange_device = exchange_device

    @staticmethod
    def device_count() -> int:
        return torch.npu.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.npu.is_available()

    @staticmethod
    def stream(stream):
        return torch.npu.stream(stream)

    @staticmethod
    def current_stream():
        return torch.npu.current_stream()

    @staticmethod
    def set_stream(stream) -> None:
        torch.npu.set_stream(stream)

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        # Inductor passes raw streams only to GPU (Triton) kernels; the C++ kernels used on npu take none.
        return 0

    @staticmethod
    def synchronize(device=None) -> None:
        torch.npu.synchronize(device)

    @classmethod
    def get_device_properties(cls, device=None):
        return torch.npu.get_device_properties(device)

    @staticmethod
    def get_compute_capability(device=None) -> str:
        return ""

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return torch.npu.is_bf16_supported()

    @staticmethod
    def memory_allocated(device=None) -> int:
        return torch.npu.memory_allocated(device)

    @staticmethod
    def is_triton_capable(device=None) -> bool:
        return False


def register() -> None:
    from torch._dynamo.device_interface import register_interface_for_device

    register_interface_for_device("npu", NpuInterface)
    for index in range(torch.npu.device_count()):
        register_interface_for_device(f"npu:{index}", NpuInterface)
