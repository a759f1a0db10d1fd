"""Context parallelism (CP): each sequence of a micro-batch is split over the ``cp`` ranks.

* ``SequenceSharder`` cuts a [batch, seq] tensor (tokens and labels) into this rank's share. With causal
  attention the last tokens attend to the most keys, so under ``load_balance`` the sequence is cut into
  2 x cp chunks and rank r takes chunks r and 2*cp-1-r (every rank then does the same attention work);
  ``positions`` gives the global positions of the share, which the rotary embedding uses.
* ``ContextParallelAttention`` replaces causal SDPA inside each attention module:
  - ``ring``: keys and values of every cp rank are all-gathered (autograd: the backward reduce-scatters
    their gradients) and the query shard attends to them one rank's chunk at a time, merging the chunks
    with the online-softmax recurrence on their log-sum-exp (``_RingAttention``, forward and backward);
    the causal mask comes from the global positions.
  - ``ulysses``: an all-to-all turns [seq/cp, heads] shards of q, k, v into [seq, heads/cp] shards, plain
    causal SDPA runs over whole sequences for a head subset, and a second all-to-all turns the output back.
* The loss needs nothing: every cp rank holds the same number of tokens, so the mean of the per-rank mean
  losses is the mean over the sequence, and FSDP averages the gradients over dp_shard x cp.

PyTorch's own ``torch.distributed.tensor.experimental.context_parallel`` dispatches only the CUDA SDPA
kernels (flash, efficient, cuDNN) to its ring implementation, while SDPA on npu (as on cpu) runs the
``_scaled_dot_product_flash_attention_for_cpu`` kernel, which it does not handle; hence this module.
"""
from __future__ import annotations

import torch
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


class _RingAttention(torch.autograd.Function):
    """Attention of the local queries over every cp rank's keys/values, one rank's chunk at a time with the
    SDPA kernel npu runs (which also returns each row's log-sum-exp), merged by the online-softmax rule:
    lse = logaddexp(lse, lse_j), out = out * exp(lse_old - lse) + out_j * exp(lse_j - lse). Backward runs the
    kernel's backward per chunk with the merged output and log-sum-exp, which gives each chunk's exact share
    of the gradients (the flash-attention backward needs only the row statistics of the whole row). Nothing
    of size [queries, keys] is kept for backward."""

    @staticmethod
    def forward(ctx, q, keys, values, masks, dead):
        out = lse = None
        for kj, vj, mask, rows in zip(keys, values, masks, dead):
            out_j, lse_j = _FLASH(q, kj, vj, 0.0, False, attn_mask=mask)
            lse_j = lse_j.masked_fill(rows, float("-inf"))    # the kernel reports 0 for rows it fully masks
            if out is None:   # rank 0 holds position 0, visible to every query: lse starts finite
                out, lse = out_j, lse_j
                continue
            merged = torch.logaddexp(lse, lse_j)
            out = out * torch.exp(lse - merged).unsqueeze(-1) + out_j * torch.exp(lse_j - merged).unsqueeze(-1)
            lse = merged
        ctx.save_for_backward(q, keys, values, out, lse)
        ctx.masks = masks
        return out

    @staticmethod
    def backward(ctx, grad):
        q, keys, values, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dks, dvs = torch.zeros_like(q), [], []
        for kj, vj, mask in zip(keys, values, ctx.masks):
            g_q, g_k, g_v = _FLASH_BACKWARD(grad, q, kj, vj, out, lse, 0.0, False, attn_mask=mask)
            dq += g_q
            dks.append(g_k)
            dvs.append(g_v)
        return dq, torch.stack(dks), torch.stack(dvs), None, None


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
        n, local = s.size, q.shape[2]
        keys = funcol.all_gather_single_autograd(k.contiguous(), 0, s.group).view(n, *k.shape)
        values = funcol.all_gather_single_autograd(v.contiguous(), 0, s.group).view(n, *v.shape)
        masks, dead = self._masks(local, q.device)
        return _RingAttention.apply(q.contiguous(), keys, values, masks, dead)

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
