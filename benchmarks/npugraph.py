"""NPUGraph replay vs eager launch for a small-op model (target: replay >= 2x eager).

A tiny transformer-style block (d=32, 8 tokens: layer norm, attention-free MLP, residuals, softmax; dozens of
small aten ops) and its forward + backward, run eagerly on npu (Python dispatch + the fallback per op) and
as one NPUGraph replay (static input copied in first, as a training loop does). The two sides are interleaved
in rounds and the medians reported, so machine noise hits both alike. Both sides use --threads intra-op threads
(default 1: the ops are tiny, and on the shared 2-core machine BLAS/OpenMP thread wake-ups would otherwise dominate
and drown what is measured here, the launch path).

With --compile, also the same forward + backward step under torch.compile(backend="npugraphs") against
torch.compile(backend="aot_eager") (the same AOTAutograd graphs run op by op), and against eager.
With --npugraph-ex, torch.compile(backend="npugraph_ex") against eager, in the same rounds: the forward without
grad (one inference graph) and the forward + backward step, host time per step.

    PYTHONPATH=. .venv/bin/python benchmarks/npugraph.py [--rounds 7] [--iters 200] [--threads 1] [--compile]
        [--npugraph-ex]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import npudist  # noqa: F401  (registers the npu device)


class Block(torch.nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.gate = torch.nn.Linear(d, d)

    def forward(self, x):
        h = self.ln1(x)
        x = x + torch.softmax(self.gate(h), dim=-1) * h
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def _fwd_bwd(model, x):
    model(x).square().mean().backward()


def _time(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help='also time torch.compile(backend="npugraphs")')
    ap.add_argument("--npugraph-ex", action="store_true", help='also time torch.compile(backend="npugraph_ex")')
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Block().npu()
    x = torch.randn(8, 32, device="npu")
    static_x = x.clone()

    with torch.no_grad():
        g_fwd = torch.npu.NPUGraph()
        with torch.npu.graph(g_fwd):
            model(static_x)
    # forward + backward: grads into static .grad tensors (set by a warm-up step, accumulated in place).
    _fwd_bwd(model, x)
    g_train = torch.npu.NPUGraph()
    with torch.npu.graph(g_train):
        _fwd_bwd(model, static_x)

    def eager_fwd():
        with torch.no_grad():
            model(x)

    def replay_fwd():
        static_x.copy_(x)
        g_fwd.replay()

    def replay_train():
        static_x.copy_(x)
        g_train.replay()

    cases = {"forward": (eager_fwd, replay_fwd),
             "forward+backward": (lambda: _fwd_bwd(model, x), replay_train)}
    if args.compile:
        aot_eager = torch.compile(model, backend="aot_eager")
        npugraphs = torch.compile(model, backend="npugraphs")
        cases["compiled fwd+bwd"] = (lambda: _fwd_bwd(aot_eager, x), lambda: _fwd_bwd(npugraphs, x))
    if args.npugraph_ex:
        from npudist.compile import npugraph_ex

        npugraph_ex.register()  # where the installed package metadata predates its entry point
        ex = torch.compile(model, backend="npugraph_ex")

        def ex_fwd():
            with torch.no_grad():
                ex(x)

        cases["npugraph_ex forward"] = (eager_fwd, ex_fwd)
        cases["npugraph_ex fwd+bwd"] = (lambda: _fwd_bwd(model, x), lambda: _fwd_bwd(ex, x))
    for fns in cases.values():  # warm-up
        for fn in fns:
            _time(fn, 5)
    samples = {name: ([], []) for name in cases}
    for _ in range(args.rounds):
        for name, (eager, replay) in cases.items():
            samples[name][0].append(_time(eager, args.iters))
            samples[name][1].append(_time(replay, args.iters))
    print(f"NPUGraph replay vs eager launch (median of {args.rounds} rounds x {args.iters} iters, "
          f"load {os.getloadavg()[0]:.2f}, torch threads {torch.get_num_threads()})")
    print(f"  forward graph: {g_fwd.num_tasks()} tasks; forward+backward graph: {g_train.num_tasks()} tasks")
    for name, (eager, replay) in samples.items():
        e, r = statistics.median(eager), statistics.median(replay)
        if name == "compiled fwd+bwd":
            plain = statistics.median(samples["forward+backward"][0])
            print(f"  {name:18s} aot_eager {e:8.1f} us   npugraphs {r:8.1f} us   npugraphs speedup {e / r:5.2f}x "
                  f"over aot_eager, {plain / r:5.2f}x over eager")
        elif name.startswith("npugraph_ex"):
            print(f"  {name:18s} eager {e:8.1f} us   npugraph_ex {r:8.1f} us   npugraph_ex speedup {e / r:5.2f}x")
        else:
            print(f"  {name:18s} eager {e:8.1f} us   replay {r:8.1f} us   replay speedup {e / r:5.2f}x (target >= 2x)")


if __name__ == "__main__":
    main()
