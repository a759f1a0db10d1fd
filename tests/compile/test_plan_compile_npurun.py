"""Compiled training from a plan through npurun: FSDP x2, TP x2 and PP x2 match eager training step by step.

Each layout is one npurun job of 2 ranks (``_train_twice.py``): the plan trained eagerly, then with its
``compile`` section (every block and the loss through Inductor, fullgraph), in one process group. The losses
are global means over the step (fp32); they must agree within 1e-5 relative at every step. The FSDP and PP
layouts give the blocks and the loss the same shapes (micro-batches of 2 sequences), so they share compiled
graphs through the FX graph cache (one cache directory per test run, see conftest.py).
"""
import json
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "launch"))
from launch_helpers import finish, free_port, start_npurun  # noqa: E402

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("compile_dist")]

PLAN = """
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_hidden_dim: 64, max_seq_len: 32}
data: {seq_len: 32, global_batch_size: 4, micro_batch_size: 2}
optimizer: {lr: 3.0e-3}
schedule: {warmup_steps: 1}
training: {steps: 3, device: npu, max_grad_norm: 1.0}
logging: {log_every: 1, progress_bar: false}
compile: {enable: true, components: [model, loss]}
"""

LAYOUTS = {
    "fsdp2": ["--parallel.dp_shard_degree", "2"],
    # Built-in TP plan with sequence parallelism and vocab-sharded logits into the (compiled) loss: the blocks'
    # DTensor redistributions are functional collectives traced into the graphs and run on hccl.
    "tp2": ["--parallel.dp_shard_degree", "1", "--parallel.tp_degree", "2", "--parallel.tp.sequence_parallel",
            "true", "--parallel.tp.loss_parallel", "true"],
    "pp2": ["--parallel.dp_shard_degree", "1", "--parallel.pp_degree", "2", "--parallel.pp.schedule", "1F1B",
            "--parallel.pp.microbatches", "2", "--data.micro_batch_size", "4"],
}
RTOL = 1e-5


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_compiled_plan_matches_eager_through_npurun(layout, tmp_path, inductor_cache_dir):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    out = tmp_path / "losses.json"
    env = {"NPUDIST_DATA_CACHE": str(inductor_cache_dir.parent / "corpus"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.path.dirname(os.path.dirname(HERE)) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = start_npurun(["--nproc", "2", "--device", "npu", "--master-port", str(free_port()),
                         os.path.join(HERE, "_train_twice.py"), "--config", str(plan), "--out", str(out),
                         *LAYOUTS[layout]], tmp_path, env)
    res = finish(proc, timeout=840)
    assert res.returncode == 0, res.output[-4000:]
    # Both runs log; the compiled one says what it compiled and that Dynamo captured graphs.
    match = re.search(r"graph mode \(inductor, fullgraph\): (.*); (\d+) graph\(s\) captured", res.stdout)
    assert match, res.stdout[-3000:]
    assert "layers.0" in match.group(1) and "loss" in match.group(1) and int(match.group(2)) >= 1, match.group(0)
    losses = json.loads(out.read_text())
    eager, compiled = losses["eager"], losses["compiled"]
    assert len(eager) == len(compiled) == 3
    for step, (c, e) in enumerate(zip(compiled, eager), 1):
        assert abs(c - e) <= RTOL * abs(e), f"step {step}: compiled loss {c!r} vs eager {e!r}"
