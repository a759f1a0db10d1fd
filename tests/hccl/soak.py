"""Seeded randomized soak of the hccl backend.

Every rank draws the same random program from (seed, op index): which collective or p2p pattern, which group
(the world or a subgroup created mid-run, overlapping others), dtype, reduce op, root, split sizes, device
(cpu or npu) and size. Sizes straddle every protocol threshold of the engine (set in
npudist/hccl/engine/shm_engine_impl.cpp): one-shot reductions up to 64 KiB, 256 KiB pipeline chunks and the
zero-copy threshold, direct reads from 512 KiB (pairs), the p2p ring's 512 KiB chunks, streaming stores from
4 MiB and the direct limit of 32 MiB (broadcast's, 128 MiB, is beyond the soak's buffers).

Inputs are closed forms of (seed, op index, rank, element index) with small integer values, so every rank
computes every other rank's input and therefore the exact expected output of each op. A wrong value, an
error (a false "mismatched collectives" included) or a hang fails the run; the failing seed and op index are
printed with the command that replays them.
"""
from __future__ import annotations

import random
import time

import torch
import torch.distributed as dist

from common import RANK, WS, R, close, ops_for, reference

KIB = 1024
# Bytes at which the engine changes protocol (see the module docstring).
THRESHOLDS = [64 * KIB, 256 * KIB, 512 * KIB, 1024 * KIB, 4096 * KIB, 32768 * KIB]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64]
MAX_SUBGROUPS = 4


def fill(key: int, rank: int, n: int, dtype: torch.dtype, product: bool = False) -> torch.Tensor:
    """The input of `rank` for the op with `key`: small integers, exact in every dtype even after a sum or
    product over 4 ranks (products use {1, 2}); a closed form, so any rank can compute any rank's input."""
    i = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        return (i * 3 + rank + key) % 3 == 0
    if product:
        v = 1 + (i * 3 + rank + key) % 2
    else:
        v = (i * 5 + rank * 7 + key) % 9 - (0 if dtype == torch.uint8 else 4)
    return v.to(dtype)


class Soak:
    """One rank's view of the random program for `seed`; `run` executes ops [0, n_ops)."""

    def __init__(self, seed: int, max_bytes: int):
        self.seed = seed
        self.max_bytes = max_bytes
        self.groups = [(None, list(range(WS)))]  # (group, global ranks); index 0 is the world
        self.executed = 0
        self.counts: dict[str, int] = {}

    # -------------------------------------------------------------------------------------------
    # Random choices: they depend only on (seed, op index), never on the rank.

    def elems(self, rng: random.Random, es: int, scale: int = 1) -> int:
        """An element count whose largest buffer (count * es * scale bytes) is tiny or near a threshold."""
        if rng.random() < 0.55:
            return rng.choice([1, 2, 3, rng.randint(1, 64), rng.randint(1, 4096)])
        limits = [t for t in THRESHOLDS if t <= self.max_bytes] or [THRESHOLDS[0]]
        t = rng.choice(limits)
        b = rng.choice([t - es * scale, t, t + es * scale, rng.randint(t // 2, min(2 * t, self.max_bytes))])
        return max(1, b // (es * scale))

    def pick_group(self, rng: random.Random):
        if len(self.groups) < 1 + MAX_SUBGROUPS and WS > 2 and rng.random() < 0.02:
            # Every rank creates it (torch requires it), members or not; it may overlap any other.
            ranks = sorted(rng.sample(range(WS), rng.randint(2, WS)))
            self.groups.append((dist.new_group(ranks), ranks))
        return self.groups[rng.randrange(len(self.groups))]

    # -------------------------------------------------------------------------------------------

    def run(self, n_ops: int) -> None:
        ops = [(self.all_reduce, 3), (self.async_all_reduces, 2), (self.all_gather, 2), (self.reduce_scatter, 2),
               (self.broadcast, 1.5), (self.reduce, 1), (self.gather_scatter, 1), (self.all_to_all_single, 3),
               (self.all_to_all, 1), (self.p2p_ring, 1.5), (self.coalesced, 1), (self.barrier, 0.5)]
        fns, weights = zip(*ops)
        for index in range(n_ops):
            rng = random.Random(self.seed * 1_000_003 + index)
            group, ranks = self.pick_group(rng)
            fn = rng.choices(fns, weights)[0]
            # Bursts of the same collective with independent sizes back to back: a rank that finished call
            # N posts call N+1 while its peers still work on N (where protocol bugs between paths hide).
            reps = rng.choice([1, 1, 2, 3, 5])
            if RANK not in ranks:
                continue
            for rep in range(reps):
                sub = random.Random(rng.random())
                dev = sub.choice(["cpu", "npu"])
                what = f"{fn.__name__} on {dev}, group {ranks}"
                try:
                    what = fn(sub, index * 64 + rep * 8, group, ranks, dev) or what
                except BaseException as e:
                    print(f"SOAK FAILURE seed={self.seed} op={index} (repetition {rep}) rank={RANK} world={WS}: "
                          f"{what}: {type(e).__name__}: {str(e)[:2000]}\n  replay: python "
                          f"benchmarks/hccl_soak.py --world-size {WS} --seed {self.seed} --ops {index + 1} "
                          f"--max-kib {self.max_bytes // KIB}", flush=True)
                    raise
                self.executed += 1
                self.counts[fn.__name__] = self.counts.get(fn.__name__, 0) + 1

    # -------------------------------------------------------------------------------------------
    # Ops. Each returns a description of what it did (for failure messages).

    def reduction(self, rng, key, ranks, dev, scale=1):
        """(dtype, op, inputs of every group member, expected) for a random valid reduction."""
        dtype = rng.choice(DTYPES)
        op = rng.choice(ops_for(dtype))
        n = self.elems(rng, dtype.itemsize, scale) * scale
        xs = [fill(key, r, n, dtype, product=op == R.PRODUCT) for r in ranks]
        if op == "PREMUL":
            want = reference(xs, R.SUM, scale=0.5)
            op = dist._make_nccl_premul_sum(0.5)
        else:
            want = reference(xs, op)
        return dtype, op, xs, want

    def all_reduce(self, rng, key, group, ranks, dev):
        dtype, op, xs, want = self.reduction(rng, key, ranks, dev)
        t = xs[ranks.index(RANK)].to(dev)
        dist.all_reduce(t, op=op, group=group)
        what = f"all_reduce {dtype} {op} n={t.numel()} on {dev}, group {ranks}"
        close(t, want, what)
        return what

    def async_all_reduces(self, rng, key, group, ranks, dev):
        """2-4 async all_reduces (and a broadcast) in flight, waited in a random order."""
        me = ranks.index(RANK)
        items, works = [], []
        for k in range(rng.randint(2, 4)):
            dtype, op, xs, want = self.reduction(rng, key * 8 + k, ranks, dev)
            t = xs[me].to(dev)
            works.append(dist.all_reduce(t, op=op, group=group, async_op=True))
            items.append((t, want, f"async all_reduce #{k} {dtype} {op} n={t.numel()}"))
        b = fill(key, ranks[-1], self.elems(rng, 4), torch.float32)
        t = (b if RANK == ranks[-1] else torch.zeros_like(b)).to(dev)
        works.append(dist.broadcast(t, src=ranks[-1], group=group, async_op=True))
        items.append((t, b, f"async broadcast n={b.numel()}"))
        order = list(range(len(works)))
        rng.shuffle(order)
        for k in order:
            works[k].wait()
        for t, want, what in items:
            close(t, want, f"{what} on {dev}, group {ranks}")
        return f"{len(works)} async ops waited in order {order} on {dev}, group {ranks}"

    def all_gather(self, rng, key, group, ranks, dev):
        dtype = rng.choice(DTYPES)
        n = self.elems(rng, dtype.itemsize, len(ranks))
        xs = [fill(key, r, n, dtype) for r in ranks]
        mine = xs[ranks.index(RANK)].to(dev)
        if rng.random() < 0.5:
            out = torch.empty(n * len(ranks), dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, mine, group=group)
            what = f"all_gather_into_tensor {dtype} n={n} on {dev}, group {ranks}"
            close(out, torch.cat(xs), what)
        else:
            outs = [torch.empty(n, dtype=dtype, device=dev) for _ in ranks]
            dist.all_gather(outs, mine, group=group)
            what = f"all_gather {dtype} n={n} on {dev}, group {ranks}"
            close(torch.cat(outs), torch.cat(xs), what)
        return what

    def reduce_scatter(self, rng, key, group, ranks, dev):
        ws = len(ranks)
        me = ranks.index(RANK)
        dtype, op, xs, want = self.reduction(rng, key, ranks, dev, scale=ws)
        n = xs[0].numel() // ws
        out = torch.empty(n, dtype=dtype, device=dev)
        if rng.random() < 0.5:
            dist.reduce_scatter_tensor(out, xs[me].to(dev), op=op, group=group)
            name = "reduce_scatter_tensor"
        else:
            dist.reduce_scatter(out, list(xs[me].to(dev).chunk(ws)), op=op, group=group)
            name = "reduce_scatter"
        what = f"{name} {dtype} {op} n={n} on {dev}, group {ranks}"
        close(out, want[me * n:(me + 1) * n], what)
        return what

    def broadcast(self, rng, key, group, ranks, dev):
        dtype = rng.choice(DTYPES)
        root = rng.choice(ranks)
        want = fill(key, root, self.elems(rng, dtype.itemsize), dtype)
        t = (want if RANK == root else fill(key + 1, RANK, want.numel(), dtype)).to(dev)
        dist.broadcast(t, src=root, group=group)
        what = f"broadcast {dtype} n={want.numel()} root={root} on {dev}, group {ranks}"
        close(t, want, what)
        return what

    def reduce(self, rng, key, group, ranks, dev):
        dtype, op, xs, want = self.reduction(rng, key, ranks, dev)
        root = rng.choice(ranks)
        t = xs[ranks.index(RANK)].to(dev)
        dist.reduce(t, dst=root, op=op, group=group)
        what = f"reduce {dtype} {op} n={t.numel()} root={root} on {dev}, group {ranks}"
        close(t, want if RANK == root else xs[ranks.index(RANK)], what)
        return what

    def gather_scatter(self, rng, key, group, ranks, dev):
        dtype = rng.choice(DTYPES)
        root = rng.choice(ranks)
        n = self.elems(rng, dtype.itemsize, len(ranks))
        me = ranks.index(RANK)
        if rng.random() < 0.5:
            xs = [fill(key, r, n, dtype) for r in ranks]
            outs = [torch.empty(n, dtype=dtype, device=dev) for _ in ranks] if RANK == root else None
            dist.gather(xs[me].to(dev), outs, dst=root, group=group)
            what = f"gather {dtype} n={n} root={root} on {dev}, group {ranks}"
            if outs is not None:
                close(torch.cat(outs), torch.cat(xs), what)
        else:
            parts = [fill(key, root * 64 + j, n, dtype) for j in range(len(ranks))]
            out = torch.empty(n, dtype=dtype, device=dev)
            dist.scatter(out, [p.to(dev) for p in parts] if RANK == root else None, src=root, group=group)
            what = f"scatter {dtype} n={n} root={root} on {dev}, group {ranks}"
            close(out, parts[me], what)
        return what

    def splits(self, rng, ranks, width, dtype):
        """Rows rank i sends rank j (rows of `width` elements): even or uneven, zeros allowed."""
        ws = len(ranks)
        rows = max(1, self.elems(rng, dtype.itemsize * width, ws))
        if rng.random() < 0.4:
            return [[rows] * ws for _ in range(ws)], "even"
        return [[rng.choice([0, rng.randint(0, rows), rows]) for _ in range(ws)] for _ in range(ws)], "uneven"

    def all_to_all_single(self, rng, key, group, ranks, dev):
        dtype = rng.choice(DTYPES)
        width = rng.choice([1, 1, 3])
        sp, kind = self.splits(rng, ranks, width, dtype)
        me = ranks.index(RANK)
        # Block (i -> j) holds fill(key + j, i, ...): distinct per destination.
        blocks = [[fill(key + j, r, sp[i][j] * width, dtype).view(-1, width) for j in range(len(ranks))]
                  for i, r in enumerate(ranks)]
        inp = torch.cat(blocks[me]).to(dev)
        out = torch.empty(sum(sp[i][me] for i in range(len(ranks))), width, dtype=dtype, device=dev)
        even = kind == "even" and rng.random() < 0.5
        if even:
            dist.all_to_all_single(out, inp, group=group)
        else:
            dist.all_to_all_single(out, inp, output_split_sizes=[sp[i][me] for i in range(len(ranks))],
                                   input_split_sizes=sp[me], group=group)
        what = (f"all_to_all_single {dtype} {kind} splits={sp} width={width}"
                f"{' (no split args)' if even else ''} on {dev}, group {ranks}")
        close(out, torch.cat([blocks[i][me] for i in range(len(ranks))]), what)
        return what

    def all_to_all(self, rng, key, group, ranks, dev):
        dtype = rng.choice(DTYPES)
        sp, kind = self.splits(rng, ranks, 1, dtype)
        me = ranks.index(RANK)
        ins = [fill(key + j, RANK, sp[me][j], dtype).to(dev) for j in range(len(ranks))]
        outs = [torch.empty(sp[i][me], dtype=dtype, device=dev) for i in range(len(ranks))]
        dist.all_to_all(outs, ins, group=group)
        what = f"all_to_all {dtype} {kind} splits={sp} on {dev}, group {ranks}"
        for i, r in enumerate(ranks):
            close(outs[i], fill(key + me, r, sp[i][me], dtype), what + f" (from rank {r})")
        return what

    def p2p_ring(self, rng, key, group, ranks, dev):
        """Every member sends to the next and receives from the previous: batch_isend_irecv, isend/irecv,
        or (even group sizes) blocking send/recv ordered by position parity."""
        ws = len(ranks)
        me = ranks.index(RANK)
        nxt, prv = ranks[(me + 1) % ws], ranks[(me - 1) % ws]
        dtype = rng.choice(DTYPES)
        n = self.elems(rng, dtype.itemsize)
        mode = rng.choice(["batch", "isend", "blocking"] if ws % 2 == 0 else ["batch", "isend"])
        tag = rng.randint(0, 7)
        out = torch.empty(n, dtype=dtype, device=dev)
        src = fill(key, RANK, n, dtype).to(dev)
        if mode == "batch":
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, src, nxt, group, tag),
                                             dist.P2POp(dist.irecv, out, prv, group, tag)]):
                w.wait()
        elif mode == "isend":
            works = [dist.isend(src, nxt, group=group, tag=tag), dist.irecv(out, prv, group=group, tag=tag)]
            for w in reversed(works):
                w.wait()
        elif me % 2 == 0:
            dist.send(src, nxt, group=group, tag=tag)
            dist.recv(out, prv, group=group, tag=tag)
        else:
            dist.recv(out, prv, group=group, tag=tag)
            dist.send(src, nxt, group=group, tag=tag)
        what = f"p2p ring ({mode}) {dtype} n={n} tag={tag} on {dev}, group {ranks}"
        close(out, fill(key, prv, n, dtype), what)
        return what

    def coalesced(self, rng, key, group, ranks, dev):
        ws = len(ranks)
        me = ranks.index(RANK)
        kind = rng.choice(["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"])
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.int32, torch.int64])
        sizes = [rng.choice([1, rng.randint(1, 512), self.elems(rng, dtype.itemsize, ws)])
                 for _ in range(rng.randint(2, 4))]
        checks = []
        with dist._coalescing_manager(group=group, async_ops=True) as cm:
            for k, n in enumerate(sizes):
                if kind == "all_reduce":
                    xs = [fill(key + k, r, n, dtype) for r in ranks]
                    t = xs[me].to(dev)
                    dist.all_reduce(t, group=group)
                    checks.append((t, reference(xs, R.SUM)))
                elif kind == "all_gather_into_tensor":
                    xs = [fill(key + k, r, n, dtype) for r in ranks]
                    o = torch.empty(n * ws, dtype=dtype, device=dev)
                    dist.all_gather_into_tensor(o, xs[me].to(dev), group=group)
                    checks.append((o, torch.cat(xs)))
                else:
                    xs = [fill(key + k, r, n * ws, dtype) for r in ranks]
                    o = torch.empty(n, dtype=dtype, device=dev)
                    dist.reduce_scatter_tensor(o, xs[me].to(dev), group=group)
                    checks.append((o, reference(xs, R.SUM)[me * n:(me + 1) * n]))
        cm.wait()
        what = f"coalesced {kind} {dtype} sizes={sizes} on {dev}, group {ranks}"
        for got, want in checks:
            close(got, want, what)
        return what

    def barrier(self, rng, key, group, ranks, dev):
        # A rank that arrives late (host work) must be waited for, not reported.
        if rng.random() < 0.3 and RANK == rng.choice(ranks):
            time.sleep(0.002)
        dist.barrier(group=group)
        return f"barrier, group {ranks}"
