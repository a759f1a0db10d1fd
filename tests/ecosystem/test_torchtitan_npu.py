"""Ascend's torchtitan adaptation, torchtitan-npu 0.2.2.post2 (with torchtitan 0.2.2), trains unchanged on npu + hccl.

Each run is torchtitan-npu's own entry point, `npurun --nproc 2 -m torchtitan_npu.entry --job.config_file <toml>`,
as its users launch it with torchrun, on torchtitan's `debugmodel` flavors with a few steps of an offline dataset
(torchtitan's `c4_test` loader pointed at a JSON file written here) and a byte-level tokenizer written here. A run
with torchtitan-npu's NPU converters is compared with the same job with `converters = []` (torchtitan's unfused
modules), step by step: fp32 parameters and compute, a fixed seed and deterministic mode, so the two agree to the
project's 1e-5 relative bar. The losses are read from torchtitan's step log, which prints 5 decimals; for losses
above 1 that rounding is below 1e-6 relative.

Converters compared: npu_rms_norm (torch_npu.npu_rms_norm) and npu_rope (torch_npu.npu_rotary_mul). The MoE
converters npu_gmm (npu_grouped_matmul + npu_swiglu) and npu_permute (npu_moe_token_permute/unpermute) train, but
have no unfused twin to equal: npu_gmm's expert code casts activations and weights to bfloat16, and it replaces
GroupedExperts.init_weights (a fused w13 drawn with normal_ after w2, where torchtitan draws w1, w2, w3 with
trunc_normal_), so its model starts from other weights. Their runs are compared with themselves instead: FSDP2
against FSDP2 + expert parallel 2, where npu_permute's own dispatch/combine moves the tokens.
npu_fusion_attention is not usable with torchtitan 0.2.2 at all: torchtitan's llama3 attention calls its inner
attention with `enable_gqa=`, which torchtitan-npu's NPUFusionAttention.forward does not accept (a TypeError raised
in torchtitan-npu's code, on any device).

Also run: torchtitan-npu's swap optimizer (equal to AdamW) and its profiling patch (an npu trace).
"""
import json
import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))
from launch_helpers import run_npurun  # noqa: E402
from titan_assets import write_titan_assets

pytest.importorskip("torchtitan_npu", reason="torchtitan-npu is not installed (requirements-test.txt pins it)")

RUN_TIMEOUT = 240  # s for one 2-rank run: 11-14 s on the quiet 2-core machine, ~50 s under heavy load (imports)
REL_TOL = 1e-5
STEPS = 3
FUSED = ["npu_rms_norm", "npu_rope"]
MOE = ["npu_rms_norm", "npu_rope", "npu_gmm", "npu_permute"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"^\[rank0\]: .* step:\s+(\d+)\s+loss:\s+([-0-9.eE+naif]+)")
_APPLIED = re.compile(r"^\[rank0\]: .*\[NPU-CONVERTER\] Applied '([a-z_0-9]+)' : (\d+) replacements")
_WORDS = ("the npu rank tensor shard gather reduce scatter model layer loss step train expert token weight grad "
          "optimizer memory stream device mesh plan route").split()


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("titan_assets")
    write_titan_assets(root, _WORDS, lines=200)
    return root


def _config(assets: Path, out: Path, model: str, converters: list[str], parallelism: dict[str, int],
            steps: int = STEPS, job_extra: str = "", optimizer_extra: str = "", extra: str = "") -> str:
    par = "\n".join(f"{k} = {v}" for k, v in parallelism.items())
    return f"""\
[job]
dump_folder = "{out}"
{job_extra}
[metrics]
log_freq = 1
[model]
name = "{model}"
flavor = "debugmodel"
hf_assets_path = "{assets / 'tokenizer'}"
converters = {json.dumps(converters)}
[optimizer]
name = "AdamW"
lr = 8e-4
{optimizer_extra}
[lr_scheduler]
warmup_steps = 1
[training]
dataset = "c4_test"
dataset_path = "{assets / 'data'}"
local_batch_size = 2
seq_len = 64
steps = {steps}
mixed_precision_param = "float32"
[parallelism]
{par}
[debug]
seed = 0
deterministic = true
{extra}
"""


def _train(tmp_path: Path, assets: Path, name: str, model: str, converters: list[str],
           parallelism: dict[str, int], steps: int = STEPS, expect_log: str = "",
           **toml_extra: str) -> list[float]:
    """Run torchtitan-npu's entry point on 2 npu ranks; the loss of each step (rank 0's log)."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    cfg = run_dir / "job.toml"
    cfg.write_text(_config(assets, run_dir / "out", model, converters, parallelism, steps, **toml_extra))
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(run_dir / "hf")}
    res = run_npurun(["--nproc", "2", "-m", "torchtitan_npu.entry", "--job.config_file", str(cfg)], run_dir,
                     env=env, timeout=RUN_TIMEOUT)
    lines = [_ANSI.sub("", ln) for ln in res.output.splitlines()]
    assert res.returncode == 0, "\n".join(lines[-80:])
    # replace_modules logs a failed module replacement with a cross and goes on: none may be there.
    assert not [ln for ln in lines if "\u2717" in ln], "\n".join(ln for ln in lines if "\u2717" in ln)
    applied = {m.group(1): int(m.group(2)) for ln in lines if (m := _APPLIED.match(ln))}
    assert applied == {c: applied.get(c, 0) for c in converters} and all(applied.values()), applied
    assert not expect_log or any(expect_log in ln for ln in lines), f"no log line with {expect_log!r}"
    losses = {int(m.group(1)): float(m.group(2)) for ln in lines if (m := _STEP.match(ln))}
    assert sorted(losses) == list(range(1, steps + 1)), "\n".join(lines[-80:])
    return [losses[s] for s in range(1, steps + 1)]


def _assert_same_losses(fused: list[float], unfused: list[float]) -> None:
    for step, (a, b) in enumerate(zip(fused, unfused), start=1):
        assert math.isfinite(a) and abs(a - b) <= REL_TOL * abs(b), (step, fused, unfused)
    assert unfused[-1] < unfused[0], unfused  # it trains


FSDP2 = {"data_parallel_shard_degree": 2}


@pytest.fixture(scope="module")
def llama3_fsdp2_fused(tmp_path_factory, assets) -> list[float]:
    """The losses of llama3 FSDP2 with the fused converters (two tests compare with it)."""
    return _train(tmp_path_factory.mktemp("llama3_fsdp2"), assets, "fused", "llama3", FUSED, FSDP2)


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_llama3_fsdp2_converters_match_unfused(tmp_path, assets, llama3_fsdp2_fused):
    _assert_same_losses(llama3_fsdp2_fused, _train(tmp_path, assets, "unfused", "llama3", [], FSDP2))


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_llama3_fsdp2_swap_optimizer_matches_adamw(tmp_path, assets, llama3_fsdp2_fused):
    # torchtitan-npu's swap optimizer keeps AdamW's states on the host and updates them slice by slice on npu
    # streams (its custom config's [optimizer] swap_optimizer): the same AdamW math.
    swapped = _train(tmp_path, assets, "swap", "llama3", FUSED, FSDP2,
                     job_extra='custom_config_module = "torchtitan_npu.config.custom_config"',
                     optimizer_extra="swap_optimizer = true",
                     expect_log="Building SwapOptimizersContainer")  # its patch, not plain AdamW, ran
    _assert_same_losses(swapped, llama3_fsdp2_fused)


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_llama3_tp2_converters_match_unfused(tmp_path, assets):
    par = {"data_parallel_shard_degree": 1, "tensor_parallel_degree": 2}
    _assert_same_losses(_train(tmp_path, assets, "fused", "llama3", FUSED, par),
                        _train(tmp_path, assets, "unfused", "llama3", [], par))


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_deepseek_v3_moe_fsdp2_converters_match_unfused(tmp_path, assets):
    par = {"data_parallel_shard_degree": 2}
    _assert_same_losses(_train(tmp_path, assets, "fused", "deepseek_v3", FUSED, par),
                        _train(tmp_path, assets, "unfused", "deepseek_v3", [], par))


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_deepseek_v3_moe_converters_train_the_same_with_expert_parallel(tmp_path, assets):
    # npu_permute also replaces ExpertParallel's dispatch/combine (all-to-all, npu_moe_token_permute, and the
    # routing-map unpermute with its grad operator): expert parallel over the two ranks must not change a step.
    fsdp = _train(tmp_path, assets, "moe", "deepseek_v3", MOE, {"data_parallel_shard_degree": 2})
    ep = _train(tmp_path, assets, "moe_ep", "deepseek_v3", MOE,
                {"data_parallel_shard_degree": 2, "expert_parallel_degree": 2})
    _assert_same_losses(ep, fsdp)


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_torchtitan_npu_profiling_writes_an_npu_trace(tmp_path, assets):
    # torchtitan-npu's profiling patch (its custom config's [profiling] fields) drives torch_npu.profiler with
    # ProfilerActivity.NPU, an _ExperimentalConfig and tensorboard_trace_handler: steps 3-4 of rank 0.
    prof = "[profiling]\nenable_profiling = true\nprofile_step_start = 3\nprofile_step_end = 4\nprofile_ranks = [0]"
    _train(tmp_path, assets, "prof", "llama3", FUSED, {"data_parallel_shard_degree": 2}, steps=4,
           job_extra='custom_config_module = "torchtitan_npu.config.custom_config"', extra=prof)
    traces = list((tmp_path / "prof" / "out" / "profile_traces").glob("*.json"))
    assert len(traces) == 1, traces
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)            # device-side (npu) activity was recorded
    assert any("npu_rms_norm" in e.get("name", "") for e in events)  # the converter's operator ran in the window
