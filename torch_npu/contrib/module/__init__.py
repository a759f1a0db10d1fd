"""torch_npu.contrib.module: torch_npu's model-zoo layers, with torch_npu 2.14.0's names, signatures and
documented semantics."""
from .drop_path import NpuDropPath
from .ensemble_dropout import NpuCachedDropout, NpuFairseqDropout
from .layers import ChannelShuffle, Focus
from .losses import LabelSmoothingCrossEntropy
from .prefetcher import Prefetcher
from .quant_linear import LinearA8W8Quant, LinearQuant, LinearWeightQuant
from .ps_roi_pooling import PSROIPool
from .roi_align import ROIAlign

__all__ = ["ChannelShuffle", "Prefetcher", "LabelSmoothingCrossEntropy", "PSROIPool", "ROIAlign", "NpuDropPath",
           "Focus", "LinearA8W8Quant", "LinearQuant", "LinearWeightQuant",
           "NpuCachedDropout", "NpuFairseqDropout"]
