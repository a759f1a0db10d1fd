"""fairseq's dropout layer (``FairseqDropout``) whose masks can be drawn ahead on a side stream."""
from __future__ import annotations

import torch
from torch import nn


class NpuCachedDropout(nn.Dropout):
    """Dropout with probability ``p`` in training (identity in eval). ``module_name`` is fairseq's label.

    ``NpuCachedDropout.enable_dropout_ensemble(model)`` draws the keep masks off the compute stream: after each
    forward of ``model`` a side stream draws as many masks per (shape, dtype, device, p) as that forward used, and
    before the next forward the compute stream waits for it; a call that finds none ready draws inline. Called
    with ``[shape, dtype, device]`` instead of a tensor, it returns a keep mask (bool) of that shape."""

    dropout_stream = None
    _ready: dict = {}      # (shape, dtype, device, p) -> keep masks drawn ahead
    _requests: dict = {}   # (shape, dtype, device, p) -> masks per forward

    def __init__(self, p, module_name=None):
        super().__init__(p)
        self.module_name = module_name

    def forward(self, x):
        if isinstance(x, torch.Tensor):
            key, tensor = (tuple(x.shape), x.dtype, x.device, self.p), x
        elif isinstance(x, (list, tuple)) and len(x) == 3:
            key, tensor = (tuple(x[0]), x[1], torch.device(x[2]), self.p), None
        else:
            raise TypeError(f"NpuCachedDropout: expected a tensor or [shape, dtype, device], got {type(x).__name__}")
        if tensor is not None and (self.p == 0 or not self.training):
            return tensor
        mask = self._mask(key)
        return mask if tensor is None else tensor * mask / (1 - self.p)

    @classmethod
    def _mask(cls, key):
        ready = cls._ready.get(key)
        if ready:
            mask = ready.pop(0)
            if mask.device.type == "npu":
                mask.record_stream(torch.npu.current_stream(mask.device))   # drawn on the side stream
            return mask
        cls._requests[key] = cls._requests.get(key, 0) + 1
        return _draw(key)

    @classmethod
    def enable_dropout_ensemble(cls, model):
        if cls.dropout_stream is None:
            cls.dropout_stream = torch.npu.Stream()

        def wait_for_masks(module, inputs):
            torch.npu.current_stream().wait_stream(cls.dropout_stream)

        def draw_ahead(module, inputs, outputs):
            cls.dropout_stream.wait_stream(torch.npu.current_stream())
            with torch.npu.stream(cls.dropout_stream), torch.no_grad():
                for key, count in cls._requests.items():
                    queue = cls._ready.setdefault(key, [])
                    queue.extend(_draw(key) for _ in range(count - len(queue)))

        model.register_forward_pre_hook(wait_for_masks)
        model.register_forward_hook(draw_ahead)


def _draw(key):
    shape, _, device, p = key
    return torch.rand(shape, device=device) >= p


NpuFairseqDropout = NpuCachedDropout
