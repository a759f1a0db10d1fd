"""Optimizer-state swap: the optimizer's state tensors (AdamW's exp_avg and exp_avg_sq) live in pinned host
memory between steps and come to the device for the step.

The step itself runs on the device, with the optimizer's own kernels: stepping on the host would need the
gradients copied out and the parameters copied back every step, and a second implementation of the update.
So the saving is during forward and backward, where activations peak: there the state takes no device
memory. During the step the whole state is on the device again (activations are freed by then).

Through the optimizer's public step hooks (``register_step_pre_hook`` / ``register_step_post_hook``). The state
tensors keep their identity (DTensor wrappers and ``state_dict`` structure included): only their storage
leaves the device (``untyped_storage().resize_(0)``, as FSDP2 frees unsharded parameters) and is re-allocated
and refilled before the next step. Copies run on a side stream; the compute stream waits on an event
before the step reads the state, and ``record_stream`` keeps a swapped-out block from reuse until the
copy to host has read it. ``resident()`` brings the state back for whatever reads it between steps
(saving a checkpoint).
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def _plain_tensors(t: torch.Tensor):
    """The plain tensors holding ``t``'s data (its inner tensors for a wrapper subclass such as DTensor)."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        for n in names:
            inner = getattr(t, n)
            if isinstance(inner, torch.Tensor):   # DTensor's device mesh is an inner non-tensor
                yield from _plain_tensors(inner)
    else:
        yield t


class OptimizerStateSwap:
    """Keeps ``optimizer``'s device state on the host between steps (from the first step on)."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device):
        self.optimizer, self.device = optimizer, device
        self.device_module = getattr(torch, device.type)
        self.stream = self.device_module.Stream(device=device)
        self._host: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # id(state tensor) -> (it, its pinned copy)
        self._out = False                                              # state currently on the host
        self._handles = [optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.bring_in()),
                         optimizer.register_step_post_hook(lambda opt, args, kwargs: self.send_out())]

    def _state_tensors(self):
        for state in self.optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    for t in _plain_tensors(value):
                        if t.device == self.device and t.numel() > 0:
                            yield t

    @property
    def host_bytes(self) -> int:
        return sum(h.numel() * h.element_size() for _, h in self._host.values())

    def send_out(self) -> None:
        """Copy the state to its pinned buffers on the side stream and free its device storage."""
        if self._out:
            return
        self.stream.wait_stream(self.device_module.current_stream(self.device))
        # Rebuilt every time: a state replaced since (load_state_dict) must not keep its old tensors.
        host = {}
        with self.device_module.stream(self.stream):
            for t in self._state_tensors():
                entry = self._host.get(id(t))
                if entry is None or entry[0] is not t:
                    entry = (t, torch.empty_like(t, device="cpu", pin_memory=True))
                host[id(t)] = entry
                entry[1].copy_(t, non_blocking=True)
        self._host = host
        for t, _ in self._host.values():
            t.record_stream(self.stream)
            t.untyped_storage().resize_(0)
        self._out = True

    def bring_in(self) -> None:
        """Re-allocate the state's device storage and refill it from the host; the compute stream waits."""
        if not self._out:
            return
        current = self.device_module.current_stream(self.device)
        for t, host in self._host.values():
            t.untyped_storage().resize_(host.numel() * host.element_size())
        self.stream.wait_stream(current)   # the new blocks were allocated on the compute stream
        with self.device_module.stream(self.stream):
            for t, host in self._host.values():
                t.copy_(host, non_blocking=True)
        current.wait_stream(self.stream)
        self._out = False

    @contextlib.contextmanager
    def resident(self):
        """The state on the device inside the block (e.g. to save it), back on the host after."""
        was_out = self._out
        self.bring_in()
        try:
            yield
        finally:
            if was_out:
                self.send_out()

    def remove(self) -> None:
        """Bring the state back and stop swapping."""
        self.bring_in()
        for h in self._handles:
            h.remove()
