"""torch_npu's dropout forms and sampling operators.

* ``_npu_dropout(self, p) -> (out, mask)``: each element is kept with probability ``1 - p`` and scaled by
  ``1 / (1 - p)``. ``mask`` is Ascend's bit mask: uint8, one bit per element (bit ``j`` of byte ``i`` for
  element ``8 i + j``, 1 = kept), its length rounded up to 128 elements (16 bytes); padding bits are 0.
  Backward: ``grad * bit / (1 - p)``.
* ``npu_dropout_with_add_softmax(self, x1, alpha, prob, dim) -> (mask, softmax_out, out)``:
  ``softmax_out = softmax(x1 + alpha * self, dim)``, ``out`` = that dropped out with drop probability ``prob``
  (kept values scaled by ``1 / (1 - prob)``, as the documented example shows: prob 0.9 keeps a tenth), ``mask``
  as above. The gradient flows from ``out`` to ``self`` (times ``alpha``) and ``x1``.
* ``npu_random_choice_with_mask(x, count=256, seed=0, seed2=0) -> (y, mask)``: the indices of ``x``'s nonzero
  elements in a random order, ``count`` rows of ``x.dim()`` int32 coordinates (``count`` 0: all of them),
  rows past the nonzero count are 0 with ``mask`` False. ``seed``/``seed2`` both 0 draw from the npu generator;
  otherwise the order is a fixed function of the two seeds.
* ``npu_sim_exponential_(self, lambd=1, *, generator=None)``: fills ``self`` with ``-ln(1 - u) / lambd``,
  ``u ~ U(0, 1]``.
* ``npu_top_k_top_p(logits, p=None, k=None)``: the documented filter, step by step: sort ascending (stable);
  values below the k-th largest become -inf; of the softmax of what is left, the smallest values whose
  cumulative sum is <= 1 - p become -inf (the largest always stays); results go back to their positions.
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

_BLOCK = 128  # Ascend's dropout masks cover whole blocks of 128 elements
_BIT = (1, 2, 4, 8, 16, 32, 64, 128)


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _mask_bytes(numel: int) -> int:
    return (numel + _BLOCK - 1) // _BLOCK * _BLOCK // 8


def _pack(keep: torch.Tensor) -> torch.Tensor:
    flat = keep.reshape(-1).to(torch.uint8)
    nbytes = _mask_bytes(flat.numel())
    flat = torch.nn.functional.pad(flat, (0, nbytes * 8 - flat.numel()))
    return (flat.view(nbytes, 8) * torch.tensor(_BIT, dtype=torch.uint8, device=keep.device)).sum(1, dtype=torch.uint8)


def _unpack(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if mask.dtype != torch.uint8 or mask.numel() != _mask_bytes(like.numel()):
        _fail("npu_dropout", f"mask must be uint8 of {_mask_bytes(like.numel())} bytes for {like.numel()} elements, "
                             f"got {mask.dtype} of {mask.numel()}")
    bits = (mask.reshape(-1, 1) & torch.tensor(_BIT, dtype=torch.uint8, device=mask.device)) != 0
    return bits.reshape(-1)[:like.numel()].view(like.shape)


def _check_p(op, p):
    if not 0.0 <= p <= 1.0:
        _fail(op, f"the drop probability must be in [0, 1], got {p}")


def _scale(p):
    return 0.0 if p == 1.0 else 1.0 / (1.0 - p)


def _up(x):
    """16-bit inputs are computed in float32; float32/float64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _keep(like, p):
    return torch.rand(like.shape, device=like.device) >= p


# ---- _npu_dropout ---------------------------------------------------------------------------------------------
@custom_op("npu::_npu_dropout", mutates_args=(), device_types="npu",
           schema="(Tensor self, float p) -> (Tensor, Tensor)")
def _npu_dropout(x, p):
    _check_p("_npu_dropout", p)
    keep = _keep(x, p)
    return x * keep * _scale(p), _pack(keep)


@_npu_dropout.register_fake
def _(x, p):
    _check_p("_npu_dropout", p)
    return torch.empty_like(x), x.new_empty(_mask_bytes(x.numel()), dtype=torch.uint8)


@custom_op("npu::npu_dropout_backward", mutates_args=(), device_types="npu",
           schema="(Tensor grad_output, Tensor mask, float p) -> Tensor")
def npu_dropout_backward(grad, mask, p):
    return grad * _unpack(mask, grad) * _scale(p)


@npu_dropout_backward.register_fake
def _(grad, mask, p):
    return torch.empty_like(grad)


def _dropout_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.p = inputs[1]


register_autograd("npu::_npu_dropout",
                  lambda ctx, g, _gm: (torch.ops.npu.npu_dropout_backward(g, ctx.saved_tensors[0], ctx.p), None),
                  setup_context=_dropout_setup)


# ---- dropout with add + softmax ---------------------------------------------------------------------------------
def _check_das(x, x1, prob, dim):
    _check_p("npu_dropout_with_add_softmax", prob)
    if x.shape != x1.shape:
        _fail("npu_dropout_with_add_softmax", f"self {tuple(x.shape)} and x1 {tuple(x1.shape)} must have one shape")
    if x.dim() == 0 or not -x.dim() <= dim < x.dim():
        _fail("npu_dropout_with_add_softmax", f"dim {dim} is out of range for a {x.dim()}-D input")


@custom_op("npu::npu_dropout_with_add_softmax", mutates_args=(), device_types="npu",
           schema="(Tensor self, Tensor x1, Scalar alpha, float prob, int dim) -> (Tensor, Tensor, Tensor)")
def npu_dropout_with_add_softmax(x, x1, alpha, prob, dim):
    _check_das(x, x1, prob, dim)
    y = _up(x1) + _up(x) * alpha
    soft = torch.softmax(y, dim)
    keep = _keep(x, prob)
    return _pack(keep), soft.to(x.dtype), (soft * keep * _scale(prob)).to(x.dtype)


@npu_dropout_with_add_softmax.register_fake
def _(x, x1, alpha, prob, dim):
    _check_das(x, x1, prob, dim)
    return x.new_empty(_mask_bytes(x.numel()), dtype=torch.uint8), torch.empty_like(x), torch.empty_like(x)


@custom_op("npu::npu_dropout_with_add_softmax_backward", mutates_args=(), device_types="npu",
           schema="(Tensor grad, Tensor mask, Tensor softmax_out, Scalar alpha, float prob, int dim) "
                  "-> (Tensor, Tensor)")
def npu_dropout_with_add_softmax_backward(grad, mask, softmax_out, alpha, prob, dim):
    s = _up(softmax_out)
    g = _up(grad) * _unpack(mask, grad) * _scale(prob)
    dy = s * (g - (g * s).sum(dim, keepdim=True))
    return (dy * alpha).to(grad.dtype), dy.to(grad.dtype)


@npu_dropout_with_add_softmax_backward.register_fake
def _(grad, mask, softmax_out, alpha, prob, dim):
    return torch.empty_like(grad), torch.empty_like(grad)


def _das_setup(ctx, inputs, output):
    ctx.save_for_backward(output[0], output[1])
    ctx.cfg = inputs[2:]


def _das_backward(ctx, _g_mask, _g_soft, grad):
    mask, soft = ctx.saved_tensors
    dx, dx1 = torch.ops.npu.npu_dropout_with_add_softmax_backward(grad, mask, soft, *ctx.cfg)
    return dx, dx1, None, None, None


register_autograd("npu::npu_dropout_with_add_softmax", _das_backward, setup_context=_das_setup)


# ---- random choice with mask ---------------------------------------------------------------------------------
def _choice_rows(x, count):
    if count < 0:
        _fail("npu_random_choice_with_mask", f"count must be >= 0 (0: every nonzero element), got {count}")
    if x.dim() == 0:
        _fail("npu_random_choice_with_mask", "x must have at least 1 dim")


@custom_op("npu::npu_random_choice_with_mask", mutates_args=(), device_types="npu",
           schema="(Tensor x, int count=256, int seed=0, int seed2=0) -> (Tensor, Tensor)")
def npu_random_choice_with_mask(x, count=256, seed=0, seed2=0):
    _choice_rows(x, count)
    nz = x.nonzero()
    n = nz.shape[0]
    if seed == 0 and seed2 == 0:
        order = torch.randperm(n, device=x.device)
    else:  # a fixed order per seed pair, drawn on the host (a permutation of the nonzero count only)
        order = torch.randperm(n, generator=torch.Generator().manual_seed((seed << 32) ^ seed2)).to(x.device)
    picked = nz[order].to(torch.int32)
    rows = n if count == 0 else count
    y = torch.zeros(rows, x.dim(), dtype=torch.int32, device=x.device)
    take = min(rows, n)
    y[:take] = picked[:take]
    mask = torch.arange(rows, device=x.device) < take
    return y, mask


@npu_random_choice_with_mask.register_fake
def _(x, count=256, seed=0, seed2=0):
    _choice_rows(x, count)
    rows = torch.library.get_ctx().new_dynamic_size() if count == 0 else count
    return x.new_empty(rows, x.dim(), dtype=torch.int32), x.new_empty(rows, dtype=torch.bool)


# ---- exponential fill ----------------------------------------------------------------------------------------
def npu_sim_exponential_(self, lambd=1, *, generator=None):
    if not lambd > 0:
        _fail("npu_sim_exponential_", f"lambd must be a positive real, got {lambd}")
    if not self.is_floating_point():
        _fail("npu_sim_exponential_", f"self must be a floating tensor, got {self.dtype}")
    # torch.rand draws r in [0, 1); r plays 1 - u for u ~ U(0, 1]
    r = torch.rand(self.shape, generator=generator, device=self.device, dtype=torch.float32)
    return self.copy_(-torch.log(r) / lambd)


# ---- top-k / top-p filter -------------------------------------------------------------------------------------
def npu_top_k_top_p(logits, p=None, k=None):
    op = "npu_top_k_top_p"
    if p is None and k is None:
        _fail(op, "pass p, k or both")
    if logits.dim() != 2:
        _fail(op, f"logits must be 2-D, got {logits.dim()}-D")
    for name, t in (("p", p), ("k", k)):
        if t is not None and tuple(t.shape) != (logits.shape[0],):
            _fail(op, f"{name} must be ({logits.shape[0]},), got {tuple(t.shape)}")
    values, order = torch.sort(logits, dim=-1, stable=True)
    ninf = torch.full((), float("-inf"), dtype=logits.dtype, device=logits.device)
    if k is not None:
        kth = values.gather(-1, (logits.shape[1] - k.long()).clamp(0, logits.shape[1] - 1).unsqueeze(-1))
        values = torch.where(values < kth, ninf, values)
    if p is not None:
        cum = torch.softmax(values.float(), dim=-1).cumsum(-1)
        drop = cum <= (1 - p.float()).unsqueeze(-1)
        drop[:, -1] = False
        values = torch.where(drop, ninf, values)
    return torch.empty_like(logits).scatter(-1, order, values)


_lib = torch.library.Library("npu", "FRAGMENT")
for _schema, _fn in (
        ("npu_sim_exponential_(Tensor(a!) self, float lambd=1, *, Generator? generator=None) -> Tensor(a!)",
         npu_sim_exponential_),
        ("npu_top_k_top_p(Tensor logits, Tensor? p=None, Tensor? k=None) -> Tensor", npu_top_k_top_p)):
    _lib.define(_schema)
    _lib.impl(_schema.split("(", 1)[0], _fn, "CompositeImplicitAutograd")
