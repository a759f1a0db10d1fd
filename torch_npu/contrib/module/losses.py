"""Label-smoothed cross entropy (Inception v3's regulariser) as torch_npu.contrib defines it."""
from __future__ import annotations

import torch
from torch import nn


class LabelSmoothingCrossEntropy(nn.Module):
    """``forward(pred (N, C), target (N,))``: the mean over the batch (float32) of the cross entropy between
    ``softmax(pred)`` and the smoothed one-hot target: ``1 - smooth_factor`` on the true class and
    ``smooth_factor / (num_classes - 1)`` on each other class."""

    def __init__(self, num_classes=1000, smooth_factor=0.):
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"LabelSmoothingCrossEntropy: num_classes must be at least 2, got {num_classes}")
        self.num_classes = num_classes
        self.on_value = 1.0 - smooth_factor
        self.off_value = 1.0 * smooth_factor / (num_classes - 1)

    def forward(self, pred, target):
        if pred.dim() != 2 or pred.shape[1] != self.num_classes:
            raise ValueError(f"LabelSmoothingCrossEntropy: pred must be (N, num_classes={self.num_classes}), "
                             f"got {tuple(pred.shape)}")
        dist = torch.full_like(pred, self.off_value).scatter_(1, target.long()[:, None], self.on_value)
        loss = -(dist * torch.log_softmax(pred, dim=1)).sum(1)
        return torch.mean(loss, [0], keepdim=False, dtype=torch.float32)
