"""torch_npu's LSTM operators against torch.nn.LSTM (the module whose parameters and results ``_lstm_npu``
documents) on the CPU, and the documented gate formulas for the per-step outputs."""
import pytest
import torch

import torch_npu

from ._common import NPU, leaf, ops, ref_leaf

T, B, IN, H = 3, 2, 5, 4


def _case(layers, bidirectional, batch_first, has_biases, seed=0):
    torch.manual_seed(seed)
    lstm = torch.nn.LSTM(IN, H, layers, bias=has_biases, bidirectional=bidirectional,
                         batch_first=batch_first).double()
    d = 2 if bidirectional else 1
    x = torch.randn((B, T, IN) if batch_first else (T, B, IN), dtype=torch.float64)
    h0, c0 = torch.randn(d * layers, B, H, dtype=torch.float64), torch.randn(d * layers, B, H, dtype=torch.float64)
    return lstm, x, h0, c0


@pytest.mark.parametrize("layers,bidirectional,batch_first,has_biases",
                         [(1, False, False, True), (2, False, True, True), (2, True, False, False),
                          (1, True, True, True)])
def test_lstm_forward_backward_match_torch_lstm(layers, bidirectional, batch_first, has_biases):
    lstm, x, h0, c0 = _case(layers, bidirectional, batch_first, has_biases)
    params_r = [ref_leaf(p) for p in lstm._flat_weights]
    xr, h0r, c0r = ref_leaf(x), ref_leaf(h0), ref_leaf(c0)
    ref, hr, cr = torch._VF.lstm(xr, (h0r, c0r), params_r, has_biases, layers, 0.0, False, bidirectional,
                                 batch_first)
    params_n = [leaf(p) for p in lstm._flat_weights]
    xn, h0n, c0n = leaf(x), leaf(h0), leaf(c0)
    out = torch_npu._lstm_npu(xn, [h0n, c0n], params_n, has_biases, layers, 0.0, True, bidirectional,
                              batch_first=batch_first)
    for a, b in zip(out[:3], (ref, hr, cr)):
        torch.testing.assert_close(a.detach().cpu(), b.detach())
    d = 2 if bidirectional else 1
    for t in out[3:]:
        assert t.shape == (d * layers, T, B, H)
    # autograd through the forward, and the backward operator on its saved results, against torch's gradients
    g = [torch.randn_like(t) for t in (ref, hr, cr)]
    want = torch.autograd.grad((ref, hr, cr), [xr, h0r, c0r, *params_r], g)
    got = torch.autograd.grad(out[:3], [xn, h0n, c0n, *params_n], [t.to(NPU) for t in g])
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b)
    dx, dhx, dparams = ops._lstm_npu_backward(*[t.to(NPU) for t in g], xn.detach(), [h0n.detach(), c0n.detach()],
                                              [p.detach() for p in params_n], *[t.detach() for t in out[3:]],
                                              has_biases, layers, 0.0, True, bidirectional, batch_first=batch_first)
    for a, b in zip([dx, *dhx, *dparams], want):
        torch.testing.assert_close(a.cpu(), b)


def test_lstm_gates_follow_the_documented_cell():
    lstm, x, h0, c0 = _case(1, False, False, True, seed=1)
    w_ih, w_hh, b_ih, b_hh = lstm._flat_weights
    out = torch_npu._lstm_npu(x.to(NPU), [h0.to(NPU), c0.to(NPU)], [p.detach().to(NPU) for p in lstm._flat_weights],
                              True, 1, 0.0, True, False)
    i, j, f, o, h, c, tanhc = (t.cpu() for t in out[3:])
    # step 0 by the formulas: blocks (input, forget, cell, output) of W_ih x + b_ih + W_hh h0 + b_hh
    z = (x[0] @ w_ih.T + b_ih + h0[0] @ w_hh.T + b_hh).detach()
    zi, zf, zg, zo = z[:, :H], z[:, H:2 * H], z[:, 2 * H:3 * H], z[:, 3 * H:]
    c1 = torch.sigmoid(zf) * c0[0] + torch.sigmoid(zi) * torch.tanh(zg)
    for got, want in ((i[0, 0], torch.sigmoid(zi)), (j[0, 0], torch.tanh(zg)), (f[0, 0], torch.sigmoid(zf)),
                      (o[0, 0], torch.sigmoid(zo)), (c[0, 0], c1), (tanhc[0, 0], torch.tanh(c1)),
                      (h[0, 0], torch.sigmoid(zo) * torch.tanh(c1))):
        torch.testing.assert_close(got, want)
    # train=False: empty gates, h and c the final states; an empty hx starts from zeros
    ev = torch_npu._lstm_npu(x.to(NPU), [], [p.detach().to(NPU) for p in lstm._flat_weights], True, 1, 0.0, False,
                             False)
    ref, (hr, cr) = lstm(x)
    assert ev[3].numel() == 0 and ev[9].numel() == 0
    torch.testing.assert_close(ev[0].cpu(), ref.detach())
    torch.testing.assert_close(ev[7].cpu(), hr.detach())
    torch.testing.assert_close(ev[8].cpu(), cr.detach())


def test_lstm_rejects():
    lstm, x, h0, c0 = _case(1, False, False, True)
    params = [p.detach().to(NPU) for p in lstm._flat_weights]
    with pytest.raises(ValueError, match="_lstm_npu: dropout"):
        torch_npu._lstm_npu(x.to(NPU), [], params, True, 1, 0.5, True, False)
    with pytest.raises(ValueError, match="_lstm_npu: batch_sizes"):
        torch_npu._lstm_npu(x.to(NPU), [], params, True, 1, 0.0, True, False, batch_sizes=torch.tensor([2, 2, 2]))
    with pytest.raises(ValueError, match="_lstm_npu: params"):
        torch_npu._lstm_npu(x.to(NPU), [], params[:2], True, 1, 0.0, True, False)


def test_rnn_ops_compile():
    lstm, x, h0, c0 = _case(1, True, False, True, seed=2)
    params = [p.detach().to(NPU) for p in lstm._flat_weights]

    def fn(x, h0, c0):
        out = ops._lstm_npu(x, [h0, c0], params, True, 1, 0.0, True, True)
        return out[0].sum() + out[1].sum() + out[2].sum()

    xe = leaf(x)
    ge = torch.autograd.grad(fn(xe, h0.to(NPU), c0.to(NPU)), xe)[0]
    xc = leaf(x)
    res = torch.compile(fn, backend="aot_eager", fullgraph=True)(xc, h0.to(NPU), c0.to(NPU))
    torch.testing.assert_close(torch.autograd.grad(res, xc)[0].cpu(), ge.cpu())
