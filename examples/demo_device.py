"""A short tour of the emulated npu device: tensors, a few training steps, streams, RNG, save/load.

    .venv/bin/python examples/demo_device.py
"""
import copy
import io
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import npudist  # noqa: F401  (registers torch.npu)

# The tests' helper that enqueues host work on a stream through the runtime's C table (what the hccl backend
# does with collectives); npudist itself offers no such call.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from runtime_ext import launch_host_fill  # noqa: E402


def main() -> None:
    print(f"npu available: {torch.npu.is_available()}, devices: {torch.npu.device_count()}, "
          f"{torch.npu.get_device_name(0)} ({torch.npu.get_device_properties(0).total_memory >> 30} GiB)")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    results = {}
    for dev in ("cpu", "npu"):
        m = copy.deepcopy(model).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        for _ in range(10):
            loss = F.cross_entropy(m(x.to(dev)), y.to(dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
        results[dev] = (loss.item(), [p.detach().cpu() for p in m.parameters()])
    same = all(torch.equal(a, b) for a, b in zip(results["cpu"][1], results["npu"][1]))
    print(f"10 AdamW steps: cpu loss {results['cpu'][0]:.6f}, npu loss {results['npu'][0]:.6f}, "
          f"weights bitwise identical: {same}")

    side = torch.npu.Stream()
    buf = torch.zeros(4, device="npu")
    launch_host_fill(buf, 1.0, 100_000, side.stream_id)  # 100 ms of asynchronous work on `side`
    done = side.record_event()
    print(f"async work enqueued; event complete yet: {done.query()}")
    t0 = time.perf_counter()
    torch.npu.current_stream().wait_event(done)
    print(f"wait_event blocked {1e3 * (time.perf_counter() - t0):.0f} ms; buffer now {buf.tolist()}")

    torch.npu.manual_seed(42)
    a = torch.randn(3, device="npu")
    torch.npu.manual_seed(42)
    print(f"npu RNG reproducible: {torch.equal(a.cpu(), torch.randn(3, device='npu').cpu())}, "
          f"state (seed, offset) = {torch.npu.get_rng_state().view(torch.int64).tolist()}")

    f = io.BytesIO()
    torch.save(model.npu().state_dict(), f)
    f.seek(0)
    sd = torch.load(f, map_location="npu:1")
    print(f"saved on npu:0, loaded with map_location npu:1: {next(iter(sd.values())).device}")
    print(f"npu:0 memory allocated: {torch.npu.memory_allocated(0)} bytes")


if __name__ == "__main__":
    main()
