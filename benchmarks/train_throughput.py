#!/usr/bin/env python
"""Training throughput (tokens/s) of the same model on npu+hccl vs cpu+gloo, FSDP x 2, TP x 2 and PP x 2.

    python benchmarks/train_throughput.py                 # spawns 2 ranks itself (torch.distributed.run)
    python benchmarks/train_throughput.py --dim 384 --layers 4 --seq-len 128 --batch 8   # compute-bound shape
    python benchmarks/train_throughput.py --compiled      # + graph mode (plan compile section) on both devices
    python benchmarks/train_throughput.py --launch-modes  # 1 rank on npu: asynchronous vs blocking launch
    python benchmarks/train_throughput.py --comm-share    # + the share of a cpu+gloo step spent in Gloo

The default shape (wide and short: 27M parameters, 256 tokens per step) makes the collectives a visible part
of the step, which is what the comparison is about; a compute-bound shape shows ~1.0x by construction.

One run, one process group with two backends (``npu:hccl,cpu:gloo``): every rank builds the same model
six times -- {npu, cpu} x {FSDP, TP, PP (1F1B, 2 microbatches) over 2 ranks} -- from the same seed, then runs
``--rounds`` rounds; in each round every variant trains ``--steps`` optimizer steps (after warm-up), in
alternating order, so machine noise hits all variants alike. Reported: median tokens/s per variant and the
npu/cpu ratio per layout (> 1 means hccl on npu is faster). Compute kernels are the same CPU kernels on
both devices (the npu runs them zero-copy), so the ratio isolates collectives and device overhead.

``--compiled`` adds a compiled twin of every variant (the plan's ``compile`` section: each block and the loss
through Inductor, fullgraph) and reports npu+hccl compiled against cpu+gloo compiled and cpu+gloo eager.
Compilation happens in the warm-up steps (not timed).

``--launch-modes`` instead trains the model on one npu rank (no parallelism) in two processes, one with
asynchronous launch (the default) and one with ``ASCEND_LAUNCH_BLOCKING=1``, driven in alternating rounds,
and reports async / blocking tokens/s plus the share of ops that were queued (docs/device.md).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per variant per round")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per variant before round 1")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4, help="global batch (sequences per step)")
    ap.add_argument("--devices", default="npu:hccl,cpu:gloo",
                    help="the two device:backend pairs to compare (first / second)")
    ap.add_argument("--layouts", default="fsdp,tp,pp", help="comma-separated subset of fsdp,tp,pp (2 ranks each)")
    ap.add_argument("--comm-share", action="store_true",
                    help="also profile one step of each cpu+gloo variant and report the share of it spent in Gloo "
                         "collectives, and the npu/cpu ratio that share allows at most")
    ap.add_argument("--compiled", action="store_true", help="also run every variant compiled (graph mode)")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    ap.add_argument("--launch-modes", action="store_true",
                    help="1 npu rank: asynchronous launch vs ASCEND_LAUNCH_BLOCKING=1")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--launch-worker", type=int, default=0, help=argparse.SUPPRESS)  # its TCP port
    return ap.parse_args(argv)


def _plan(args, device: str, backend: str, layout: str, corpus: str, compiled: bool = False):
    from npudist.plan import (CompileConfig, DataConfig, ModelConfig, OptimizerConfig, ParallelConfig, Plan,
                              ScheduleConfig, TPConfig, TrainingConfig)
    dp = 2 if layout == "fsdp" else 1
    tp = 2 if layout == "tp" else 1
    pp = 2 if layout == "pp" else 1  # 1F1B over 2 stages, 2 microbatches per step (the plan's defaults)
    return Plan(
        model=ModelConfig(vocab_size=256, dim=args.dim, n_layers=args.layers, n_heads=8, n_kv_heads=4,
                          ffn_hidden_dim=args.dim * 8 // 3 // 64 * 64, max_seq_len=args.seq_len),
        data=DataConfig(path=corpus, seq_len=args.seq_len, global_batch_size=args.batch,
                        micro_batch_size=args.batch // dp),
        optimizer=OptimizerConfig(lr=1e-3),
        schedule=ScheduleConfig(warmup_steps=0, decay="constant"),
        training=TrainingConfig(steps=10**6, seed=0, max_grad_norm=1.0, device=device, backend=backend),
        parallel=ParallelConfig(dp_shard_degree=dp, tp_degree=tp, pp_degree=pp,
                                tp=TPConfig(sequence_parallel=tp > 1)),
        compile=CompileConfig(enable=compiled),
    )


class _Variant:
    def __init__(self, args, device, backend, layout, corpus, compiled=False):
        import torch
        from npudist.data import TextDataset
        from npudist.mesh import build_mesh, dim_rank, dim_size
        from npudist.models import build_model
        from npudist.parallelize import parallelize
        from npudist.train.optim import build_lr_scheduler, build_optimizer

        self.name = f"{device}+{backend}" + (" compiled" if compiled else "")
        self.layout, self.device = layout, device
        self.plan = _plan(args, device, backend, layout, corpus, compiled)
        mesh = build_mesh(self.plan.parallel, device_type=device)
        torch.manual_seed(0)
        self.pm = parallelize(build_model(self.plan.model), self.plan, mesh)
        self.opt = build_optimizer(list(self.pm.named_parameters()), self.plan.optimizer)
        self.sched = build_lr_scheduler(self.opt, self.plan.schedule, self.plan.training.steps)
        self.data = TextDataset(corpus, args.seq_len, self.plan.data.micro_batch_size,
                                dp_rank=dim_rank(mesh, "dp"), dp_degree=dim_size(mesh, "dp"))
        self.tokens_per_step = args.batch * args.seq_len
        self.rates: list[float] = []
        self.losses: list[float] = []

    def run(self, steps: int, record: bool) -> None:
        import torch.distributed as dist
        from npudist.train.step import train_step
        for _ in range(steps):
            batch = [self.data.next_batch()]
            dist.barrier()    # every rank starts the step together: time the step, not the stragglers
            t0 = time.perf_counter()
            loss, _ = train_step(self.pm, self.opt, self.sched, batch, self.plan.training.max_grad_norm)
            dt = time.perf_counter() - t0
            if record:
                self.rates.append(self.tokens_per_step / dt)
                self.losses.append(loss)


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    devs = [pair.split(":") for pair in args.devices.split(",")]
    if any(d == "npu" for d, _ in devs):
        import npudist  # noqa: F401  (npu device + hccl backend)
        torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
    backends = ",".join(sorted({f"{d}:{b}" for d, b in devs}))
    dist.init_process_group(backends)
    rank = dist.get_rank()
    from npudist.data import default_corpus_path
    if rank == 0:
        default_corpus_path()
    dist.barrier()
    corpus = default_corpus_path()
    modes = (False, True) if args.compiled else (False,)
    variants = [_Variant(args, d, b, layout, corpus, c) for layout in args.layouts.split(",") for c in modes
                for d, b in devs]
    for v in variants:
        v.run(args.warmup, record=False)
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            v.run(args.steps, record=True)
    if rank == 0:
        _report(args, variants)
    shares = {v.layout: _comm_share(v) for v in variants if v.device == "cpu"} if args.comm_share else {}
    if rank == 0:
        for layout, (comm_s, step_s) in shares.items():
            share = comm_s / step_s
            print(f"{layout}: cpu+gloo step {step_s * 1e3:.0f} ms, {comm_s * 1e3:.0f} ms of it in Gloo collectives "
                  f"({share:.0%}): npu+hccl / cpu+gloo <= {1 / max(1e-9, 1 - share):.2f}x with free collectives")
    dist.barrier()
    dist.destroy_process_group()


def _comm_share(v) -> tuple[float, float]:
    """(seconds in Gloo collectives, seconds of the step) for one profiled step of a cpu+gloo variant.

    Why: the compute kernels are the same CPU kernels on both devices, so the collectives are all npu+hccl can
    save; this bounds the ratio the comparison can show for the shape. torch.profiler's ``gloo:*`` events span
    a collective from issue to completion (the step's own barrier before timing is excluded)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        v.run(1, record=True)
    step_s = v.tokens_per_step / v.rates.pop()
    v.losses.pop()
    comm_us = sum(e.cpu_time_total for e in prof.key_averages()
                  if e.key.startswith("gloo:") and "barrier" not in e.key)
    return comm_us / 1e6, step_s


def launch_worker(args) -> None:
    """One npu rank in the launch mode its environment chose; one line of JSON per round read from stdin."""
    import torch
    import torch.distributed as dist
    import npudist  # noqa: F401
    from npudist.data import default_corpus_path
    from npudist.device import kernel_queue
    torch.npu.set_device(0)
    dist.init_process_group("npu:hccl,cpu:gloo", init_method=f"tcp://127.0.0.1:{args.launch_worker}",
                            rank=0, world_size=1)
    v = _Variant(args, "npu", "hccl", "single", default_corpus_path())
    v.run(args.warmup, record=False)
    for _ in sys.stdin:
        v.rates.clear()
        kernel_queue.reset_launch_counts()
        v.run(args.steps, record=True)
        print(json.dumps({"rate": statistics.median(v.rates), "loss": v.losses[-1], "counts": kernel_queue.launch_counts(),
                          "blocking": kernel_queue.is_blocking()}), flush=True)
    dist.destroy_process_group()


def compare_launch_modes(args, argv) -> int:
    import socket
    from npudist.data import default_corpus_path
    default_corpus_path()  # build the corpus once, before both workers read it
    argv = [a for a in argv if a != "--launch-modes"]
    workers = {}
    for mode, blocking in (("async", "0"), ("blocking", "1")):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, ASCEND_LAUNCH_BLOCKING=blocking, NPUDIST_LAUNCH_BLOCKING=blocking,
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        workers[mode] = ([sys.executable, os.path.abspath(__file__), "--launch-worker", str(port), *argv], env)
    sys.path.insert(0, HERE)
    from _alternate import alternate
    rounds = alternate(workers, args.rounds)
    print(f"\nLaunch modes, 1 npu rank, model dim {args.dim} x {args.layers} layers, seq {args.seq_len}, batch "
          f"{args.batch}; {args.rounds} alternating rounds x {args.steps} steps (median tokens/s); "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}, load average {os.getloadavg()[0]:.2f}")
    med = {}
    for mode, rs in rounds.items():
        med[mode] = statistics.median(x["rate"] for x in rs)
        c = rs[-1]["counts"]
        total = max(1, c["queued"] + c["synchronous"] + c["inline"])
        print(f"  {mode:<9}{med[mode]:>12,.0f} tokens/s   final loss {rs[-1]['loss']:.4f}   ops queued "
              f"{c['queued']}, inline {c['inline']}, synchronous {c['synchronous']} "
              f"({100 * c['queued'] / total:.0f}% queued), metadata {c['metadata']}")
    print(f"async / blocking = {med['async'] / med['blocking']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "tokens_per_s": med, "rounds": rounds}, f, indent=1)
    return 0


def _report(args, variants) -> None:
    results = {}
    print(f"\nTraining throughput, 2 ranks, model dim {args.dim} x {args.layers} layers, seq {args.seq_len}, "
          f"global batch {args.batch}; {args.rounds} interleaved rounds x {args.steps} steps (median tokens/s)")
    print(f"{'layout':<8}{'variant':<23}{'tokens/s':>12}{'min':>10}{'max':>10}{'final loss':>12}")
    for v in variants:
        med = statistics.median(v.rates)
        results.setdefault(v.layout, {})[v.name] = med
        print(f"{v.layout:<8}{v.name:<23}{med:>12,.0f}{min(v.rates):>10,.0f}{max(v.rates):>10,.0f}"
              f"{v.losses[-1]:>12.4f}")
    first, second = [f"{d}+{b}" for d, b in (p.split(":") for p in args.devices.split(","))]
    pairs = [(first, second)]
    if args.compiled:
        pairs += [(f"{first} compiled", f"{second} compiled"), (f"{first} compiled", second),
                  (f"{first} compiled", first)]
    ratios = {}
    for layout, r in results.items():
        for a, b in pairs:
            ratios[f"{layout}: {a} / {b}"] = r[a] / r[b]
    for name, ratio in ratios.items():
        print(f"{name} = {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "tokens_per_s": results, "ratio": ratios}, f, indent=1)


def main(argv=None) -> int:
    args = _args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.launch_worker:
        launch_worker(args)
        return 0
    if args.launch_modes:
        return compare_launch_modes(args, argv if argv is not None else sys.argv[1:])
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
           os.path.abspath(__file__), "--worker", *(argv if argv is not None else sys.argv[1:])]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    return subprocess.run(cmd, env=env, timeout=3600).returncode


if __name__ == "__main__":
    sys.exit(main())
