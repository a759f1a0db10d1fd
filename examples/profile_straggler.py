"""A slow step, found with torch.profiler on npu + hccl (docs/debugging.md, walk-through 1).

Every rank trains a small data-parallel model; rank `--slow-rank` does extra work before its gradient
all_reduce, as a rank with a slower input pipeline or a hot device would. Each rank profiles one step
and writes its Chrome trace (open it in https://ui.perfetto.dev) and a summary of npu device time.

    npurun --nproc 2 examples/profile_straggler.py --out /tmp/straggler
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

import npudist  # noqa: F401  (npu device, hccl backend, npu profiler activity source)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/straggler")
    p.add_argument("--slow-rank", type=int, default=1)
    args = p.parse_args()
    dist.init_process_group("hccl")
    rank = dist.get_rank()
    torch.npu.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).npu()
    x = torch.randn(256, 512, device="npu")

    def train_step():
        loss = model(x).square().mean()
        loss.backward()
        if rank == args.slow_rank:
            with record_function("extra_work"):  # the straggler: e.g. a slow data loader or augmentation
                y = torch.randn(1024, 1024, device="npu")
                for _ in range(20):
                    y = torch.tanh(y @ y)
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
            prm.grad = None

    train_step()  # warm-up
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]) as prof:
        train_step()
        torch.npu.synchronize()
    os.makedirs(args.out, exist_ok=True)
    prof.export_chrome_trace(os.path.join(args.out, f"rank{rank}.json"))
    rows = [r for r in prof.key_averages() if r.key.startswith(("hccl:", "npu:"))]
    rows.sort(key=lambda r: -r.self_device_time_total)
    lines = [f"rank {rank}: npu device time per kernel (us)"]
    lines += [f"  {r.key:32s} calls {r.count:3d}  total {r.self_device_time_total:10.0f}" for r in rows[:4]]
    print("\n".join(lines), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
