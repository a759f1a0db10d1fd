"""torch_npu.utils.FlopsCounter (the FLOPs of npu matmuls, convolutions and fused attention, with Ascend's
recorded / traversed totals) and torch_npu.optim.NpuFusedOptimizerBase (parameters combined into one buffer per
dtype, a subclass's step against torch.optim)."""
import warnings

import pytest
import torch

import torch_npu
from torch_npu.utils import FlopsCounter


@pytest.fixture
def counter():
    fc = FlopsCounter()
    fc.stop()
    yield fc
    fc.stop()


def _npu(*shape, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to("npu").requires_grad_(grad)


# ---------------------------------------------------------------------------------------------------------
# FlopsCounter

def test_flops_counter_names():
    assert torch_npu.utils.FlopsCounter is torch_npu.utils.flops_count._FlopsCounter
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch_npu.utils.flops_count.FlopsCounter()
    assert any(issubclass(x.category, FutureWarning) and "will be deprecated" in str(x.message) for x in w)


def test_not_started_counts_nothing(counter):
    assert counter.get_flops() == [0, 0]
    _npu(4, 5) @ _npu(5, 6)
    assert counter.get_flops() == [0, 0]


def test_mm_forward_backward(counter):
    m, k, n = 4, 5, 6
    a, b = _npu(m, k, grad=True), _npu(k, n, grad=True, seed=1)
    counter.start()
    c = a @ b
    assert counter.get_flops() == [2 * m * n * k] * 2
    c.sum().backward()   # grad_a = g @ b^T, grad_b = a^T @ g
    assert counter.get_flops() == [3 * 2 * m * n * k] * 2
    assert isinstance(counter.get_flops()[0], int)


def test_linear_bmm_baddbmm_matmul(counter):
    counter.start()
    lin = torch.nn.Linear(5, 7).to("npu")
    lin(_npu(3, 5))                                     # addmm: 2*3*7*5
    assert counter.get_flops()[1] == 2 * 3 * 7 * 5
    torch.bmm(_npu(2, 3, 4), _npu(2, 4, 5))
    assert counter.get_flops()[1] == 2 * 3 * 7 * 5 + 2 * 2 * 3 * 5 * 4
    counter.stop()
    counter.start()
    torch.baddbmm(_npu(2, 3, 5), _npu(2, 3, 4), _npu(2, 4, 5))
    torch.matmul(_npu(2, 3, 4), _npu(4, 6))            # batched matmul through mm/bmm
    assert counter.get_flops() == [2 * 2 * 3 * 5 * 4 + 2 * 2 * 3 * 6 * 4] * 2


def test_conv2d_forward_backward(counter):
    x, w = _npu(2, 3, 8, 8, grad=True), _npu(4, 3, 3, 3, grad=True, seed=1)
    counter.start()
    y = torch.nn.functional.conv2d(x, w, padding=1)
    fwd = 2 * (8 * 8) * (3 * 3) * 2 * 4 * 3             # out pixels * filter * batch * c_out * c_in * 2
    assert counter.get_flops() == [fwd, fwd]
    y.sum().backward()                                  # grad input + grad weight, each as many
    assert counter.get_flops() == [3 * fwd, 3 * fwd]


def test_cpu_ops_not_counted(counter):
    counter.start()
    torch.randn(4, 5) @ torch.randn(5, 6)
    torch.nn.functional.conv2d(torch.randn(1, 1, 4, 4), torch.randn(1, 1, 3, 3))
    assert counter.get_flops() == [0, 0]


def test_pause_resume(counter):
    unit = 2 * 4 * 6 * 5
    a, b = _npu(4, 5), _npu(5, 6)
    counter.start()
    a @ b
    counter.pause()
    a @ b                    # recomputation: traversed only
    a @ b
    assert counter.get_flops() == [unit, 3 * unit]
    counter.resume()
    a @ b
    assert counter.get_flops() == [2 * unit, 4 * unit]


def test_checkpoint_recompute_is_counted(counter):
    """Activation checkpointing's recomputed forward is traversed again (HFU); pausing around it keeps it out of
    recordedCount (MFU), as MindSpeed does."""
    from torch.utils.checkpoint import checkpoint

    w = _npu(8, 8, grad=True)
    x = _npu(4, 8, grad=True, seed=1)
    unit = 2 * 4 * 8 * 8

    def block(t):
        return torch.tanh(t @ w)

    counter.start()
    checkpoint(block, x, use_reentrant=False).sum().backward()
    assert counter.get_flops() == [4 * unit, 4 * unit]   # forward, recomputed forward, two backward matmuls
    counter.stop()
    counter.start()
    y = checkpoint(block, x, use_reentrant=False)
    counter.pause()
    y.sum().backward()
    counter.resume()
    assert counter.get_flops() == [unit, 4 * unit]


def test_stop_resets_and_disables(counter):
    a, b = _npu(4, 5), _npu(5, 6)
    counter.start()
    counter.pause()
    a @ b
    assert counter.get_flops() == [0, 2 * 4 * 6 * 5]
    counter.stop()
    assert counter.get_flops() == [0, 0]
    a @ b
    assert counter.get_flops() == [0, 0]
    counter.start()          # stop cleared the pause flag too
    a @ b
    assert counter.get_flops() == [2 * 4 * 6 * 5] * 2
    counter.stop()
    assert not torch.utils._python_dispatch._get_current_dispatch_mode_stack()


def test_singleton_state(counter):
    other = FlopsCounter()
    counter.start()
    _npu(2, 3) @ _npu(3, 4)
    assert other.get_flops() == counter.get_flops() == [48, 48]
    other.stop()
    assert counter.get_flops() == [0, 0]


def test_context_manager(counter):
    with FlopsCounter() as fc:
        _npu(2, 3) @ _npu(3, 4)
    _npu(2, 3) @ _npu(3, 4)
    assert fc.get_flops() == [48, 48]
    assert not torch.utils._python_dispatch._get_current_dispatch_mode_stack()


def test_stop_under_another_mode(counter):
    """A mode entered after start() stays on the stack when the counter stops."""
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    counter.start()
    inner = Passthrough()
    inner.__enter__()
    try:
        counter.stop()
        assert _get_current_dispatch_mode_stack() == [inner]
    finally:
        inner.__exit__(None, None, None)
    assert not _get_current_dispatch_mode_stack()


def test_fusion_attention_flops(counter):
    b, s, n, d = 2, 8, 4, 16
    q, k, v = (_npu(b, s, n, d, grad=True, seed=i) for i in range(3))
    counter.start()
    out = torch_npu.npu_fusion_attention(q, k, v, n, "BSND", scale=d ** -0.5)[0]
    fwd = 2 * b * n * s * s * d + 2 * b * n * s * s * d      # QK^T and P V
    assert counter.get_flops() == [fwd, fwd]
    out.sum().backward()                                   # dS, dV, dQ, dK
    assert counter.get_flops() == [3 * fwd, 3 * fwd]


def test_fusion_attention_layouts(counter):
    n, d = 2, 8
    counter.start()
    # BSH with grouped kv heads (1 kv head) and a different value head dim is not allowed by the operator;
    # the same shapes in BSH and BNSD count the same
    q = _npu(1, 6, n * d)
    kv = _npu(1, 10, n * d, seed=1)
    torch_npu.npu_fusion_attention(q, kv, kv, n, "BSH", scale=0.3)
    bsh = counter.get_flops()[1]
    assert bsh == 2 * 1 * n * 6 * 10 * (d + d)
    counter.stop()
    counter.start()
    # TND: two sequences (3 and 5 queries, 4 and 6 keys) count per sequence
    q, kv = _npu(8, n, d), _npu(10, n, d, seed=1)
    torch_npu.npu_fusion_attention(q, kv, kv, n, "TND", scale=0.3, actual_seq_qlen=[3, 8], actual_seq_kvlen=[4, 10])
    assert counter.get_flops()[1] == 2 * n * (3 * 4 + 5 * 6) * (d + d)


def test_flop_counter_mode_counts_fusion_attention():
    from torch.utils.flop_counter import FlopCounterMode

    q = _npu(1, 4, 2, 8)
    with FlopCounterMode(display=False) as mode:
        torch_npu.npu_fusion_attention(q, q, q, 2, "BSND", scale=0.3)
    assert mode.get_total_flops() == 2 * 2 * 4 * 4 * (8 + 8)


def test_autograd_thread_counts_backward(counter):
    """The backward runs on the autograd engine's device thread; its matmuls are counted."""
    a, b = _npu(3, 4, grad=True), _npu(4, 5, grad=True, seed=1)
    counter.start()
    (a @ b).sum().backward()
    assert counter.get_flops()[1] == 3 * 2 * 3 * 4 * 5


# ---------------------------------------------------------------------------------------------------------
# NpuFusedOptimizerBase: optimizers written against it, as torch_npu's own are

from torch_npu.optim import NpuFusedOptimizerBase  # noqa: E402


class CombinedSGD(NpuFusedOptimizerBase):
    """SGD with momentum over the combined buffers (torch.optim.SGD's update)."""

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    def _maybe_init_combined_states(self):
        if self.is_states_combined:
            return
        self.combined_param_states_indexed_by_group = []
        for g, group in enumerate(self.param_groups):
            per_dtype = []
            for params in self.params_lists_indexed_by_group[g]:
                bufs = []
                for p in params:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = None
                    elif state["momentum_buffer"] is not None:
                        state["momentum_buffer"] = state["momentum_buffer"].clone().contiguous()
                    bufs.append(state["momentum_buffer"])
                if bufs and all(b is not None for b in bufs):
                    per_dtype.append({"momentum_buffer": npu_combine(bufs), "params": params})
                else:
                    per_dtype.append({"momentum_buffer": None, "params": params})
            self.combined_param_states_indexed_by_group.append(per_dtype)
        self.is_states_combined = True

    def _group_step(self, group_index):
        group = self.param_groups[group_index]
        states = self.combined_param_states_indexed_by_group[group_index]
        for i, (p, g) in enumerate(zip(self.combined_params_indexed_by_group[group_index],
                                       self.combined_grads_indexed_by_group[group_index])):
            if p is None:
                continue
            d = g.add(p, alpha=group["weight_decay"]) if group["weight_decay"] else g
            if group["momentum"]:
                st = states[i]
                if st["momentum_buffer"] is None:
                    bufs = [torch.clone(d_part).detach() for d_part in _split_like(d, st["params"])]
                    for param, b in zip(st["params"], bufs):
                        self.state[param]["momentum_buffer"] = b
                    st["momentum_buffer"] = npu_combine(bufs)
                else:
                    st["momentum_buffer"].mul_(group["momentum"]).add_(d)
                d = st["momentum_buffer"]
            p.add_(d, alpha=-group["lr"])


class CombinedAdam(NpuFusedOptimizerBase):
    """Adam over the combined buffers (torch.optim.Adam's update, L2 weight decay); state 'step', 'exp_avg',
    'exp_avg_sq' per parameter, views of combined buffers."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _maybe_init_combined_states(self):
        if self.is_states_combined:
            return
        self.combined_param_states_indexed_by_group = []
        for g, _ in enumerate(self.param_groups):
            per_dtype = []
            for params in self.params_lists_indexed_by_group[g]:
                if not params:
                    per_dtype.append(None)
                    continue
                combined = {}
                for key in ("exp_avg", "exp_avg_sq"):
                    ts = []
                    for p in params:
                        st = self.state[p]
                        t = st[key].clone().contiguous() if key in st else torch.zeros_like(p)
                        st[key] = t
                        ts.append(t)
                    combined[key] = npu_combine(ts)
                steps = {float(self.state[p].get("step", torch.tensor(0.))) for p in params}
                assert len(steps) == 1
                combined["step"] = steps.pop()
                combined["params"] = params
                per_dtype.append(combined)
            self.combined_param_states_indexed_by_group.append(per_dtype)
        self.is_states_combined = True

    def _group_step(self, group_index):
        group = self.param_groups[group_index]
        b1, b2 = group["betas"]
        for p, g, st in zip(self.combined_params_indexed_by_group[group_index],
                            self.combined_grads_indexed_by_group[group_index],
                            self.combined_param_states_indexed_by_group[group_index]):
            if p is None:
                continue
            d = g.add(p, alpha=group["weight_decay"]) if group["weight_decay"] else g
            st["step"] += 1
            for param in st["params"]:
                self.state[param]["step"] = torch.tensor(st["step"])
            st["exp_avg"].mul_(b1).add_(d, alpha=1 - b1)
            st["exp_avg_sq"].mul_(b2).addcmul_(d, d, value=1 - b2)
            bc1, bc2 = 1 - b1 ** st["step"], 1 - b2 ** st["step"]
            denom = (st["exp_avg_sq"].sqrt() / bc2 ** 0.5).add_(group["eps"])
            p.addcdiv_(st["exp_avg"], denom, value=-group["lr"] / bc1)


def npu_combine(tensors):
    from torch_npu.utils import npu_combine_tensors
    return npu_combine_tensors(tensors)


def _split_like(flat, params):
    out, i = [], 0
    for p in params:
        out.append(flat[i:i + p.numel()].view_as(p))
        i += p.numel()
    return out


def _model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    return m.to(dtype)


def _batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)) for _ in range(n)]


def _train(model, opt, batches, device):
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(device, model[0].weight.dtype)).float(), y.to(device))
        loss.backward()
        opt.step()


def _groups(model):
    return [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.05}]


@pytest.mark.parametrize("make", [
    pytest.param(lambda ps: (CombinedSGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
                             torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)), id="sgd"),
    pytest.param(lambda ps: (CombinedAdam(ps, lr=0.01, weight_decay=0.01),
                             torch.optim.Adam(ps, lr=0.01, weight_decay=0.01)), id="adam"),
])
def test_subclass_steps_like_torch(make):
    batches = _batches(5)
    fused_model, ref_model = _model().to("npu"), _model()
    fused_opt, _ = make(_groups(fused_model))
    _, ref_opt = make(_groups(ref_model))
    _train(fused_model, fused_opt, batches, "npu")
    _train(ref_model, ref_opt, batches, "cpu")
    for a, b in zip(fused_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)
    assert fused_opt.is_params_grads_combined and fused_opt.is_states_combined


def test_parameters_and_grads_are_views_of_combined_buffers():
    model = _model().to("npu")
    opt = CombinedSGD(_groups(model), lr=0.1)
    _train(model, opt, _batches(1), "npu")
    params, grads = opt.get_combined_params(), opt.get_combined_grads()
    assert grads[1] is None and params[1] is None          # no float16 parameter
    total = sum(p.numel() for p in model.parameters())
    assert params[0].numel() == grads[0].numel() == total
    pstart = params[0].untyped_storage().data_ptr()
    for p in model.parameters():
        assert p.untyped_storage().data_ptr() == pstart
        assert p.grad.untyped_storage().data_ptr() == grads[0].untyped_storage().data_ptr()
    # group slices: group 0 holds the first Linear's parameters, group 1 the second's
    g0 = opt.combined_params_indexed_by_group[0][0]
    assert g0.numel() == 6 * 5 + 5
    assert opt.combined_params_indexed_by_group[1][0].numel() == 5 * 3 + 3
    torch.testing.assert_close(g0[:30].view(5, 6).cpu(), model[0].weight.detach().cpu())
    assert opt.params_lists_indexed_by_group[1][0] == list(model[2].parameters())


def test_float16_parameters_combined_separately():
    lin32 = torch.nn.Linear(3, 2).to("npu")
    lin16 = torch.nn.Linear(3, 2).to("npu", torch.float16)
    opt = CombinedSGD(list(lin32.parameters()) + list(lin16.parameters()), lr=0.1)
    x = torch.randn(4, 3, device="npu")
    (lin32(x).sum() + lin16(x.half()).float().sum()).backward()
    before16 = lin16.weight.detach().clone()
    grad16 = lin16.weight.grad.detach().clone()
    opt.step()
    params = opt.get_combined_params()
    assert params[0].dtype == torch.float32 and params[0].numel() == 8
    assert params[1].dtype == torch.float16 and params[1].numel() == 8
    torch.testing.assert_close(lin16.weight.detach(), before16 - 0.1 * grad16)


def test_other_dtypes_raise():
    lin = torch.nn.Linear(3, 2).to("npu", torch.bfloat16)
    opt = CombinedSGD(lin.parameters(), lr=0.1)
    lin(torch.randn(2, 3, device="npu", dtype=torch.bfloat16)).sum().backward()
    with pytest.raises(TypeError, match="float32 or float16"):
        opt.step()


def test_zero_grad():
    model = _model().to("npu")
    opt = CombinedSGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 6, device="npu")).sum().backward()
    grads = [p.grad for p in model.parameters()]
    opt.zero_grad()
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))   # kept, in the combined buffer
    assert all(bool((p.grad == 0).all()) for p in model.parameters())
    assert bool((opt.get_combined_grads()[0] == 0).all())
    model(torch.randn(2, 6, device="npu")).sum().backward()              # accumulates into the buffer
    assert bool(opt.get_combined_grads()[0].abs().sum() > 0)
    with pytest.raises(ValueError, match="set_to_none"):
        opt.zero_grad(set_to_none=True)


def test_zero_grad_before_any_gradient():
    model = _model().to("npu")
    opt = CombinedSGD(model.parameters(), lr=0.1)
    opt.zero_grad()               # nothing to combine yet
    assert not opt.is_params_grads_combined


def test_hooks_not_implemented():
    class Bare(NpuFusedOptimizerBase):
        pass

    lin = torch.nn.Linear(2, 2).to("npu")
    opt = Bare(lin.parameters(), dict(lr=0.1))
    lin(torch.randn(1, 2, device="npu")).sum().backward()
    with pytest.raises(NotImplementedError):
        opt.step()


@pytest.mark.parametrize("cls,kwargs", [(CombinedSGD, dict(lr=0.1, momentum=0.9)), (CombinedAdam, dict(lr=0.01))],
                         ids=["sgd", "adam"])
def test_state_dict_round_trip(cls, kwargs):
    batches = _batches(6)
    model = _model().to("npu")
    opt = cls(model.parameters(), **kwargs)
    _train(model, opt, batches[:3], "npu")
    saved_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
    saved = opt.state_dict()
    saved = {"state": {k: {n: (t.clone() if torch.is_tensor(t) else t) for n, t in v.items()}
                       for k, v in saved["state"].items()},
             "param_groups": saved["param_groups"]}
    # reference: continue training
    _train(model, opt, batches[3:], "npu")
    # a new model + optimizer loaded from the state dicts ends at the same place
    model2 = _model(seed=5).to("npu")
    model2.load_state_dict(saved_model)
    opt2 = cls(model2.parameters(), **kwargs)
    opt2.load_state_dict(saved)
    _train(model2, opt2, batches[3:], "npu")
    for a, b in zip(model.parameters(), model2.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=1e-6, atol=1e-7)
    # loading into the stepped optimizer itself replaces its combined state
    model3 = _model().to("npu")
    opt3 = cls(model3.parameters(), **kwargs)
    _train(model3, opt3, batches[:1], "npu")
    with torch.no_grad():
        for p, (k, v) in zip(model3.parameters(), saved_model.items()):
            p.copy_(v)
    opt3.load_state_dict(saved)
    _train(model3, opt3, batches[3:], "npu")
    for a, b in zip(model.parameters(), model3.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=1e-6, atol=1e-7)


def test_clip_grad_norm_fused():
    model, ref = _model().to("npu"), _model()
    opt = CombinedSGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 6)
    model(x.to("npu")).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    for norm_type in (2, float("inf")):
        want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5, norm_type=norm_type)
        got = opt.clip_grad_norm_fused_(0.5, norm_type=norm_type)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
        for a, b in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-6)


def test_provided_fused_optimizers_still_work():
    from torch_npu.optim import NpuFusedAdamW, NpuFusedSGD

    for cls, ref_cls, kw in ((NpuFusedSGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
                             (NpuFusedAdamW, torch.optim.AdamW, dict(lr=0.01))):
        model, ref = _model().to("npu"), _model()
        _train(model, cls(model.parameters(), **kw), _batches(3), "npu")
        _train(ref, ref_cls(ref.parameters(), **kw), _batches(3), "cpu")
        for a, b in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)
