"""The ``npu`` operator namespace: Ascend's fused operators as real ``torch.ops.npu.*`` operators.

Each operator has an npu (PrivateUse1) kernel computing the documented math with aten ops on npu tensors,
an autograd formula (a backward operator where one is needed) and a fake kernel, so torch.compile, FSDP2 and
DTensor can trace it. Importing npudist registers them; ``torch_npu`` re-exports them at its top level.
Semantics and the differences from Ascend: docs/torch_npu.md.
"""
from npudist.ops import (activation, aten_matmul, attention, attention_update, layout, loss, matmul, moe,  # noqa: F401
                         norm, optim, rotary)  # (registration)
from npudist.ops import mc2  # noqa: F401, E402  (registration: the compute-communication operators)
from npudist.ops import attention_v2, bert_adam, format, gating, online_max_sum, routing  # noqa: F401  (registration)

# Public operators, as torch_npu exposes them (torch_npu.<name>); backward operators are internal.
OPS = (
    "npu_fusion_attention", "npu_fusion_attention_grad", "npu_rms_norm", "npu_rotary_mul", "npu_swiglu",
    "npu_geglu", "npu_scaled_masked_softmax", "npu_apply_adam_w", "npu_grouped_matmul",
    "npu_grouped_matmul_add", "npu_grouped_matmul_add_", "npu_moe_token_permute", "npu_moe_token_unpermute",
    "npu_moe_token_permute_with_routing_map", "npu_moe_token_unpermute_with_routing_map", "npu_moe_init_routing",
    "npu_moe_finalize_routing", "npu_moe_compute_expert_tokens", "npu_rms_norm_backward", "npu_add_rms_norm",
    "npu_add_rms_norm_cast", "npu_gemma_rms_norm", "npu_layer_norm_eval", "npu_fast_gelu", "npu_silu", "npu_mish",
    "npu_gelu_mul", "npu_clipped_swiglu", "npu_apply_rotary_pos_emb", "npu_mrope", "npu_cross_entropy_loss",
    "npu_apply_adam", "npu_ring_attention_update", "npu_attention_update", "npu_transpose", "npu_confusion_transpose",
    "npu_broadcast", "npu_pad", "npu_one_hot", "npu_dtype_cast",
    "npu_all_gather_base_mm", "npu_mm_reduce_scatter_base", "npu_mm_all_reduce_base",
)
OPS += ("npu_moe_gating_top_k_softmax", "npu_moe_gating_top_k_softmax_v2", "npu_moe_gating_top_k",
        "npu_moe_gating_top_k_backward", "npu_moe_init_routing_v2", "npu_grouped_matmul_finalize_routing",
        "npu_fusion_attention_v2", "npu_fusion_attention_v3", "npu_fused_linear_online_max_sum",
        "npu_bert_apply_adam", "npu_format_cast", "npu_format_cast_", "empty_with_format", "get_npu_format")

# torch_npu call forms that differ from the torch.ops.npu operator (in-place ops returning their input).
CALL_FORMS = {"npu_grouped_matmul_add_": matmul.grouped_matmul_add_,
              "npu_apply_rotary_pos_emb": rotary.npu_apply_rotary_pos_emb, "npu_apply_adam": optim.apply_adam}
CALL_FORMS["npu_bert_apply_adam"] = bert_adam.bert_apply_adam
CALL_FORMS["get_npu_format"] = format.get_npu_format
from npudist.ops import conv, float_status, norm_ops, random_ops, tensor_ops  # noqa: F401, E402  (registration)
OPS += ("npu_linear", "npu_max", "npu_min", "npu_slice", "npu_indexing", "npu_reshape", "npu_bmmV2",
        "npu_transpose_batchmatmul", "npu_sort_v2", "one_", "copy_memory_", "fast_gelu", "npu_gather_sparse_index",
        "npu_masked_fill_range", "npu_sign_bits_pack", "npu_sign_bits_unpack", "npu_scatter", "npu_scatter_nd_update",
        "npu_scatter_nd_update_", "scatter_update", "scatter_update_", "npu_softmax_cross_entropy_with_logits",
        "npu_apply_adam_w_out", "_npu_dropout", "npu_dropout_with_add_softmax", "npu_random_choice_with_mask",
        "npu_sim_exponential_", "npu_top_k_top_p", "npu_group_norm_silu", "npu_group_norm_swish", "batch_norm_reduce",
        "npu_normalize_batch", "npu_alloc_float_status", "npu_get_float_status", "npu_clear_float_status",
        "npu_conv2d", "npu_conv3d", "npu_convolution", "npu_conv_transpose2d", "npu_convolution_transpose")
from npudist.ops import detection, nms, roi, rotated  # noqa: F401, E402  (registration)
OPS += ("npu_iou", "npu_ptiou", "npu_giou", "npu_diou", "npu_ciou", "npu_bounding_box_encode",
        "npu_bounding_box_decode", "npu_yolo_boxes_encode", "npu_anchor_response_flags", "npu_grid_assign_positive",
        "npu_nms_v4", "npu_nms_with_mask", "npu_batch_nms", "npu_roi_align", "npu_ps_roi_pooling",
        "npu_rotated_box_encode", "npu_rotated_box_decode", "npu_rotated_overlaps", "npu_rotated_iou",
        "npu_nms_rotated")
OPS += ("npu_stride_add",)
from npudist.ops import quant  # noqa: F401, E402  (registration)
OPS += ("npu_quantize", "npu_anti_quant", "npu_dynamic_quant", "npu_dynamic_quant_asymmetric", "npu_quant_matmul",
        "npu_weight_quant_batchmatmul")
from npudist.ops import rnn  # noqa: F401, E402  (registration)
OPS += ("_lstm_npu", "_lstm_npu_backward")
from npudist.ops import infer_attention  # noqa: F401, E402  (registration)
OPS += ("npu_prompt_flash_attention", "npu_incre_flash_attention", "npu_fused_infer_attention_score")
from npudist.ops import norm_quant  # noqa: F401, E402  (registration)
OPS += ("npu_add_rms_norm_quant", "npu_add_rms_norm_dynamic_quant")
from npudist.ops import kv_cache  # noqa: F401, E402  (registration)
OPS += ("npu_scatter_pa_kv_cache",)
from npudist.ops import causal_conv  # noqa: F401, E402  (registration)
OPS += ("npu_masked_causal_conv1d", "npu_masked_causal_conv1d_backward")
from npudist.ops import block_quant  # noqa: F401, E402  (registration)
OPS += ("npu_dynamic_block_quant", "npu_quant_max")
from npudist.ops import infer_attention_v2  # noqa: F401, E402  (registration)
OPS += ("npu_fused_infer_attention_score_v2",)
from npudist.ops import quant_matmul_ops  # noqa: F401, E402  (registration)
OPS += ("npu_quant_matmul_gelu", "npu_quant_matmul_reduce_sum")
from npudist.ops import bgmv  # noqa: F401, E402  (registration)
OPS += ("npu_batch_gather_matmul", "npu_batch_gather_matmul_")
from npudist.ops import ce_max_sum  # noqa: F401, E402  (registration)
OPS += ("npu_fused_cross_entropy_loss_with_max_sum", "npu_fused_linear_cross_entropy_loss_with_max_sum_backward")
from npudist.ops import nsa  # noqa: F401, E402  (registration)
OPS += ("npu_nsa_compress",)
from npudist.ops import ffn  # noqa: F401, E402  (registration)
OPS += ("npu_ffn",)
from npudist.ops import block_sparse_attention  # noqa: F401, E402  (registration)
OPS += ("npu_block_sparse_attention",)
from npudist.ops import swiglu_quant  # noqa: F401, E402  (registration)
OPS += ("npu_swiglu_quant", "npu_dequant_swiglu_quant")
from npudist.ops import mhc  # noqa: F401, E402  (registration)
OPS += ("npu_mhc_post", "npu_mhc_post_backward")
from npudist.ops import advance_step  # noqa: F401, E402  (registration)
OPS += ("npu_advance_step_flashattn",)
from npudist.ops import mx_quant  # noqa: F401, E402  (registration)
OPS += ("npu_dynamic_mx_quant", "npu_grouped_dynamic_mx_quant", "npu_dynamic_mx_quant_with_dual_axis")
from npudist.ops import hardware_only  # noqa: E402  (the operators that need Ascend hardware: refused)
OPS += tuple(hardware_only.FUNCTIONS)
CALL_FORMS.update(hardware_only.FUNCTIONS)
from npudist.ops import infer_output  # noqa: F401, E402  (registration)
OPS += ("_npu_fused_infer_attention_score_infer_output", "_npu_fused_infer_attention_score_v2_infer_output")
from npudist.ops import fused_causal_conv  # noqa: F401, E402  (registration)
OPS += ("npu_fused_causal_conv1d",)
from npudist.ops import quant_gmm_add  # noqa: F401, E402  (registration)
OPS += ("npu_add_quant_gmm_",)
from npudist.ops import mc2_quant  # noqa: F401, E402  (registration)
OPS += ("npu_all_gather_quant_mm", "npu_quant_mm_reduce_scatter")
from npudist.ops import floyd_attention  # noqa: F401, E402  (registration)
OPS += ("npu_fused_floyd_attention",)
from npudist.ops import nsa_infer  # noqa: F401, E402  (registration)
OPS += ("npu_nsa_select_attention_infer",)
