"""Training on npu is bitwise identical to the same training on cpu (the key correctness test).

Same initial weights and batches, several optimizer steps (AdamW with weight decay, SGD with momentum,
gradient clipping); losses and final parameters must be equal bit for bit. Dropout is left out: the
npu generator is independent of the CPU generator by design, so masks differ.
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.ReLU(), nn.LayerNorm(64),
                                 nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    """Embedding, a pre-norm transformer block (causal attention + MLP) and an output head."""

    def __init__(self, d=32, heads=4, vocab=50):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(x)


def _train(model, device, batches, opt_name):
    model = copy.deepcopy(model).to(device)
    if opt_name == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for x, y in batches:
        out = model(x.to(device))
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.to(device).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.detach().to("cpu"))
    return [p.detach().to("cpu") for p in model.parameters()], losses


def _assert_bitwise(model, batches, opt_name):
    p_cpu, l_cpu = _train(model, "cpu", batches, opt_name)
    p_npu, l_npu = _train(model, "npu", batches, opt_name)
    assert all(p.device.type == "cpu" for p in model.parameters())
    for step, (a, b) in enumerate(zip(l_cpu, l_npu)):
        assert torch.equal(a, b), f"step {step}: cpu loss {a.item()!r} != npu loss {b.item()!r}"
    for a, b in zip(p_cpu, p_npu):
        assert torch.equal(a, b)
    assert not torch.equal(p_cpu[0], next(model.parameters()).detach())  # training changed the weights


def test_mlp_bitwise_identical_to_cpu():
    torch.manual_seed(0)
    model = MLP()
    batches = [(torch.randn(16, 32), torch.randint(0, 10, (16,))) for _ in range(5)]
    _assert_bitwise(model, batches, "adamw")
    _assert_bitwise(model, batches, "sgd")


def test_transformer_block_bitwise_identical_to_cpu():
    torch.manual_seed(0)
    model = Block()
    batches = [(torch.randint(0, 50, (4, 12)), torch.randint(0, 50, (4, 12))) for _ in range(4)]
    _assert_bitwise(model, batches, "adamw")
