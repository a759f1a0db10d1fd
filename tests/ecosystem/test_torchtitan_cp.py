"""torchtitan 0.2.2's own context parallelism on npu + hccl: the llama3 debug model with
``context_parallel_degree = 2`` on 2 ranks trains as with cp 1 on one rank.

torchtitan applies CP through PyTorch's ``_ContextParallel`` plan on its SDPA module (q, k, v become DTensors
sharded on the sequence) and PyTorch's ring attention over ``aten::_scaled_dot_product_flash_attention``, which
npu attention runs on DTensors (``npudist.device.attention``). Both runs are torchtitan's unmodified entry point
(``npurun -m torchtitan.train``) and start from one seed checkpoint (torchtitan's
``--checkpoint.create_seed_checkpoint``, as its numerics tests do), because a sharded model draws its initial
weights differently from an unsharded one. fp32, deterministic mode, 3 steps of an offline byte-level dataset;
the losses, printed with 5 decimals, must agree to 1e-5 relative.
"""
import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))
from launch_helpers import run_npurun  # noqa: E402
from titan_assets import write_titan_assets

pytest.importorskip("torchtitan", reason="torchtitan is not installed (requirements-test.txt pins it)")

RUN_TIMEOUT = 240   # s for one run; about 30 s each on the 2-core machine, most of it importing torchtitan
STEPS = 3
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"^\[rank0\]: .* step:\s+(\d+)\s+loss:\s+([-0-9.eE+naif]+)")
_WORDS = "the npu rank tensor shard ring key value query head sequence attention block token layer step".split()


def _job(root: Path, cp: int) -> Path:
    cfg = root / f"cp{cp}.toml"
    cfg.write_text(f"""\
[job]
dump_folder = "{root / 'out'}"
[metrics]
log_freq = 1
[model]
name = "llama3"
flavor = "debugmodel"
hf_assets_path = "{root / 'tokenizer'}"
[optimizer]
name = "AdamW"
lr = 8e-4
[lr_scheduler]
warmup_steps = 1
[training]
dataset = "c4_test"
dataset_path = "{root / 'data'}"
local_batch_size = 2
seq_len = 64
steps = {STEPS}
mixed_precision_param = "float32"
[parallelism]
data_parallel_shard_degree = 1
context_parallel_degree = {cp}
[checkpoint]
enable = true
folder = "checkpoint_cp{cp}"
[debug]
seed = 0
deterministic = true
""")
    return cfg


def _run(root: Path, nproc: int, cfg: Path, *extra: str) -> list[str]:
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(root / "hf")}
    res = run_npurun(["--nproc", str(nproc), "-m", "torchtitan.train", "--job.config_file", str(cfg), *extra],
                     root, env=env, timeout=RUN_TIMEOUT)
    lines = [_ANSI.sub("", ln) for ln in res.output.splitlines()]
    assert res.returncode == 0, "\n".join(lines[-80:])
    return lines


def _losses(lines: list[str]) -> list[float]:
    losses = {int(m.group(1)): float(m.group(2)) for ln in lines if (m := _STEP.match(ln))}
    assert sorted(losses) == list(range(1, STEPS + 1)), "\n".join(lines[-80:])
    return [losses[s] for s in range(1, STEPS + 1)]


@pytest.mark.timeout(3 * RUN_TIMEOUT + 60)
def test_llama3_cp2_matches_cp1(tmp_path):
    write_titan_assets(tmp_path, _WORDS, lines=100)
    _run(tmp_path, 1, _job(tmp_path, 1), "--checkpoint.create_seed_checkpoint", "--checkpoint.folder", "seed",
         "--training.steps", "1")
    seed = ("--checkpoint.initial_load_path", str(tmp_path / "out" / "seed" / "step-0"))
    cp2_lines = _run(tmp_path, 2, _job(tmp_path, 2), *seed)
    assert any("Applied Context Parallel to the model" in ln for ln in cp2_lines)
    cp2, cp1 = _losses(cp2_lines), _losses(_run(tmp_path, 1, _job(tmp_path, 1), *seed))
    for step, (a, b) in enumerate(zip(cp2, cp1), start=1):
        assert math.isfinite(a) and abs(a - b) <= 1e-5 * abs(b), (step, cp2, cp1)
    assert cp1[-1] < cp1[0], cp1   # it trains


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_llama3_cp2_gradients_match_one_device(tmp_path):
    """The model alone (no FSDP, no optimizer): every parameter gradient under torchtitan's CP equals the
    whole-sequence gradient to 1e-5 of its norm (the training run above compares losses only)."""
    script = Path(__file__).parent / "scripts" / "titan_cp_grads.py"
    res = run_npurun(["--nproc", "2", str(script)], tmp_path, timeout=RUN_TIMEOUT)
    assert res.returncode == 0 and "CP GRADS OK" in res.output, res.output[-6000:]
