"""The inference attention's output allocators give exactly the shapes and dtypes the attention operators return
(checked against the operators run on the same arguments) and value's head dim for page-attention pools."""
import pytest
import torch

import torch_npu

from ._common import NPU, ops


@pytest.mark.parametrize("layout,q_shape,kv_shape", [("BSH", (2, 3, 16), (2, 5, 8)), ("BSND", (2, 3, 4, 4),
                                                                                      (2, 5, 2, 4)),
                                                      ("BNSD", (2, 4, 3, 4), (2, 2, 5, 4)),
                                                      ("BNSD_BSND", (2, 4, 3, 4), (2, 2, 5, 4))])
@pytest.mark.parametrize("lse", [False, True])
def test_infer_output_matches_the_attention_outputs(layout, q_shape, kv_shape, lse):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(*q_shape, generator=g).to(NPU), torch.randn(*kv_shape, generator=g).to(NPU)
    out, soft = torch_npu.npu_fused_infer_attention_score(q, k, k, num_heads=4, num_key_value_heads=2,
                                                          input_layout=layout, softmax_lse_flag=lse)
    a, b = torch_npu._npu_fused_infer_attention_score_infer_output(q, k, input_layout=layout, num_heads=4,
                                                                   num_key_value_heads=2, softmax_lse_flag=lse)
    assert (a.shape, a.dtype, b.shape, b.dtype) == (out.shape, out.dtype, soft.shape, soft.dtype)
    out2, soft2 = torch_npu.npu_fused_infer_attention_score_v2(q, k, k, num_query_heads=4, num_key_value_heads=2,
                                                               input_layout=layout, return_softmax_lse=lse)
    a2, b2 = torch_npu._npu_fused_infer_attention_score_v2_infer_output(
        q, k, input_layout=layout, num_query_heads=4, num_key_value_heads=2, return_softmax_lse=lse)
    assert (a2.shape, a2.dtype, b2.shape, b2.dtype) == (out2.shape, out2.dtype, soft2.shape, soft2.dtype)
    if not lse:
        assert b.item() == 0 and b2.item() == 0


def test_infer_output_value_head_dim_quantised_and_tnd():
    q = torch.randn(2, 1, 32).to(NPU)  # BSH, 4 heads of 8
    pool = torch.randn(6, 16, 2 * 12).to(NPU)  # page pool (blocks, block_size, H) with 2 kv heads of 12
    out, lse = torch_npu._npu_fused_infer_attention_score_infer_output(
        q, pool, block_table=torch.zeros(2, 3, dtype=torch.int32).to(NPU), num_heads=4, num_key_value_heads=2,
        quant_scale2=torch.ones(1).to(NPU), softmax_lse_flag=True)
    assert out.shape == (2, 1, 48) and out.dtype == torch.int8 and lse.shape == (2, 4, 1, 1)
    t_out, t_lse = torch_npu._npu_fused_infer_attention_score_infer_output(torch.randn(7, 4, 8).to(NPU),
                                                                           torch.randn(9, 2, 6).to(NPU),
                                                                           input_layout="TND", num_heads=4,
                                                                           softmax_lse_flag=True)
    assert t_out.shape == (7, 4, 6) and t_lse.shape == (7, 4, 1)
    with pytest.raises(ValueError, match="_npu_fused_infer_attention_score_v2_infer_output: out_dtype"):
        torch_npu._npu_fused_infer_attention_score_v2_infer_output(q, pool, out_dtype=1)
    with pytest.raises(ValueError, match="_npu_fused_infer_attention_score_infer_output: input_layout"):
        torch_npu._npu_fused_infer_attention_score_infer_output(q, pool, input_layout="NTD")


def test_infer_output_compile():
    def fn(q, v):
        a, b = ops._npu_fused_infer_attention_score_infer_output(q, v, num_heads=2, softmax_lse_flag=True)
        return a.shape, b.shape

    q, v = torch.randn(2, 3, 8).to(NPU), torch.randn(2, 5, 8).to(NPU)
    assert torch.compile(fn, backend="aot_eager", fullgraph=True)(q, v) == fn(q, v)
