"""Single-process units of the training library: LR schedule, global-norm clipping, model, TP plan
resolution, pipeline splitting and their errors."""
from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

from npudist.models.llama import Transformer
from npudist.models.llama_spec import llama_layout
from npudist.models.rules import check_transformer
from npudist.models.tp_plan import build_llama_tp_plan
from npudist.plan import ModelConfig, ScheduleConfig, TPConfig
from npudist.pp import split_stage
from npudist.tp import resolve_tp_plan
from npudist.train import clip_grad_norm_, lr_factor


def test_warmup_then_cosine_to_floor():
    cfg = ScheduleConfig(warmup_steps=4, decay="cosine", min_lr_ratio=0.1)
    f = [lr_factor(s, 20, cfg) for s in range(21)]
    assert f[:4] == pytest.approx([0.2, 0.4, 0.6, 0.8]) and f[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[4:], f[5:]))
    assert f[12] == pytest.approx(0.1 + 0.9 * 0.5) and f[20] == pytest.approx(0.1)
    assert lr_factor(10, 20, ScheduleConfig(warmup_steps=0, decay="linear", min_lr_ratio=0.0)) == pytest.approx(0.5)
    assert lr_factor(15, 20, ScheduleConfig(warmup_steps=0, decay="constant")) == 1.0


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_clip_matches_torch(norm_type):
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for pa, pb in zip(a, b):
        pa.grad = torch.randn_like(pa) * 3
        pb.grad = pa.grad.clone()
    got = clip_grad_norm_(a, 1.0, norm_type=norm_type)
    want = torch.nn.utils.clip_grad_norm_(b, 1.0, norm_type=norm_type)
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    for pa, pb in zip(a, b):
        torch.testing.assert_close(pa.grad, pb.grad)


def _tiny(**kw):
    torch.manual_seed(0)
    return Transformer(ModelConfig(dim=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64,
                                   max_seq_len=32, **kw))


def _split(model, stage_id, num_stages, layers):
    layout = llama_layout(model.args)
    return split_stage(model, stage_id, num_stages, layers, list(layout.blocks), list(layout.first),
                       list(layout.last))


def test_model_gqa_causal_and_tied():
    m = _tiny()
    assert m.layers["0"].attention.wk.weight.shape == (16, 32)     # 2 kv heads x head_dim 8
    x = torch.randint(0, 256, (2, 12))
    y = x.clone()
    y[:, 8:] = (y[:, 8:] + 1) % 256
    torch.testing.assert_close(m(x)[:, :8], m(y)[:, :8])           # the future does not leak
    assert not torch.allclose(m(x)[:, 8:], m(y)[:, 8:])
    tied = _tiny(tie_embeddings=True)
    assert tied.output.weight is tied.tok_embeddings.weight
    assert tied.num_params() == m.num_params() - 256 * 32
    with pytest.raises(ValueError, match="max_seq_len"):
        m(torch.zeros(1, 40, dtype=torch.long))
    with pytest.raises(ValueError, match="n_kv_heads"):
        Transformer(ModelConfig(dim=32, n_heads=4, n_kv_heads=3))


def test_tied_embeddings_stay_tied_across_device_moves():
    import os
    device = os.environ.get("NPUDIST_TEST_DEVICE", "npu")
    if device == "npu":
        import npudist  # noqa: F401  (registers the npu device)
    m = _tiny(tie_embeddings=True).to(device)
    assert m.output.weight is m.tok_embeddings.weight and m.output.weight.device.type == device
    m.to("cpu")
    assert m.output.weight is m.tok_embeddings.weight


def test_pipeline_split_keeps_names_and_covers_model():
    m = _tiny()
    full = dict(m.named_parameters())
    stages = [_split(m, i, 4, range(i, i + 1)) for i in range(4)]
    names = [set(dict(s.named_parameters())) for s in stages]
    assert set().union(*names) == set(full) and sum(map(len, names)) == len(full)
    assert "tok_embeddings.weight" in names[0] and "output.weight" in names[3]
    assert stages[1].tok_embeddings is None and stages[1].output is None and list(stages[1].layers) == ["1"]
    h = stages[0](torch.randint(0, 256, (1, 6)))
    for s in stages[1:]:
        h = s(h)
    x = torch.randint(0, 256, (1, 6))
    out = x
    for s in stages:
        out = s(out)
    torch.testing.assert_close(out, m(x))
    with pytest.raises(ValueError, match="tie_embeddings"):
        _split(_tiny(tie_embeddings=True), 0, 2, range(0, 2))


def test_builtin_and_pattern_tp_plans():
    m = _tiny()
    plan = build_llama_tp_plan(m, sequence_parallel=True)
    assert isinstance(plan["layers.3.attention"], PrepareModuleInput)
    assert isinstance(plan["layers.0.feed_forward.w2"], RowwiseParallel)
    patterns = {"layers.*.attention.w[qkv]": "colwise", "layers.*.attention.wo": "rowwise",
                "output": "colwise", "tok_embeddings": "rowwise"}
    resolved = resolve_tp_plan(m, TPConfig(plan=patterns))
    assert sorted(resolved) == sorted(["output", "tok_embeddings"] + [
        f"layers.{i}.attention.{w}" for i in range(4) for w in ("wq", "wk", "wv", "wo")])
    assert isinstance(resolved["layers.2.attention.wk"], ColwiseParallel)
    with pytest.raises(ValueError, match="unknown style"):
        resolve_tp_plan(m, TPConfig(plan={"output": "diagonal"}))
    with pytest.raises(ValueError, match="more than one pattern"):
        resolve_tp_plan(m, TPConfig(plan={"output": "colwise", "outp*": "rowwise"}))
    assert check_transformer(m.args, 4) == [
        "model.n_kv_heads: 2 is not divisible by parallel.tp_degree=4 (tensor parallelism splits it evenly over "
        "the tp ranks)"]


@pytest.mark.parametrize("mode,policy,expected", [("full", "layer", [2, 2, 2, 2]),
                                                  ("selective", "layer", [2, 1, 2, 1]),
                                                  ("selective", "op", [2, 2, 2, 2]),
                                                  ("none", "layer", [1, 1, 1, 1])])
def test_activation_checkpointing_recomputes_and_matches(mode, policy, expected):
    from npudist.fsdp import apply_activation_checkpointing
    from npudist.plan import ACConfig
    ref, m = _tiny(), _tiny()
    apply_activation_checkpointing(m, ACConfig(mode=mode, selective_policy=policy, every_n_layers=2),
                                   list(llama_layout(m.args).blocks))
    calls = [0] * 4
    for i, block in m.layers.items():
        # pre-hook on the first submodule: recomputation stops early once it has what backward needs
        block.attention_norm.register_forward_pre_hook(lambda *a, i=int(i): calls.__setitem__(i, calls[i] + 1))
    x = torch.randint(0, 256, (2, 8))
    m(x).sum().backward()
    ref(x).sum().backward()
    assert calls == expected                       # recomputed blocks run their forward twice
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in ref.named_parameters()]
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)
