"""A data prefetcher that copies the next batch to the npu on a side stream while the current one trains."""
from __future__ import annotations

import torch


class Prefetcher:
    """Wraps a loader of ``(input, target)`` batches: ``next()`` returns the current batch already on the npu and
    starts copying the following one on ``stream`` (a new ``torch.npu.Stream()`` if None; pass one when making
    prefetchers repeatedly). At the end of the loader ``next()`` returns ``(None, None)``. Pinned host batches
    copy asynchronously."""

    def __init__(self, loader, stream=None):
        self.loader = iter(loader)
        self.stream = stream if stream is not None else torch.npu.Stream()
        self.preload()

    def preload(self):
        try:
            self.next_input, self.next_target = next(self.loader)
        except StopIteration:
            self.next_input = self.next_target = None
            return
        with torch.npu.stream(self.stream):
            self.next_input = self.next_input.npu(non_blocking=True)
            self.next_target = self.next_target.npu(non_blocking=True)

    def next(self):
        current = torch.npu.current_stream()
        current.wait_stream(self.stream)
        next_input, next_target = self.next_input, self.next_target
        for t in (next_input, next_target):
            if t is not None:
                t.record_stream(current)   # made on the side stream, used on this one
        if next_target is not None:
            self.preload()
        return next_input, next_target
