"""Ranks of the DTensor attention tests (tests/hccl/test_context_parallel_sdpa.py): PyTorch's own context
parallelism and tensor parallelism around npu attention over hccl, against one device.

Usage: scen_cp_sdpa.py <scenario> [args...]; RANK/WORLD_SIZE/HCCL_TEST_STORE come from the environment.
"""
import copy
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from common import RANK, SCENARIOS, WS, init, scenario

DIM, HEADS = 32, 4
TIGHT = dict(rtol=1e-5, atol=1e-5)   # fp32: ring merging and sharded matmuls only reorder sums


class Attention(nn.Module):
    """Multi-head self-attention as PyTorch's tensor-parallel example writes it: head count inferred by
    ``view(..., -1, head_dim)``, so the same code runs on local tensors and on head-sharded DTensors."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal, self.head_dim = causal, DIM // HEADS
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(DIM, 2 * DIM, bias=False), nn.Linear(DIM, 2 * DIM, bias=False)
        self.w2 = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention, self.feed_forward = Attention(causal=True), FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, vocab=64, layers=2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.norm, self.output = nn.RMSNorm(DIM), nn.Linear(DIM, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


class DTensorOps:
    """Records the operators called on DTensors while active: shows which attention operator DTensor ran."""

    def __enter__(self):
        from torch.distributed.tensor import DTensor
        from torch.utils._python_dispatch import TorchDispatchMode

        seen = self.ops = set()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if DTensor in types:
                    seen.add(func)
                return func(*args, **(kwargs or {}))

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)

    def check_flash_attention(self):
        aten = torch.ops.aten
        want = {aten._scaled_dot_product_flash_attention.default,
                aten._scaled_dot_product_flash_attention_backward.default}
        assert want <= self.ops, f"rank {RANK}: DTensor attention ran {sorted(map(str, self.ops))}"


WORST = {}   # largest |got - want| per check name prefix, printed at the end (the numbers docs quote)


def _close(name, got, want, **tol):
    got, want = got.detach().cpu(), want.detach().cpu()
    key = "parameters" if " after " in name else "parameter gradients" if ".grad" in name else name.split(" ")[0]
    rel = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    WORST[key] = max(WORST.get(key, (0.0, 0.0)), ((got - want).abs().max().item(), rel))
    if not torch.allclose(got, want, **(tol or TIGHT)):
        raise AssertionError(f"rank {RANK}: {name} differs from one device by {(got - want).abs().max().item():.3e}")


def _attention_reference(block, x, weight):
    """Forward and backward of the block on one npu device over the whole sequence."""
    ref, xr = copy.deepcopy(block), x.clone().requires_grad_()
    out = ref(xr)
    (out * weight).sum().backward()
    return out.detach(), xr.grad, {n: p.grad for n, p in ref.named_parameters()}


@scenario
def context_parallel_attention(causal: str):
    """torch's ``context_parallel()`` around an attention block on npu (seq 32, 2 cp ranks), against the block
    on one npu over the whole sequence: the output, the input gradient and every parameter gradient, for each
    kv rotation (all-gather, all-to-all) and, when causal, with and without head-tail load balancing."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import (_cp_options, context_parallel_unshard,
                                                                  set_rotate_method)

    causal = causal == "causal"
    init()
    mesh = init_device_mesh("npu", (WS,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    block = Attention(causal).npu()
    x, weight = torch.randn(2, 32, DIM, device="npu"), torch.randn(2, 32, DIM, device="npu")
    want_out, want_dx, want_grads = _attention_reference(block, x, weight)
    balances = (True, False) if causal else (False,)   # torch's load balancing needs causal attention
    for rotate in ("allgather", "alltoall"):
        for balance in balances:
            set_rotate_method(rotate)
            _cp_options.enable_load_balance = balance
            cp_block = copy.deepcopy(block)
            xs, ws = x.clone(), weight.clone()
            with context_parallel(mesh, buffers=[xs, ws], buffer_seq_dims=[1, 1], no_restore_buffers={xs, ws}):
                assert xs.shape[1] == 32 // WS
                xl = xs.detach().requires_grad_()
                with DTensorOps() as seen:
                    out = cp_block(xl)
                    (out * ws).sum().backward()
                seen.check_flash_attention()
                got_out, got_dx = context_parallel_unshard(mesh, [out.detach(), xl.grad], [1, 1])
            what = f"{rotate}, load balance {balance}"
            _close(f"output ({what})", got_out, want_out)
            _close(f"input gradient ({what})", got_dx, want_dx)
            for n, p in cp_block.named_parameters():
                dist.all_reduce(p.grad)   # each rank saw its share of the sequence
                _close(f"{n}.grad ({what})", p.grad, want_grads[n])
    _cp_options.enable_load_balance = True
    dist.destroy_process_group()


def _tp_plan(sequence_parallel: bool) -> tuple[dict, dict]:
    """(root plan, per-block plan) of PyTorch's tensor-parallel Llama example, with q/k/v kept as DTensors
    (``use_local_output=False``) so attention runs on head-sharded DTensors."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    qkv = {f"attention.{w}": ColwiseParallel(use_local_output=False) for w in ("wq", "wk", "wv")}
    if not sequence_parallel:
        root = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
                "output": ColwiseParallel(output_layouts=Replicate())}
        block = {**qkv, "attention.wo": RowwiseParallel(), "feed_forward.w1": ColwiseParallel(),
                 "feed_forward.w3": ColwiseParallel(), "feed_forward.w2": RowwiseParallel()}
        return root, block
    root = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}
    block = {"attention_norm": SequenceParallel(),
             "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
             **qkv, "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
             "ffn_norm": SequenceParallel(),
             "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
             "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
             "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))}
    return root, block


@scenario
def tensor_parallel_transformer(sp: str):
    """A 2-block Llama-style transformer under ``parallelize_module`` (attention + MLP, Colwise/Rowwise, sequence
    parallel on or off) trains 4 AdamW steps on 2 npu ranks; losses and final parameters match the same model
    trained on one npu device."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    init()
    mesh = init_device_mesh("npu", (WS,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = Transformer().npu()
    single = copy.deepcopy(model)
    root_plan, block_plan = _tp_plan(sp == "sp")
    for layer in model.layers:
        parallelize_module(layer, mesh, block_plan)
    parallelize_module(model, mesh, root_plan)
    # Without sequence parallel the norms stay plain tensors next to DTensor weights, which the foreach
    # implementation cannot group: the per-parameter one (same math) for both models.
    opt, opt1 = (torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=False) for m in (model, single))
    for step in range(4):
        g = torch.Generator().manual_seed(100 + step)
        tokens = torch.randint(0, 64, (2, 16), generator=g).npu()
        labels = torch.randint(0, 64, (2, 16), generator=g).npu()
        losses = []
        for m, o in ((model, opt), (single, opt1)):
            with DTensorOps() as seen:
                logits = m(tokens)
                logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
                loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
                loss.backward()
            if m is model:
                seen.check_flash_attention()
            o.step()
            o.zero_grad()
            losses.append(loss.detach())
        _close(f"loss at step {step}", losses[0], losses[1])
    for (n, p), (_, p1) in zip(model.named_parameters(), single.named_parameters()):
        _close(f"{n} after 4 steps", p.full_tensor() if isinstance(p, DTensor) else p, p1, rtol=1e-4, atol=1e-5)
    dist.destroy_process_group()


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
    print("max abs differences:", {k: f"{a:.1e} ({r:.1e} of the norm)" for k, (a, r) in WORST.items()}, flush=True)
    print("SCENARIO OK", flush=True)
