"""A hang, diagnosed with the flight recorder and the trace (docs/debugging.md, walk-through 2).

Rank 1 stalls before its last gradient all_reduce (as a rank stuck in a data loader or a host-side
loop would), long past the group timeout. The timeout turns the hang into an error on rank 0; both ranks
dump their flight recorder, and each rank exports the profiler trace of the failing step.

    mkdir -p /tmp/hang && TORCH_HCCL_DUMP_ON_TIMEOUT=1 TORCH_HCCL_DEBUG_INFO_TEMP_FILE=/tmp/hang/fr_ \\
        TORCH_HCCL_ASYNC_ERROR_HANDLING=0 npurun --nproc 2 examples/hang_stalled_rank.py --out /tmp/hang
    python -m npudist.hccl.trace /tmp/hang
    python -m torch.distributed.flight_recorder.fr_trace /tmp/hang     # PyTorch's analyzer reads the same dumps
"""
import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

import npudist  # noqa: F401  (npu device, hccl backend, npu profiler activity source)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/hang")
    p.add_argument("--timeout-s", type=float, default=5.0)
    args = p.parse_args()
    dist.init_process_group("hccl", timeout=timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    torch.npu.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).npu()
    x = torch.randn(32, 64, device="npu")

    def train_step(step: int) -> None:
        model(x).square().mean().backward()
        params = list(model.parameters())
        for i, prm in enumerate(params):
            if rank == 1 and step == 1 and i == len(params) - 1:
                with record_function("stalled_host_work"):  # the bug: this rank stalls here
                    time.sleep(2 * args.timeout_s)
            dist.all_reduce(prm.grad)
            prm.grad = None

    train_step(0)
    os.makedirs(args.out, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]) as prof:
        try:
            train_step(1)
        except dist.DistBackendError as e:
            print(f"rank {rank}: {str(e).splitlines()[0][:300]}", flush=True)
    prof.export_chrome_trace(os.path.join(args.out, f"trace_rank{rank}.json"))
    for r in prof.key_averages():
        if r.key.startswith("hccl:"):
            print(f"rank {rank}: {r.key} calls {r.count} device time {r.self_device_time_total / 1e3:.1f} ms",
                  flush=True)


if __name__ == "__main__":
    main()
