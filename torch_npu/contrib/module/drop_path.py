"""Stochastic depth (drop path, Swin/ViT) whose random draws can be made ahead on a side stream."""
from __future__ import annotations

import torch
from torch import nn


class NpuDropPath(nn.Module):
    """In training, each sample of the batch is zeroed with probability ``drop_prob`` and the kept ones are scaled
    by ``1 / (1 - drop_prob)``; in eval (or with ``drop_prob`` 0) the input is returned.

    ``NpuDropPath.enable_droppath_ensemble(model)`` moves the random draws off the compute stream: before each
    forward of ``model``, a side stream draws as many per-sample tensors for each input shape as the previous
    forward used, and the compute stream waits for it; a forward that finds none ready draws inline."""

    droppath_stream = None
    _ready: dict = {}      # (shape, device, dtype) -> random tensors drawn ahead on droppath_stream
    _requests: dict = {}   # (shape, device, dtype) -> draws per forward, learned from the forwards so far

    def __init__(self, drop_prob=None):
        super().__init__()
        if drop_prob is None or not 0.0 <= drop_prob < 1.0:
            raise ValueError(f"NpuDropPath: drop_prob must be in [0, 1), got {drop_prob}")
        self.drop_prob = drop_prob
        self.keep_prob = 1 - drop_prob

    def forward(self, x):
        if self.drop_prob == 0. or not self.training:
            return x
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"NpuDropPath: expected a tensor, got {type(x).__name__}")
        key = (tuple(x.shape), x.device, x.dtype)
        ready = NpuDropPath._ready.get(key)
        if ready:
            rand = ready.pop(0)
            if x.device.type == "npu":
                rand.record_stream(torch.npu.current_stream(x.device))   # drawn on the side stream, used here
        else:
            NpuDropPath._requests[key] = NpuDropPath._requests.get(key, 0) + 1
            rand = _draw(key)
        return x.div(self.keep_prob) * torch.floor(rand + self.keep_prob)

    @classmethod
    def enable_droppath_ensemble(cls, model):
        if cls.droppath_stream is None:
            cls.droppath_stream = torch.npu.Stream()

        def draw_ahead(module, inputs):
            with torch.npu.stream(cls.droppath_stream), torch.no_grad():
                for key, count in cls._requests.items():
                    queue = cls._ready.setdefault(key, [])
                    queue.extend(_draw(key) for _ in range(count - len(queue)))
            torch.npu.current_stream().wait_stream(cls.droppath_stream)

        model.register_forward_pre_hook(draw_ahead)


def _draw(key):
    shape, device, dtype = key
    return torch.rand((shape[0],) + (1,) * (len(shape) - 1), dtype=dtype, device=device)
