"""examples/train.py end to end: log lines, JSON-lines metrics, falling loss, exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _train_spawn import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "examples", "train.py")
DEVICE = os.environ.get("NPUDIST_TEST_DEVICE", "npu")   # npu -> hccl; cpu -> gloo

TINY = """
model: {{dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_hidden_dim: 64, max_seq_len: 64}}
data: {{seq_len: 32, global_batch_size: 8, micro_batch_size: {micro}}}
optimizer: {{lr: {lr}}}
schedule: {{warmup_steps: 2}}
training: {{steps: {steps}, device: {device}, max_grad_norm: 1.0}}
logging: {{log_every: 1, metrics_path: {metrics}}}
"""


def _run(tmp_path, argv, nproc=1, timeout=150, script=TRAIN, env=None, **fmt):
    plan = tmp_path / "plan.yaml"
    fmt.setdefault("micro", 4)
    plan.write_text(TINY.format(device=DEVICE, metrics=tmp_path / "m.jsonl", **fmt))
    env = dict(os.environ, NPUDIST_DATA_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1", **(env or {}))
    if nproc == 1:
        cmd = [sys.executable, script, "--config", str(plan), *argv]
    else:
        cmd = [sys.executable, "-m", "npudist.launch", "--nproc", str(nproc), "--device", DEVICE,
               "--master-port", str(free_port()), script, "--config", str(plan), *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(tmp_path))


def _metrics(tmp_path):
    return [json.loads(line) for line in open(tmp_path / "m.jsonl")]


@pytest.mark.timeout(120)
def test_single_process_run_logs_and_learns(tmp_path):
    res = _run(tmp_path, [], steps=10, lr=1e-2)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if "step " in ln and "| loss" in ln]
    assert len(lines) == 10 and "step 10/10" in lines[-1] and "100%" in lines[-1]
    for key in ("tok/s", "mem(", "s/step", "elapsed"):
        assert key in lines[-1]
    assert f"metrics: {tmp_path / 'm.jsonl'} (one JSON line per step)" in res.stdout
    assert "peak" in lines[-1]
    recs = _metrics(tmp_path)
    assert [r["step"] for r in recs] == list(range(1, 11))
    assert all(r["memory_peak_bytes"] >= r["memory_bytes"] > 0 for r in recs)
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "memory_bytes", "step_time_s"} <= set(recs[0])
    assert recs[-1]["tokens"] == 10 * 8 * 32 and recs[0]["tokens_per_s"] > 0
    assert recs[-1]["loss"] < recs[0]["loss"] - 0.3


@pytest.mark.timeout(120)
def test_nan_loss_exits_nonzero_with_message(tmp_path):
    res = _run(tmp_path, ["--training.max_grad_norm", "null"], steps=8, lr=1e30)
    assert res.returncode == 3, (res.returncode, res.stderr[-3000:])
    assert "training diverged" in res.stderr and "nan" in res.stderr.lower()
    assert len(_metrics(tmp_path)) < 8


@pytest.mark.timeout(60)
def test_invalid_plan_exits_2(tmp_path):
    res = _run(tmp_path, ["--parallel.tp_degre", "2"], steps=2, lr=1e-3)
    assert res.returncode == 2 and "tp_degree" in res.stderr, res.stderr[-2000:]


@pytest.mark.timeout(60)
def test_invalid_plan_under_npurun_is_reported_once_before_any_rank_starts(tmp_path):
    res = _run(tmp_path, ["--parallel.tp_degree", "3", "--parallel.dp_shard_degree", "2"], nproc=4, steps=2, lr=1e-3)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])   # train.py's documented code
    assert res.stderr.count("invalid plan") == 1 and "for 4 ranks" in res.stderr, res.stderr
    assert "does not divide 4" in res.stderr and "to -1" not in res.stderr
    assert "[rank" not in res.stdout + res.stderr and "start attempt" not in res.stderr   # no rank started


@pytest.mark.timeout(150)
def test_two_rank_pipeline_run(tmp_path):
    """The trainer's multi-rank path under npurun: loss reported from the last pipeline stage, shared
    corpus cache; with log_every 4 the console still shows step 1 (training has started) and the last."""
    res = _run(tmp_path, ["--parallel.pp_degree", "2", "--parallel.dp_shard_degree", "1",
                          "--parallel.pp.schedule", "1F1B", "--parallel.pp.microbatches", "2",
                          "--logging.log_every", "4"],
               nproc=2, steps=6, lr=3e-3, micro=4)
    assert res.returncode == 0, res.stderr[-3000:]
    recs = _metrics(tmp_path)
    assert len(recs) == 6 and recs[-1]["loss"] < recs[0]["loss"]
    assert "pp=2" in res.stdout
    shown = [ln.split("step ")[1].split(" ")[0] for ln in res.stdout.splitlines() if "| loss" in ln]
    assert shown == ["1/6", "4/6", "6/6"], res.stdout[-2000:]
    assert f"metrics: {tmp_path / 'm.jsonl'}" in res.stdout


@pytest.mark.timeout(240)
def test_moe_with_context_and_expert_parallel_under_npurun(tmp_path):
    """The moe model with cp 2 (Ulysses) and ep 2 on the same 2 ranks: it learns, and every step logs the
    routed token slots per expert (8 sequences x 32 tokens x top-2 x 1 MoE block per step, all ranks)."""
    res = _run(tmp_path, ["--model.name", "moe", "--model.n_experts", "4", "--model.moe_hidden_dim", "32",
                          "--parallel.cp_degree", "2", "--parallel.cp.method", "ulysses",
                          "--parallel.ep_degree", "2", "--parallel.dp_shard_degree", "1"],
               nproc=2, timeout=220, steps=10, lr=1e-2)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "experts min/max" in res.stdout
    recs = _metrics(tmp_path)
    assert len(recs) == 10 and all(sum(r["expert_load"]) == 8 * 32 * 2 for r in recs)
    assert recs[-1]["loss"] < recs[0]["loss"] - 0.3


@pytest.mark.timeout(60)
def test_cp_and_ep_plan_errors_before_any_rank_starts(tmp_path):
    res = _run(tmp_path, ["--parallel.cp_degree", "2", "--data.seq_len", "30", "--parallel.ep_degree", "2"],
               nproc=2, steps=2, lr=1e-3)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert res.stderr.count("invalid plan") == 1 and "2 errors" in res.stderr, res.stderr
    assert "data.seq_len: 30 is not divisible by 2 x parallel.cp_degree = 4" in res.stderr
    assert "parallel.ep_degree: the llama model has no experts" in res.stderr
