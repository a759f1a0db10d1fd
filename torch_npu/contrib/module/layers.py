"""Layers that torch_npu.contrib rewrites for Ascend: ShuffleNetV2's channel shuffle and YOLOv5's Focus, with the
same parameters and state-dict keys (a checkpoint of the original model loads into them)."""
from __future__ import annotations

import torch
from torch import nn


class ChannelShuffle(nn.Module):
    """``forward(x1, x2)``: concatenates along channels (``in_channels`` in all) and shuffles them in ``groups``
    (channel ``j * groups + i`` of the output is channel ``i * (in_channels // groups) + j`` of the input);
    with ``split_shuffle`` returns the first ``in_channels // groups`` shuffled channels and the rest."""

    def __init__(self, in_channels, groups=2, split_shuffle=True):
        super().__init__()
        if groups <= 0 or in_channels % groups:
            raise ValueError(f"ChannelShuffle: in_channels ({in_channels}) must be a multiple of groups ({groups})")
        self.in_channels, self.groups, self.split_shuffle = in_channels, groups, split_shuffle
        self.group_len = in_channels // groups
        self.register_buffer("out_channels", torch.arange(in_channels).reshape(groups, self.group_len).t().flatten(),
                             persistent=False)

    def forward(self, x1, x2):
        x = torch.cat([x1, x2], dim=1)
        if x.shape[1] != self.in_channels:
            raise ValueError(f"ChannelShuffle: x1 and x2 have {x.shape[1]} channels together, the module was built "
                             f"for in_channels={self.in_channels}")
        out = x.index_select(1, self.out_channels.to(x.device))
        if not self.split_shuffle:
            return out
        return out[:, :self.group_len], out[:, self.group_len:]


def _autopad(k, p=None):
    if p is None:
        p = k // 2 if isinstance(k, int) else [v // 2 for v in k]
    return p


class Conv(nn.Module):
    """YOLOv5's convolution block: Conv2d (no bias) -> BatchNorm2d -> LeakyReLU(0.1) (or nothing)."""

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, _autopad(k, p), groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.LeakyReLU(0.1, inplace=True) if act else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Focus(nn.Module):
    """YOLOv5's Focus: space to depth (the four pixels of each 2 x 2 patch become channels, in the order
    (even row, even col), (odd, even), (even, odd), (odd, odd)), then ``Conv(4 * c1, c2, k, s, p, g, act)``."""

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, act=True):
        super().__init__()
        self.conv = Conv(c1 * 4, c2, k, s, p, g, act)

    def forward(self, x):
        return self.conv(torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1))
