"""Benchmark of the npu caching allocator against caching disabled (PYTORCH_NO_NPU_MEMORY_CACHING=1).

One run starts one long-lived worker process per allocator configuration (the allocator mode is fixed
per process) and interleaves the workers round by round, so both sides see the same machine load;
medians over rounds are reported with ratios against the no-caching baseline.

  1. throughput: allocation + free of npu tensors (torch.empty + del), per size, allocations/second;
  2. a transformer training step's allocation pattern replayed (forward activations saved for backward,
     temporaries, backward gradients, Adam states; sequence length changes every step, as with dynamic
     batches; each new tensor gets one write per page like a kernel output): step time, and peak
     reserved / peak allocated (fragmentation overhead), with and without expandable segments.

Usage: python benchmarks/allocator.py [--rounds 5] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MiB = 1 << 20
MODES = {
    "no_caching": {"PYTORCH_NO_NPU_MEMORY_CACHING": "1"},
    "caching": {},
    "caching+expandable": {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"},
}
SIZES = [("4 KiB", 4096), ("256 KiB", 256 * 1024), ("4 MiB", 4 * MiB), ("64 MiB", 64 * MiB)]
SEQ_LENS = [128, 256, 192, 320, 256, 384, 160, 288]


# ---- worker side ----------------------------------------------------------------------------------

def _throughput(size: int, iters: int) -> float:
    import torch

    t0 = time.perf_counter()
    for _ in range(iters):
        x = torch.empty(size, dtype=torch.uint8, device="npu")
        del x
    return iters / (time.perf_counter() - t0)


class _Model:
    """Shapes of a small llama-like model (fp32): 6 layers, d=512, 8 heads, ffn 2048, vocab 8192."""
    layers, d, heads, ffn, vocab, batch = 6, 512, 8, 2048, 8192, 8

    def param_shapes(self):
        shapes = [(self.vocab, self.d)]
        for _ in range(self.layers):
            shapes += [(self.d, self.d)] * 4 + [(self.d, self.ffn), (self.ffn, self.d), (self.d,), (self.d,)]
        return shapes + [(self.d,), (self.d, self.vocab)]


def _train_steps(steps: int, touch: bool) -> dict:
    """Replays `steps` training steps; returns time per step and memory figures."""
    import torch

    m = _Model()

    def new(*shape):
        t = torch.empty(shape, dtype=torch.float32, device="npu")
        if touch and t.numel() >= 1024:
            # One write per 4 KiB page, as a kernel writing its output would: fresh device memory
            # (a new mapping) pays the first-touch page faults here, reused cached memory does not.
            t.view(-1)[::1024].fill_(0.0)
        return t

    params = [new(*s) for s in m.param_shapes()]
    grads, adam = None, None
    t0 = time.perf_counter()
    for step in range(steps):
        b, s, d = m.batch, SEQ_LENS[step % len(SEQ_LENS)], m.d
        saved = []
        x = new(b, s, d)
        for _ in range(m.layers):
            ln1 = new(b, s, d)
            q, k, v = new(b, s, d), new(b, s, d), new(b, s, d)
            scores = new(b, m.heads, s, s)
            probs = new(b, m.heads, s, s)
            del scores  # pre-softmax temporary
            attn = new(b, s, d)
            out = new(b, s, d)
            x = new(b, s, d)  # residual
            ln2 = new(b, s, d)
            h1, h3 = new(b, s, m.ffn), new(b, s, m.ffn)
            act = new(b, s, m.ffn)
            mlp = new(b, s, d)
            x = new(b, s, d)
            saved.append([ln1, q, k, v, probs, attn, out, ln2, h1, h3, act, mlp])
        logits = new(b, s, m.vocab)
        loss_tmp = new(b, s, m.vocab)  # log-softmax
        del loss_tmp
        gx = new(b, s, m.vocab)  # d loss / d logits
        del logits
        if grads is None:
            grads = [new(*p.shape) for p in params]
        g = new(b, s, d)
        del gx
        while saved:  # backward: free saved activations layer by layer in reverse
            acts = saved.pop()
            for a in reversed(acts):
                ga = new(*a.shape)
                del ga
            g = new(b, s, d)
            del acts
        del g, x
        if adam is None:
            adam = [(new(*p.shape), new(*p.shape)) for p in params]
        for p in params:  # optimizer temporaries
            upd = new(*p.shape)
            denom = new(*p.shape)
            del upd, denom
    elapsed = time.perf_counter() - t0
    st = torch.npu.memory_stats()
    out = {
        "step_ms": 1e3 * elapsed / steps,
        "peak_allocated": st["allocated_bytes.all.peak"],
        "peak_reserved": st["reserved_bytes.all.peak"],
        "device_allocs": st["num_device_alloc"],
        "segments_peak": st["segment.all.peak"],
    }
    del params, grads, adam
    torch.npu.empty_cache()
    torch.npu.reset_peak_memory_stats()
    torch.npu.reset_accumulated_memory_stats()
    return out


def _worker() -> None:
    import torch

    import npudist  # noqa: F401

    torch.empty(1, device="npu")  # initialise the device and allocator outside the timings
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["bench"] == "throughput":
            res = _throughput(cmd["size"], cmd["iters"])
        else:
            res = _train_steps(cmd["steps"], cmd["touch"])
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()


# ---- driver side ----------------------------------------------------------------------------------

class _Worker:
    def __init__(self, env_extra: dict):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_NPU_ALLOC_CONF", "PYTORCH_NO_NPU_MEMORY_CACHING")}
        env.update(env_extra)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark worker exited with code {self.proc.wait(timeout=10)}")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    ap.add_argument("--no-touch", action="store_true",
                    help="replay without writing to new tensors (allocator bookkeeping only)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return _worker()
    workers = {name: _Worker(env) for name, env in MODES.items()}
    iters = 300 if args.quick else 3000
    steps = 3 if args.quick else 16
    tput = {(n, s): [] for n in MODES for s, _ in SIZES}
    train = {n: [] for n in MODES}
    try:
        for r in range(args.rounds):
            order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
            for label, size in SIZES:
                for n in order:
                    tput[(n, label)].append(workers[n].run(bench="throughput", size=size, iters=iters))
            for n in order:
                train[n].append(workers[n].run(bench="train", steps=steps, touch=not args.no_touch))
    finally:
        for w in workers.values():
            w.close()

    print(f"npu allocator benchmark: {args.rounds} interleaved rounds, medians; baseline = no_caching\n")
    print("allocation+free throughput (torch.empty + del), allocations/s")
    print(f"{'size':>8} | " + " | ".join(f"{n:>20}" for n in MODES) + " | caching/no_caching")
    for label, _ in SIZES:
        med = {n: statistics.median(tput[(n, label)]) for n in MODES}
        print(f"{label:>8} | " + " | ".join(f"{med[n]:>20,.0f}" for n in MODES)
              + f" | {med['caching'] / med['no_caching']:.2f}x")
    print(f"\ntransformer training step replay ({_Model.layers} layers, d={_Model.d}, batch {_Model.batch}, "
          f"seq len cycling {SEQ_LENS}, {steps} steps per round, "
          f"{'no writes' if args.no_touch else 'one write per 4 KiB page of each new tensor'})")
    print(f"{'mode':>20} | step ms | speedup | peak alloc MiB | peak reserved MiB | reserved/allocated | device allocs/round")
    base = statistics.median(x["step_ms"] for x in train["no_caching"])
    for n in MODES:
        rs = train[n]
        ms = statistics.median(x["step_ms"] for x in rs)
        pa = statistics.median(x["peak_allocated"] for x in rs)
        pr = statistics.median(x["peak_reserved"] for x in rs)
        da = statistics.median(x["device_allocs"] for x in rs)
        print(f"{n:>20} | {ms:7.2f} | {base / ms:6.2f}x | {pa / MiB:14.0f} | {pr / MiB:17.0f} | "
              f"{pr / pa:18.3f} | {da:10.0f}")


if __name__ == "__main__":
    main()
