"""R-FCN's position-sensitive RoI pooling as a module, over ``npu_ps_roi_pooling``."""
from __future__ import annotations

from torch import nn

import torch_npu


class PSROIPool(nn.Module):
    """``forward(features (N, output_dim * group_size ** 2, H, W), rois (B, 5, R))`` ->
    (B * R, output_dim, group_size, group_size). Only square pooling with one bin per group is defined
    (``pooled_height == pooled_width == group_size``), as on Ascend."""

    def __init__(self, pooled_height=7, pooled_width=7, spatial_scale=1 / 16.0, group_size=7, output_dim=22):
        super().__init__()
        if not pooled_height == pooled_width == group_size:
            raise ValueError(f"PSROIPool: needs pooled_height == pooled_width == group_size, got {pooled_height}, "
                             f"{pooled_width}, {group_size}")
        self.pooled_height, self.pooled_width = pooled_height, pooled_width
        self.spatial_scale, self.group_size, self.output_dim = spatial_scale, group_size, output_dim

    def forward(self, features, rois):
        return torch_npu.npu_ps_roi_pooling(features, rois, self.spatial_scale, self.group_size, self.output_dim)

    def extra_repr(self):
        return (f"pooled_width={self.pooled_width}, pooled_height={self.pooled_height}, "
                f"spatial_scale={self.spatial_scale}, group_size={self.group_size}, output_dim={self.output_dim}")
