"""torch_npu's LSTM operators, ``_lstm_npu`` (the forward behind ``torch.nn.LSTM`` on Ascend) and
``_lstm_npu_backward``, as aten compositions of the documented cell and its documented backward recurrence.

``_lstm_npu(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, *, batch_first=False,
batch_sizes=None) -> (output, hy, cy, i, j, f, o, h, c, tanhc)``. ``params`` are torch.nn.LSTM's, in its order
(per layer, forward then reverse: ``weight_ih (4H, in), weight_hh (4H, H)[, bias_ih (4H), bias_hh (4H)]``), the four
gate blocks of their rows in torch.nn.LSTM's order (input, forget, cell, output). Per step
``z = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh``; ``i, f, o = sigmoid(.)``, ``j = tanh(.)`` (the candidate cell),
``c_t = f c_{t-1} + i j``, ``h_t = o tanh(c_t)``. The reverse direction runs from the last step to the first; its
per-step outputs sit at the step they belong to (as torch.nn.LSTM's output does). ``output`` is the last layer's
``h_t`` (both directions concatenated); ``hy``/``cy`` each layer's final state, (D * num_layers, B, H), forward
before reverse. With ``train`` the gates ``i, j, f, o``, ``h``, ``c`` and ``tanhc`` of every step are
(D * num_layers, T, B, H); without it the gates and ``tanhc`` are empty and ``h``/``c`` are the final states.
An empty ``hx`` means zero initial states.

``_lstm_npu_backward(grad_y, grad_hy, grad_cy, input, hx, params, i, j, f, o, h, c, tanhc, ...)
-> (dx, [dh0, dc0], dparams)`` runs the documented recurrence over ``_lstm_npu``'s saved ``train`` outputs:
``dh = dy_t + dh_next``, ``dc = dh o (1 - tanh^2 c_t) + dc_next``, the gate gradients, ``dW += dgate z^T``,
``dh_prev = W_hh^T dgate``, ``dc_prev = dc f``, layer by layer from the last.

Refused (ValueError): ``dropout`` other than 0 and ``batch_sizes`` (both documented as not supported / without the
layout of the padded steps' results).
"""
from __future__ import annotations

import torch


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _check(op, input, hx, params, has_biases, num_layers, dropout, bidirectional, batch_sizes):
    if dropout != 0:
        _fail(op, f"dropout is not supported (documented as such), got {dropout}")
    if batch_sizes is not None:
        _fail(op, "batch_sizes (variable-length steps) is not supported")
    if input.dim() != 3:
        _fail(op, f"input must be 3-D, got {input.dim()}-D")
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if num_layers < 1 or len(params) != per * dirs * num_layers:
        _fail(op, f"params must hold {per} tensors per layer and direction ({per * dirs * num_layers} for "
                  f"num_layers={num_layers}), got {len(params)}")
    if len(hx) not in (0, 2):
        _fail(op, f"hx must be [h0, c0] or empty, got {len(hx)} tensors")
    return dirs, per


def _weights(params, per, layer, d, dirs):
    k = (layer * dirs + d) * per
    w = params[k:k + per]
    return w[0], w[1], (w[2] if per == 4 else None), (w[3] if per == 4 else None)


def _run(x, h, c, w_ih, w_hh, b_ih, b_hh, reverse):
    """One layer in one direction over x (T, B, in); per-step results indexed by their step."""
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    rec = {k: [None] * x.shape[0] for k in ("i", "j", "f", "o", "h", "c", "tanhc")}
    for t in steps:
        z = x[t] @ w_ih.T + h @ w_hh.T
        if b_ih is not None:
            z = z + b_ih + b_hh
        zi, zf, zg, zo = z.chunk(4, -1)
        i, f, j, o = torch.sigmoid(zi), torch.sigmoid(zf), torch.tanh(zg), torch.sigmoid(zo)
        c = f * c + i * j
        tc = torch.tanh(c)
        h = o * tc
        for k, v in (("i", i), ("j", j), ("f", f), ("o", o), ("h", h), ("c", c), ("tanhc", tc)):
            rec[k][t] = v
    return {k: torch.stack(v) for k, v in rec.items()}, h, c


def _lstm_npu(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first=False,
              batch_sizes=None):
    op = "_lstm_npu"
    dirs, per = _check(op, input, hx, params, has_biases, num_layers, dropout, bidirectional, batch_sizes)
    x = input.transpose(0, 1) if batch_first else input
    hidden = params[1].shape[1]
    if hx:
        h0, c0 = hx
    else:
        h0 = c0 = x.new_zeros(dirs * num_layers, x.shape[1], hidden)
    recs, hy, cy = [], [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            rec, h, c = _run(x, h0[layer * dirs + d], c0[layer * dirs + d], *_weights(params, per, layer, d, dirs),
                             reverse=d == 1)
            recs.append(rec)
            outs.append(rec["h"])
            hy.append(h)
            cy.append(c)
        x = torch.cat(outs, -1)
    output = x.transpose(0, 1) if batch_first else x
    hy, cy = torch.stack(hy), torch.stack(cy)
    if train:
        gates = [torch.stack([r[k] for r in recs]) for k in ("i", "j", "f", "o", "h", "c", "tanhc")]
    else:
        empty = input.new_empty(0)
        gates = [empty, empty.clone(), empty.clone(), empty.clone(), hy.clone(), cy.clone(), empty.clone()]
    return (output.contiguous(), hy, cy, *gates)


def _lstm_npu_backward(grad_y, grad_hy, grad_cy, input, hx, params, i, j, f, o, h, c, tanhc, has_biases, num_layers,
                       dropout, train, bidirectional, batch_first=False, batch_sizes=None):
    op = "_lstm_npu_backward"
    dirs, per = _check(op, input, hx, params, has_biases, num_layers, dropout, bidirectional, batch_sizes)
    if not train or i.dim() != 4:
        _fail(op, "needs the per-step results of a train=True forward (i, j, f, o, h, c, tanhc of 4 dims)")
    x_in = input.transpose(0, 1) if batch_first else input
    dy = grad_y.transpose(0, 1) if batch_first else grad_y
    steps, batch, hidden = i.shape[1], i.shape[2], i.shape[3]
    if hx:
        h0, c0 = hx
    else:
        h0 = c0 = x_in.new_zeros(dirs * num_layers, batch, hidden)
    dparams = [None] * len(params)
    dh0, dc0 = [None] * (dirs * num_layers), [None] * (dirs * num_layers)
    for layer in range(num_layers - 1, -1, -1):
        # the layer's input: the network's, or the previous layer's h of both directions
        x = x_in if layer == 0 else torch.cat([h[(layer - 1) * dirs + d] for d in range(dirs)], -1)
        dx = torch.zeros_like(x)
        for d in range(dirs):
            k = layer * dirs + d
            w_ih, w_hh, _, _ = _weights(params, per, layer, d, dirs)
            dw_ih, dw_hh = torch.zeros_like(w_ih), torch.zeros_like(w_hh)
            db = w_ih.new_zeros(w_ih.shape[0])
            dh_next, dc_next = grad_hy[k], grad_cy[k]
            dy_d = dy[..., d * hidden:(d + 1) * hidden]
            order = range(steps) if d == 1 else range(steps - 1, -1, -1)  # backward runs against the forward
            prev = 1 if d == 1 else -1
            for t in order:
                first = t == (steps - 1 if d == 1 else 0)
                h_prev = h0[k] if first else h[k, t + prev]
                c_prev = c0[k] if first else c[k, t + prev]
                ig, jg, fg, og, tc = i[k, t], j[k, t], f[k, t], o[k, t], tanhc[k, t]
                dh = dy_d[t] + dh_next
                dc = dh * og * (1 - tc * tc) + dc_next
                dgate = torch.cat([dc * jg * ig * (1 - ig), dc * c_prev * fg * (1 - fg),
                                   dc * ig * (1 - jg * jg), dh * tc * og * (1 - og)], -1)
                dw_ih = dw_ih + dgate.T @ x[t]
                dw_hh = dw_hh + dgate.T @ h_prev
                db = db + dgate.sum(0)
                dx[t] = dx[t] + dgate @ w_ih
                dh_next, dc_next = dgate @ w_hh, dc * fg
            dh0[k], dc0[k] = dh_next, dc_next
            base = k * per
            dparams[base], dparams[base + 1] = dw_ih, dw_hh
            if per == 4:
                dparams[base + 2], dparams[base + 3] = db, db.clone()
        dy = dx
    dx = dy.transpose(0, 1) if batch_first else dy
    return dx.contiguous(), [torch.stack(dh0), torch.stack(dc0)], dparams


_lib = torch.library.Library("npu", "FRAGMENT")
_COMMON = ("bool has_biases, int num_layers, float dropout, bool train, bool bidirectional, *, "
           "bool? batch_first=False, Tensor? batch_sizes=None")
for _fn, _args, _ret in (
        (_lstm_npu, f"(Tensor input, Tensor[] hx, Tensor[] params, {_COMMON})", "(" + ", ".join(["Tensor"] * 10) + ")"),
        (_lstm_npu_backward, "(Tensor grad_y, Tensor grad_hy, Tensor grad_cy, Tensor input, Tensor[] hx, "
                             "Tensor[] params, Tensor i, Tensor j, Tensor f, Tensor o, Tensor h, Tensor c, "
                             f"Tensor tanhc, {_COMMON})", "(Tensor, Tensor[], Tensor[])")):
    _lib.define(f"{_fn.__name__}{_args} -> {_ret}")
    _lib.impl(_fn.__name__, _fn, "CompositeImplicitAutograd")
