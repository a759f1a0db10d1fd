"""Context parallelism (CP): each sequence of a micro-batch is split over the ``cp`` ranks.

* ``SequenceSharder`` cuts a [batch, seq] tensor (tokens and labels) into this rank's share. With causal
  attention the last tokens attend to the most keys, so under ``load_balance`` the sequence is cut into
  2 x cp chunks and rank r takes chunks r and 2*cp-1-r (every rank then does the same attention work);
  ``positions`` gives the global positions of the share, which the rotary embedding uses.
* ``ContextParallelAttention`` replaces causal SDPA inside each attention module:
  - ``ring``: the key/value blocks travel around the cp ranks by send/recv (``RingExchange``), the next
    block in flight while the query shard attends to the current one; the blocks are merged with the
    online-softmax recurrence on their log-sum-exp (``_RingAttention``); in backward the key/value gradients
    travel the ring the same way, overlapped with the next block's gradient computation. The causal mask
    comes from the global positions.
  - ``ulysses``: an all-to-all turns [seq/cp, heads] shards of q, k, v into [seq, heads/cp] shards, plain
    causal SDPA runs over whole sequences for a head subset, and a second all-to-all turns the output back.
* The loss needs nothing: every cp rank holds the same number of tokens, so the mean of the per-rank mean
  losses is the mean over the sequence, and FSDP averages the gradients over dp_shard x cp.

PyTorch's own ``torch.distributed.tensor.experimental.context_parallel`` also runs on npu (npu DTensor attention
runs the flash operator its ring handles, ``npudist.device.attention``); plans use this module, whose ring
overlaps each transfer with a block's attention and which offers Ulysses (docs/context_parallel.md).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh


class SequenceSharder:
    def __init__(self, cp_mesh: DeviceMesh, load_balance: bool = True):
        self.group = cp_mesh.get_group()
        self.size, self.rank = cp_mesh.size(), cp_mesh.get_local_rank()
        self.load_balance = load_balance
        self._positions: dict = {}

    def _chunks(self) -> tuple[int, list[int]]:
        """(number of equal chunks a sequence is cut into, the ones this rank holds)."""
        if self.load_balance:
            return 2 * self.size, [self.rank, 2 * self.size - 1 - self.rank]
        return self.size, [self.rank]

    def shard(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        n, mine = self._chunks()
        if t.shape[dim] % n:
            raise ValueError(f"sequence length {t.shape[dim]} is not divisible into {n} context-parallel chunks")
        chunks = t.chunk(n, dim=dim)
        return torch.cat([chunks[i] for i in mine], dim=dim).contiguous()

    def positions(self, local_len: int, device) -> torch.Tensor:
        """Global positions of this rank's ``local_len`` tokens."""
        key = (local_len, str(device))
        if key not in self._positions:
            self._positions[key] = self.shard(torch.arange(local_len * self.size).unsqueeze(0))[0].to(device)
        return self._positions[key]

    def all_positions(self, local_len: int, device) -> list[torch.Tensor]:
        """Global positions held by every cp rank, in rank order."""
        total = torch.arange(local_len * self.size).unsqueeze(0)
        n, _ = self._chunks()
        chunks = total.chunk(n, dim=1)
        if self.load_balance:
            return [torch.cat([chunks[r], chunks[n - 1 - r]], 1)[0].to(device) for r in range(self.size)]
        return [chunks[r][0].to(device) for r in range(self.size)]


_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class RingExchange:
    """One ring step's transfer within the cp group: send a tensor to the next cp rank and receive the previous
    rank's into a new buffer, as one ``batch_isend_irecv``; ``start`` returns while the transfer is in flight,
    ``wait`` completes it. The ``ring_attention.exchange`` / ``ring_attention.wait`` profiler ranges mark both
    ends, so a trace shows what ran in between."""

    def __init__(self, group, rank: int, size: int):
        self.group, self.rank, self.size = group, rank, size
        self.next, self.prev = (rank + 1) % size, (rank - 1) % size

    def start(self, tensor: torch.Tensor):
        with torch.profiler.record_function("ring_attention.exchange"):
            recv = torch.empty_like(tensor)
            reqs = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, tensor, group=self.group, group_peer=self.next),
                dist.P2POp(dist.irecv, recv, group=self.group, group_peer=self.prev)])
        return recv, reqs

    @staticmethod
    def wait(pending) -> torch.Tensor:
        recv, reqs = pending
        with torch.profiler.record_function("ring_attention.wait"):
            for req in reqs:
                req.wait()
        return recv


class _RingAttention(torch.autograd.Function):
    """Attention of the local queries over every cp rank's keys/values, one rank's block at a time with the SDPA
    kernel npu runs (which also returns each row's log-sum-exp), merged by the online-softmax rule:
    lse = logaddexp(lse, lse_j), out = out * exp(lse_old - lse) + out_j * exp(lse_j - lse).

    Forward: step i attends to the block of rank r - i (its own first: every query sees itself, so lse starts
    finite) while the block is already being passed on to rank r + 1 and the next one received from r - 1.
    Backward: the kernel's backward per block with the merged output and log-sum-exp gives each block's exact
    share of the gradients (the flash-attention backward needs only the row statistics of the whole row).
    The key/value gradients travel the ring as an accumulator: step i computes the share of block r - i - 1
    while the accumulator of the previous step is in flight to rank r + 1 and this step's arrives from r - 1;
    after the last step each rank holds its own block's gradient. The received blocks are kept for backward
    (as the all-gathered keys and values were); nothing of size [queries, keys] is."""

    @staticmethod
    def forward(ctx, q, k, v, ring: RingExchange, masks, dead):
        n, r = ring.size, ring.rank
        kv = torch.stack([k, v])
        blocks = [None] * n
        out = lse = None
        for i in range(n):
            src = (r - i) % n
            pending = ring.start(kv) if i < n - 1 else None
            blocks[src] = kv
            out_j, lse_j = _FLASH(q, kv[0], kv[1], 0.0, False, attn_mask=masks[src])
            lse_j = lse_j.masked_fill(dead[src], float("-inf"))    # the kernel reports 0 for rows it fully masks
            if out is None:
                out, lse = out_j, lse_j
            else:
                merged = torch.logaddexp(lse, lse_j)
                out = (out * torch.exp(lse - merged).unsqueeze(-1)
                       + out_j * torch.exp(lse_j - merged).unsqueeze(-1))
                lse = merged
            if pending is not None:
                kv = ring.wait(pending)
        ctx.save_for_backward(q, out, lse, *blocks)
        ctx.ring, ctx.masks = ring, masks
        return out

    @staticmethod
    def backward(ctx, grad):
        q, out, lse, *blocks = ctx.saved_tensors
        ring = ctx.ring
        n, r = ring.size, ring.rank
        grad = grad.contiguous()
        dq, acc = torch.zeros_like(q), None
        for i in range(n):
            b = (r - i - 1) % n
            pending = ring.start(acc) if i > 0 else None
            kv = blocks[b]
            g_q, g_k, g_v = _FLASH_BACKWARD(grad, q, kv[0], kv[1], out, lse, 0.0, False, attn_mask=ctx.masks[b])
            dq += g_q
            share = torch.stack([g_k, g_v])
            acc = share if pending is None else ring.wait(pending) + share
        return dq, acc[0], acc[1], None, None, None


class ContextParallelAttention:
    """What ``Attention.context_parallel`` holds: the shard's positions and attention across the cp group."""

    def __init__(self, sharder: SequenceSharder, method: str):
        if method not in ("ring", "ulysses"):
            raise ValueError(f"parallel.cp.method: expected ring or ulysses, got {method!r}")
        self.sharder, self.method = sharder, method
        self._mask_cache: dict = {}

    def positions(self, local_len: int, device) -> torch.Tensor:
        return self.sharder.positions(local_len, device)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v: [batch, heads, local seq, head_dim] -> causal attention output for the local queries."""
        if self.method == "ring":
            return self._ring(q, k, v)
        return self._ulysses(q, k, v)

    def _ring(self, q, k, v):
        s = self.sharder
        masks, dead = self._masks(q.shape[2], q.device)
        ring = RingExchange(s.group, s.rank, s.size)
        return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), ring, masks, dead)

    def _masks(self, local: int, device):
        """Per cp rank j: the additive causal mask [local q, local kv] between this rank's positions and rank
        j's, and the query rows that see none of rank j's keys."""
        key = (local, str(device))
        if key not in self._mask_cache:
            q_pos = self.sharder.positions(local, device)
            masks, dead = [], []
            for kv_pos in self.sharder.all_positions(local, device):
                hidden = kv_pos[None, :] > q_pos[:, None]
                masks.append(torch.zeros(hidden.shape, device=device).masked_fill(hidden, float("-inf")))
                dead.append(hidden.all(-1))
            self._mask_cache[key] = (masks, dead)
        return self._mask_cache[key]

    def _ulysses(self, q, k, v):
        s = self.sharder
        n = s.size
        local = q.shape[2]

        def seq_to_heads(t):
            # [b, h, sl, d] -> send head group j to rank j -> [b, h/n, n*sl, d] (sequence in rank order)
            b, h, sl, d = t.shape
            send = t.reshape(b, n, h // n, sl, d).transpose(0, 1).contiguous()   # [n, b, h/n, sl, d]
            recv = funcol.all_to_all_single_autograd(send, None, None, s.group)  # [n (source), b, h/n, sl, d]
            return recv.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * sl, d)

        def heads_to_seq(t, h):
            b, hn, total, d = t.shape
            send = t.reshape(b, hn, n, total // n, d).permute(2, 0, 1, 3, 4).contiguous()   # [n, b, h/n, sl, d]
            recv = funcol.all_to_all_single_autograd(send, None, None, s.group)            # [n (head group), ...]
            return recv.transpose(0, 1).reshape(b, h, total // n, d)

        h = q.shape[1]
        qh, kh, vh = seq_to_heads(q), seq_to_heads(k), seq_to_heads(v)
        # The gathered sequence is in rank order of the shards; put it in position order for causal SDPA.
        pos = torch.cat(s.all_positions(local, q.device))
        order = pos.argsort()
        out = F.scaled_dot_product_attention(qh[:, :, order], kh[:, :, order], vh[:, :, order], is_causal=True)
        out = out[:, :, order.argsort()]
        return heads_to_seq(out, h)


def apply_cp(model: nn.Module, cp_mesh: DeviceMesh, cp_cfg, sharder: SequenceSharder | None = None) -> nn.Module:
    """Run every attention module of ``model`` on sequence shards over the 1-D ``cp_mesh`` (cp_cfg: a
    ``CPConfig``); MoE layers add their balance statistics up over the cp group."""
    from npudist.models.moe import moe_layers
    sharder = sharder or SequenceSharder(cp_mesh, cp_cfg.load_balance)
    cp = ContextParallelAttention(sharder, cp_cfg.method)
    found = 0
    for module in model.modules():
        if hasattr(module, "context_parallel"):
            module.context_parallel = cp
            found += 1
    for _, moe in moe_layers(model):
        moe.seq_group = sharder.group
    if not found and any(True for _ in model.parameters()):
        raise ValueError("parallel.cp_degree: the model has no attention module that runs on sequence shards "
                         "(npudist.models.llama.Attention); set cp_degree: 1")
    return model
