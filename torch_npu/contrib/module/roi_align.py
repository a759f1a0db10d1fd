"""Detectron2's ROIAlign layer (torch_npu.contrib's), over npudist's RoIAlign kernel (npudist/ops/roi.py)."""
from __future__ import annotations

from torch import nn
from torch.nn.modules.utils import _pair

from npudist.ops.roi import roi_align


class ROIAlign(nn.Module):
    """``forward(input_tensor (N, C, H, W), rois (K, 5) [batch_index, x1, y1, x2, y2])`` -> (K, C, *output_size),
    float32. Each output bin averages bilinear samples of its RoI (``sampling_ratio`` per side, 0: ``ceil`` of
    the bin size); ``aligned=True`` shifts the scaled RoI by -0.5 pixel so that sample coordinates match pixel
    centres (Detectron2's pixel model), ``aligned=False`` is the legacy RoIAlign (RoIs at least 1 x 1)."""

    def __init__(self, output_size, spatial_scale, sampling_ratio, aligned=True):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned

    def forward(self, input_tensor, rois):
        if input_tensor.dim() != 4:
            raise ValueError(f"ROIAlign: input_tensor must be (N, C, H, W), got {tuple(input_tensor.shape)}")
        if rois.dim() != 2 or rois.size(1) != 5:
            raise ValueError(f"ROIAlign: rois must be (K, 5) [batch_index, x1, y1, x2, y2], got {tuple(rois.shape)}")
        if self.sampling_ratio < 0:
            raise ValueError(f"ROIAlign: sampling_ratio must be >= 0 (0: adaptive), got {self.sampling_ratio}")
        ph, pw = _pair(self.output_size)
        return roi_align(input_tensor.float(), rois, self.spatial_scale, ph, pw, self.sampling_ratio,
                         aligned=self.aligned)

    def extra_repr(self):
        return (f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned}")
