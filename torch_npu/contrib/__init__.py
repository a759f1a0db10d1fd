"""torch_npu.contrib: ``from torch_npu.contrib import transfer_to_npu`` runs CUDA scripts on npu; the model-zoo
helpers (``function``: detection post-processing, box coders, tensor idioms; ``module``: layers) as torch_npu
2.14.0 names them. Not provided (each listed with its reason in docs/torch_npu_surface.md): the fused BERT attention
functions, ModulatedDeformConv, and MultiheadAttention."""
from .function import (fuse_add_softmax_dropout, matmul_transpose, npu_batched_multiclass_nms,
                       npu_bbox_coder_decode_xywh2xyxy, npu_bbox_coder_encode_xyxy2xywh, npu_bbox_coder_encode_yolo,
                       npu_fast_condition_index_put, npu_multiclass_nms, npu_single_level_responsible_flags, roll)
from .module import (ChannelShuffle, Focus, LabelSmoothingCrossEntropy, LinearA8W8Quant, LinearQuant, LinearWeightQuant,
                     NpuCachedDropout, NpuDropPath, NpuFairseqDropout, Prefetcher, PSROIPool, ROIAlign)

__all__ = [
    "npu_multiclass_nms", "npu_batched_multiclass_nms", "npu_single_level_responsible_flags",
    "npu_fast_condition_index_put", "npu_bbox_coder_encode_yolo", "npu_bbox_coder_encode_xyxy2xywh",
    "npu_bbox_coder_decode_xywh2xyxy", "fuse_add_softmax_dropout", "roll", "matmul_transpose",
    "ChannelShuffle", "Prefetcher", "LabelSmoothingCrossEntropy", "PSROIPool", "ROIAlign", "NpuDropPath", "Focus",
    "LinearA8W8Quant", "LinearQuant", "LinearWeightQuant", "NpuCachedDropout", "NpuFairseqDropout",
]
