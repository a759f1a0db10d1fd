"""Model specs beyond the built-in Llama: HuggingFace causal LMs (hf_causal_lm) and a user's own nn.Module
(module) from a plan, trained under FSDP x TP and PP with single-device parity, and their plan checks."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from _train_parity import make_plan, parallel_worker, reference_run
from _train_spawn import free_port, run_ranks
from npudist.data import default_corpus_path
from npudist.models import build_model, model_layout
from npudist.plan import ModelConfig, PlanError, load_plan
from npudist.plan.check import check_plan, count_params

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
DEVICE = os.environ.get("NPUDIST_TEST_DEVICE", "npu")
HF = dict(name="hf_causal_lm", vocab_size=256, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64,
          max_seq_len=32)
USER = dict(name="module", module="user_model:build_model", vocab_size=256, dim=32, n_layers=2,
            ffn_hidden_dim=64)

if EXAMPLES not in sys.path:   # user_model lives in examples/ (spawned ranks inherit sys.path)
    sys.path.insert(0, EXAMPLES)


def _assert_parity(plan, ref, world, tmp_path):
    out = str(tmp_path / "result")
    run_ranks(parallel_worker, world, (plan, out), str(tmp_path), timeout=170)
    assert ref["norms"][0] > plan.training.max_grad_norm, "clipping must be active for the test to mean much"
    seen = set()
    for r in range(world):
        res = torch.load(f"{out}.{r}")
        for step, (got, want) in enumerate(zip(res["losses"], ref["losses"], strict=True)):
            assert abs(got - want) <= 1e-5 * abs(want), f"rank {r} step {step}: loss {got} vs {want}"
        for name, p in res["params"].items():   # a pipeline rank holds its stage's parameters
            diff = (p - ref["params"][name]).abs().max().item()
            assert diff <= 1e-5, f"rank {r} param {name}: max abs diff {diff}"
            seen.add(name)
    assert seen == set(ref["params"]), f"parameters never checked: {set(ref['params']) - seen}"
    assert ref["losses"][-1] < ref["losses"][0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return default_corpus_path(cache_dir=str(tmp_path_factory.mktemp("corpus")))


# --- HuggingFace ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hf_type", ["llama", "qwen2"])
def test_hf_runner_matches_transformers_forward(hf_type):
    from transformers import AutoModelForCausalLM

    from npudist.models.hf import HFCausalLM, hf_config
    cfg = ModelConfig(**{**HF, "hf_model_type": hf_type})
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_config(cfg), attn_implementation="sdpa")
    x = torch.randint(0, 256, (2, 12))
    want = hf(x).logits
    runner = HFCausalLM(hf)
    torch.testing.assert_close(runner(x), want, rtol=0, atol=0)
    assert [n for n, _ in runner.named_parameters()] == [n for n, _ in hf.named_parameters()]


def test_hf_layout_and_plan_check_match_the_real_model():
    plan = load_plan(os.path.join(EXAMPLES, "plans", "hf_qwen2_pp.yaml"), world_size=4)
    assert plan.parallel.pp.split_points == [2]                      # "model.layers.2" -> block index
    model = build_model(plan.model)
    layout = model_layout(plan.model)
    assert list(layout.modules) == [n for n, _ in model.named_modules() if n]
    assert layout.params == {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert count_params(plan.model) == sum(p.numel() for p in model.parameters())
    _, _, text = check_plan(os.path.join(EXAMPLES, "plans", "hf_llama_fsdp_tp.yaml"), 4)
    assert "hf_causal_lm (llama)" in text and "units model.layers.*" in text


def test_hf_plan_errors_name_the_key():
    with pytest.raises(PlanError) as e:
        load_plan({"model": HF, "parallel": {"fsdp": {"wrap": ["model.layer.*"]}, "tp_degree": 2,
                                             "tp": {"sequence_parallel": True}}}, world_size=2)
    assert any(x.startswith("parallel.fsdp.wrap[0]:") and 'did you mean "model.layers.*"' in x for x in e.value.errors)
    assert any(x.startswith("parallel.tp.sequence_parallel: not supported for hf_causal_lm") for x in e.value.errors)
    with pytest.raises(PlanError, match="model.hf_model_type: transformers has no config for 'lama'"):
        load_plan({"model": {**HF, "hf_model_type": "lama"}})


HF_LAYOUTS = {
    # FSDP x TP with the spec's built-in TP plan and vocab-sharded logits into the loss.
    "fsdp2_tp2": dict(dp_shard=2, tp=2, loss_parallel=True),
    # pipeline (2 stages) x FSDP, GQA Qwen2 (q/k/v biases).
    "pp2_fsdp2_qwen2": dict(pp=2, dp_shard=2, schedule="1F1B", model={"hf_model_type": "qwen2"}),
}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("layout", list(HF_LAYOUTS))
def test_hf_parity(layout, corpus, tmp_path):
    kw = dict(HF_LAYOUTS[layout])
    model = {**HF, **kw.pop("model", {})}
    plan = make_plan(corpus, DEVICE, model=model, **kw)
    ref = reference_run(make_plan(corpus, "cpu", model=model))
    _assert_parity(plan, ref, 4, tmp_path)


# --- the user's own module ----------------------------------------------------------------------------

@pytest.mark.timeout(200)
def test_user_module_trains_with_fsdp_like_one_device(corpus, tmp_path):
    plan = make_plan(corpus, DEVICE, dp_shard=2, model=USER, wrap=["blocks.*"])
    ref = reference_run(make_plan(corpus, "cpu", model=USER))
    _assert_parity(plan, ref, 2, tmp_path)


def test_user_module_plan_errors():
    cases = [({**USER, "module": "user_model"}, "model.module: expected \"package.module:function\""),
             ({**USER, "module": "no_such_pkg.mod:f"}, "model.module: cannot import 'no_such_pkg.mod'"),
             ({**USER, "module": "user_model:nope"}, "model.module: 'user_model' has no attribute 'nope'")]
    for model, message in cases:
        with pytest.raises(PlanError, match=message):
            load_plan({"model": model})
    with pytest.raises(PlanError, match="parallel.pp_degree: the module model cannot be pipelined"):
        load_plan({"model": USER, "parallel": {"pp_degree": 2, "dp_shard_degree": 1}, "data": {"micro_batch_size": 2}})
    with pytest.raises(PlanError, match="parallel.tp.plan: a user module has no built-in tensor-parallel plan"):
        load_plan({"model": USER, "parallel": {"tp_degree": 2, "dp_shard_degree": 1}})
    with pytest.raises(PlanError, match=r"model.name: 'lamma' is not a registered model spec \(did you mean"):
        load_plan({"model": {"name": "lamma"}})


def test_register_model_spec_rejects_silent_shadowing():
    from npudist.models import ModelSpec, get_model_spec, register_model_spec
    with pytest.raises(ValueError, match="already registered"):
        register_model_spec(ModelSpec(name="llama", build=None, layout=None))
    assert get_model_spec("llama").supports_pipeline


# --- end to end under npurun ------------------------------------------------------------------------------

@pytest.mark.timeout(240)
def test_hf_plan_trains_under_npurun(tmp_path):
    """examples/train.py with the HF example plan, shrunk by overrides, on 4 ranks (FSDP x TP)."""
    env = dict(os.environ, NPUDIST_DATA_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "npudist.launch", "--nproc", "4", "--device", DEVICE, "--master-port",
           str(free_port()), os.path.join(EXAMPLES, "train.py"), "--config",
           os.path.join(EXAMPLES, "plans", "hf_llama_fsdp_tp.yaml"), "--model.dim=32", "--model.ffn_hidden_dim=64",
           "--model.n_layers=2", "--data.seq_len=32", "--data.global_batch_size=8", "--data.micro_batch_size=4",
           "--training.steps=6", "--logging.log_every=1", f"--training.device={DEVICE}",
           f"--logging.metrics_path={tmp_path / 'm.jsonl'}", "--logging.progress_bar=false"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=220, env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    import json
    losses = [json.loads(line)["loss"] for line in open(tmp_path / "m.jsonl")]
    assert len(losses) == 6 and losses[-1] < losses[0]
