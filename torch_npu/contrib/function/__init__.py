"""torch_npu.contrib.function: torch_npu's model-zoo helpers written over its operators (detection post-processing,
box coders, Swin/BERT tensor idioms), with torch_npu 2.14.0's names, signatures and documented semantics."""
from .boxes import (npu_bbox_coder_decode_xywh2xyxy, npu_bbox_coder_encode_xyxy2xywh, npu_bbox_coder_encode_yolo,
                    npu_single_level_responsible_flags)
from .nms import npu_batched_multiclass_nms, npu_multiclass_nms
from .tensor import fuse_add_softmax_dropout, matmul_transpose, npu_fast_condition_index_put, roll

__all__ = [
    "npu_multiclass_nms",
    "npu_batched_multiclass_nms",
    "npu_single_level_responsible_flags",
    "npu_fast_condition_index_put",
    "npu_bbox_coder_encode_yolo",
    "npu_bbox_coder_encode_xyxy2xywh",
    "npu_bbox_coder_decode_xywh2xyxy",
    "fuse_add_softmax_dropout",
    "roll",
    "matmul_transpose",
]
