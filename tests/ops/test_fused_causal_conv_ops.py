"""npu_fused_causal_conv1d against a per-sequence loop: the sequence headed by its cached state's last K - 1 rows,
the conv1d window sum (weight[K - 1] on the current token), the residual, and the state shifted by the sequence."""
import pytest
import torch

import torch_npu

from ._common import NPU, ops


def _ref(x_rows, w, states, seqs, slots, residual, pad=-1):
    k = w.shape[0]
    y = torch.zeros_like(x_rows)
    states = states.clone()
    for (a, b), slot in zip(seqs, slots):
        if slot == pad:
            continue
        hist = torch.cat((states[slot], x_rows[a:b]))
        for t in range(a, b):
            pos = states.shape[1] + (t - a)  # index of token t in hist
            y[t] = sum(w[j] * hist[pos - (k - 1) + j] for j in range(k)) + (x_rows[t] if residual else 0)
        states[slot] = hist[hist.shape[0] - states.shape[1]:]
    return y, states


@pytest.mark.parametrize("residual", [0, 1])
@pytest.mark.parametrize("state_len", [2, 4])
def test_fused_causal_conv1d_varlen(residual, state_len):
    g = torch.Generator().manual_seed(0)
    dim = 8
    w, x = torch.randn(3, dim, generator=g, dtype=torch.float64), torch.randn(19, dim, generator=g,
                                                                              dtype=torch.float64)
    starts = [0, 5, 8, 15, 19]
    states = torch.randn(8, state_len, dim, generator=g, dtype=torch.float64)
    slots = [0, 3, -1, 5]  # the third sequence is a padding slot: skipped
    cs = states.to(NPU)
    y = torch_npu.npu_fused_causal_conv1d(x.to(NPU), w.to(NPU), cs, query_start_loc=torch.tensor(starts).to(NPU),
                                          cache_indices=torch.tensor(slots, dtype=torch.int32).to(NPU),
                                          residual_connection=residual)
    want_y, want_states = _ref(x, w, states, list(zip(starts, starts[1:])), slots, residual)
    torch.testing.assert_close(y.cpu(), want_y)
    torch.testing.assert_close(cs.cpu(), want_states)


def test_fused_causal_conv1d_batched_without_cache_indices():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 4, 8, generator=g).bfloat16(), torch.randn(3, 8, generator=g).bfloat16()
    states = torch.randn(2, 2, 8, generator=g).bfloat16()
    cs = states.to(NPU)
    y = torch_npu.npu_fused_causal_conv1d(x.to(NPU), w.to(NPU), cs)
    want_y, want_states = _ref(x.reshape(-1, 8).float(), w.float(), states.float(), [(0, 4), (4, 8)], [0, 1], 0)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.cpu().float().reshape(-1, 8), want_y, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(cs.cpu().float(), want_states.bfloat16().float())


def test_fused_causal_conv1d_rejects_unsupported_arguments():
    x, w, cs = torch.randn(4, 8).to(NPU), torch.randn(3, 8).to(NPU), torch.randn(2, 2, 8).to(NPU)
    qsl = torch.tensor([0, 4]).to(NPU)
    for kw, word in ((dict(bias=torch.ones(8).to(NPU)), "bias"), (dict(activation="silu"), "activation"),
                     (dict(conv_mode="pangu"), "conv_mode"), (dict(run_mode=1), "run_mode"),
                     (dict(cache_indices=torch.zeros(1, 2, dtype=torch.int32).to(NPU)), "cache_indices"),
                     (dict(num_accepted_tokens=torch.ones(1).to(NPU)), "num_accepted_tokens")):
        with pytest.raises(ValueError, match=f"npu_fused_causal_conv1d: {word}"):
            torch_npu.npu_fused_causal_conv1d(x, w, cs, query_start_loc=qsl, **kw)
    with pytest.raises(ValueError, match="npu_fused_causal_conv1d: query_start_loc is required"):
        torch_npu.npu_fused_causal_conv1d(x, w, cs)


def test_fused_causal_conv1d_compile():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(7, 8, generator=g), torch.randn(3, 8, generator=g)
    states = torch.randn(3, 2, 8, generator=g)
    qsl = torch.tensor([0, 3, 7]).to(NPU)

    def fn(x, w, cs):
        return ops.npu_fused_causal_conv1d(x, w, cs, query_start_loc=qsl, residual_connection=1)

    results = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        cs = states.to(NPU)
        results.append((f(x.to(NPU), w.to(NPU), cs).cpu(), cs.cpu()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)
