"""General tensor operators of torch_npu, each the aten composition its documentation describes (so autograd,
fake tensors, torch.compile and DTensor see the aten ops they decompose into).

* ``npu_linear(input, weight, bias=None)``: ``input @ weight.T + bias``.
* ``npu_max`` / ``npu_min(self, dim, keepdim=False) -> (values, indices)``: torch.max / torch.min along ``dim``,
  the indices int32 (as the documented examples print them).
* ``npu_slice(self, offsets, size)``: the block starting at ``offsets`` of extent ``size`` (-1: to the end).
* ``npu_indexing(self, begin, end, strides, begin_mask, end_mask, ellipsis_mask, new_axis_mask,
  shrink_axis_mask)``: a strided slice; bit ``i`` of a mask applies to entry ``i`` of ``begin``/``end``/``strides``.
* ``npu_reshape(self, shape, can_refresh=False)``: ``self.reshape(shape)`` as a new tensor.
* ``npu_bmmV2(self, mat2, output_sizes)``: ``torch.matmul``; ``output_sizes`` (a hint for the backward), when
  given, must be the product's shape.
* ``npu_transpose_batchmatmul(input, weight, *, bias, scale, perm_x1, perm_x2, perm_y, batch_split_factor)``:
  ``input.permute(perm_x1) @ weight.permute(perm_x2) (+ bias)`` as [B, M, N], returned as [M, B, N].
* ``npu_sort_v2(self, dim=-1, descending=False)``: the sorted values (no indices).
* ``one_(self)``: fills ``self`` with 1. ``copy_memory_(dst, src, non_blocking=False)``: ``dst.copy_(src)``
  between npu tensors of one dtype and device.
* ``fast_gelu(self)``: ``npu_fast_gelu``.
* ``npu_softmax_cross_entropy_with_logits(features, labels)``: per row ``-sum(labels * log_softmax(features))``
  (TensorFlow's op of that name; labels are a distribution per row and get their gradient too).
* ``npu_gather_sparse_index(input, index)``: ``input[index]`` (rows of dim 0); shape ``index.shape +
  input.shape[1:]``.
* ``npu_masked_fill_range(self, start, end, value, axis=-1)``: for mask ``m`` and row ``n``,
  positions ``start[m, n] <= i < end[m, n]`` along ``axis`` of row ``n`` become ``value[m]`` (later masks win).
* ``npu_stride_add(x1, x2, offset1, offset2, c1_len)``: Ascend's 5HD format splits the channel dim 1 into C1
  blocks of C0 = 16 channels (32 for 1-byte dtypes; the last block zero padded); the sum of the ``c1_len`` blocks
  of ``x1`` from block ``offset1`` and of ``x2`` from block ``offset2``, as ``c1_len * C0`` channels (the
  documented example: a 1-channel input gives 16 channels, the padding ones 0).
* ``npu_sign_bits_pack(self, size)`` / ``npu_sign_bits_unpack(input, size, dtype)``: 1-bit Adam's packing; bit
  ``j`` (little-endian) of byte ``i`` is ``x[8 i + j] >= 0``; the input is padded with -1 to a multiple of 8;
  unpacking gives +1 / -1. Both return ``size`` rows.
"""
from __future__ import annotations

import torch


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor (an operator's output never aliases its input, whatever view built it)."""
    return t.clone(memory_format=torch.contiguous_format)


def npu_linear(input, weight, bias=None):
    if weight.dim() != 2 or input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        _fail("npu_linear", f"input {tuple(input.shape)} and weight {tuple(weight.shape)} must be (.., K) and (N, K)")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        _fail("npu_linear", f"bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
    return torch.nn.functional.linear(input, weight, bias)


def npu_max(self, dim, keepdim=False):
    values, indices = torch.max(self, dim, keepdim)
    return values, indices.to(torch.int32)


def npu_min(self, dim, keepdim=False):
    values, indices = torch.min(self, dim, keepdim)
    return values, indices.to(torch.int32)


def npu_slice(self, offsets, size):
    if len(offsets) != self.dim() or len(size) != self.dim():
        _fail("npu_slice", f"offsets {list(offsets)} and size {list(size)} need one entry per dim ({self.dim()})")
    out = self
    for d, (o, s) in enumerate(zip(offsets, size)):
        n = self.shape[d]
        s = n - o if s == -1 else s
        if o < 0 or s < 0 or o + s > n:
            _fail("npu_slice", f"dim {d}: offset {o} and size {s} exceed its extent {n}")
        out = out.narrow(d, o, s)
    return _fresh(out)


# ---- strided slice ------------------------------------------------------------------------------------------
def _dim_slice(n, b, e, s, b_masked, e_masked):
    """(start, stop, step) with step > 0 on the dim, flipped first when ``s`` < 0 (torch slices step forward)."""
    if s > 0:
        b = 0 if b_masked else min(max(b + n if b < 0 else b, 0), n)
        e = n if e_masked else min(max(e + n if e < 0 else e, 0), n)
        return False, slice(b, max(b, e), s)
    b = n - 1 if b_masked else min(max(b + n if b < 0 else b, -1), n - 1)
    e = -1 if e_masked else min(max(e + n if e < 0 else e, -1), n - 1)
    fb, fe = n - 1 - b, n - 1 - e  # positions in the flipped dim
    return True, slice(fb, max(fb, fe), -s)


def npu_indexing(self, begin, end, strides, begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0,
                 shrink_axis_mask=0):
    op = "npu_indexing"
    if not len(begin) == len(end) == len(strides):
        _fail(op, f"begin, end and strides must have one length, got {len(begin)}, {len(end)}, {len(strides)}")
    if any(s == 0 for s in strides):
        _fail(op, f"strides must be nonzero, got {list(strides)}")
    if bin(ellipsis_mask).count("1") > 1:
        _fail(op, "ellipsis_mask may mark at most one entry")
    spec = len(begin)
    consuming = sum(1 for i in range(spec) if not (ellipsis_mask >> i) & 1 and not (new_axis_mask >> i) & 1)
    if consuming > self.dim():
        _fail(op, f"{consuming} indexed dims for a {self.dim()}-D input")
    x, index, d = self, [], 0
    for i in range(spec):
        if (ellipsis_mask >> i) & 1:
            covered = self.dim() - consuming
            index += [slice(None)] * covered
            d += covered
        elif (new_axis_mask >> i) & 1:
            index.append(None)
        elif (shrink_axis_mask >> i) & 1:
            n = self.shape[d]
            b = begin[i] + n if begin[i] < 0 else begin[i]
            if not 0 <= b < n:
                _fail(op, f"shrunk dim {d}: index {begin[i]} is out of range for extent {n}")
            index.append(b)
            d += 1
        else:
            flip, sl = _dim_slice(self.shape[d], begin[i], end[i], strides[i], (begin_mask >> i) & 1,
                                  (end_mask >> i) & 1)
            if flip:
                x = x.flip(d)
            index.append(sl)
            d += 1
    return _fresh(x[tuple(index)])


def npu_reshape(self, shape, can_refresh=False):
    # can_refresh asks Ascend to refresh the storage in place; the values are the same either way
    return _fresh(self.reshape(shape))


def npu_bmmV2(self, mat2, output_sizes):  # noqa: N802  (torch_npu's name)
    out = torch.matmul(self, mat2)
    if len(output_sizes) and list(output_sizes) != list(out.shape):
        _fail("npu_bmmV2", f"output_sizes {list(output_sizes)} differ from the product's shape {list(out.shape)}")
    return out


def npu_transpose_batchmatmul(input, weight, *, bias=None, scale=None, perm_x1=None, perm_x2=None, perm_y=None,
                              batch_split_factor=1):
    op = "npu_transpose_batchmatmul"
    if scale is not None:
        _fail(op, "scale (the int8-quantized output) takes npu_trans_quant_param's packed scales, which npudist "
                  "does not provide; call it without scale")
    if batch_split_factor not in (None, 1):
        _fail(op, f"batch_split_factor {batch_split_factor}: the split output's layout is not documented; use 1")
    if input.dim() != 3 or weight.dim() != 3:
        _fail(op, f"input and weight must be 3-D, got {input.dim()}-D and {weight.dim()}-D")
    perms = {"perm_x1": perm_x1, "perm_x2": perm_x2, "perm_y": perm_y}
    for name, p in perms.items():
        if p is not None and sorted(p) != [0, 1, 2]:
            _fail(op, f"{name} {list(p)} is not a permutation of 3 dims")
    if perm_y is not None and list(perm_y) != [1, 0, 2]:
        _fail(op, f"perm_y {list(perm_y)}: the output is [M, B, N] (perm_y [1, 0, 2])")
    x1 = input.permute(perm_x1 or [0, 1, 2])
    x2 = weight.permute(perm_x2 or [0, 1, 2])
    if x1.shape[0] != x2.shape[0] or x1.shape[2] != x2.shape[1]:
        _fail(op, f"permuted input {tuple(x1.shape)} and weight {tuple(x2.shape)} must be [B, M, K] and [B, K, N]")
    y = torch.bmm(x1, x2)
    if bias is not None:
        y = y + bias
    return y.permute(1, 0, 2).contiguous()


def npu_sort_v2(self, dim=-1, descending=False):
    return torch.sort(self, dim=dim, descending=descending).values


def one_(self):
    return self.fill_(1)


def copy_memory_(self, src, non_blocking=False):
    if self.device.type != "npu" or src.device.type != "npu":
        _fail("copy_memory_", f"both tensors must be npu tensors, got {self.device} and {src.device}")
    if self.dtype != src.dtype or self.device != src.device:
        _fail("copy_memory_", f"dst and src must share dtype and device, got {self.dtype} on {self.device} and "
                              f"{src.dtype} on {src.device}")
    return self.copy_(src, non_blocking)


def npu_softmax_cross_entropy_with_logits(self, labels):
    if self.dim() != 2 or labels.shape != self.shape:
        _fail("npu_softmax_cross_entropy_with_logits", f"features and labels must be (batch, classes) of one shape, "
                                                       f"got {tuple(self.shape)} and {tuple(labels.shape)}")
    return -(labels * torch.log_softmax(self, dim=-1)).sum(-1)


def fast_gelu(self):
    return torch.ops.npu.npu_fast_gelu(self)


def npu_gather_sparse_index(input, index):
    if index.dtype not in (torch.int32, torch.int64):
        _fail("npu_gather_sparse_index", f"index must be int32 or int64, got {index.dtype}")
    if input.dim() == 0:
        _fail("npu_gather_sparse_index", "input must have at least 1 dim")
    return input.index_select(0, index.reshape(-1).long()).reshape(*index.shape, *input.shape[1:])


def npu_masked_fill_range(self, start, end, value, axis=-1):
    op = "npu_masked_fill_range"
    if not 1 <= self.dim() <= 3 or not -self.dim() <= axis < self.dim():
        _fail(op, f"input must be 1-D to 3-D with axis in range, got {self.dim()}-D and axis {axis}")
    axis %= self.dim()
    if self.dim() == 3 and axis != 2:
        _fail(op, "a 3-D input is filled along its last axis")
    if start.dim() != 2 or start.shape != end.shape or value.shape != (start.shape[0],):
        _fail(op, f"start and end must be (num, N) and value (num,), got {tuple(start.shape)}, {tuple(end.shape)}, "
                  f"{tuple(value.shape)}")
    rows = self.movedim(axis, -1).reshape(-1, self.shape[axis])
    if start.shape[1] > rows.shape[0]:
        _fail(op, f"start has {start.shape[1]} rows, the input {rows.shape[0]} along the non-filled dims")
    pos = torch.arange(rows.shape[1], device=self.device)
    hit = (start.unsqueeze(-1) <= pos) & (pos < end.unsqueeze(-1))  # (num, N, D)
    order = torch.arange(1, hit.shape[0] + 1, device=self.device).view(-1, 1, 1)
    last = (hit * order).amax(0) if hit.shape[0] else torch.zeros(hit.shape[1:], dtype=torch.long,
                                                                   device=self.device)
    filled = torch.where(last > 0, value.to(self.dtype)[(last - 1).clamp(min=0)], rows[:start.shape[1]])
    out = torch.cat((filled, rows[start.shape[1]:]), 0)
    shape = list(self.movedim(axis, -1).shape)
    return out.reshape(shape).movedim(-1, axis).contiguous()


def _c1_blocks(op, name, t, offset, c1_len, c0):
    if t.dim() < 2:
        _fail(op, f"{name} must have a channel dim 1, got {t.dim()}-D")
    c1 = (t.shape[1] + c0 - 1) // c0
    if offset < 0 or c1_len <= 0 or offset + c1_len > c1:
        _fail(op, f"{name}: blocks [{offset}, {offset + c1_len}) exceed its {c1} channel blocks of {c0}")
    padded = torch.nn.functional.pad(t.movedim(1, -1), (0, c1 * c0 - t.shape[1])).movedim(-1, 1)
    return padded.narrow(1, offset * c0, c1_len * c0)


def npu_stride_add(self, other, offset1, offset2, c1_len):
    c0 = 32 if self.element_size() == 1 else 16
    offset1, offset2, c1_len = int(offset1), int(offset2), int(c1_len)
    a = _c1_blocks("npu_stride_add", "x1", self, offset1, c1_len, c0)
    b = _c1_blocks("npu_stride_add", "x2", other, offset2, c1_len, c0)
    return a + b


# ---- 1-bit Adam sign packing ------------------------------------------------------------------------------
_BIT = (1, 2, 4, 8, 16, 32, 64, 128)


def npu_sign_bits_pack(self, size):
    if self.dim() != 1 or self.dtype not in (torch.float32, torch.float16):
        _fail("npu_sign_bits_pack", f"input must be a 1-D float32/float16 tensor, got {self.dim()}-D {self.dtype}")
    nbytes = (self.numel() + 7) // 8
    if size <= 0 or nbytes % size:
        _fail("npu_sign_bits_pack", f"size {size} must divide the packed length {nbytes}")
    padded = torch.nn.functional.pad(self, (0, nbytes * 8 - self.numel()), value=-1.0)
    bits = (padded >= 0).to(torch.uint8).view(nbytes, 8)
    weights = torch.tensor(_BIT, dtype=torch.uint8, device=self.device)
    return (bits * weights).sum(1, dtype=torch.uint8).view(size, -1)


def npu_sign_bits_unpack(input, size, dtype):
    if input.dim() != 1 or input.dtype != torch.uint8:
        _fail("npu_sign_bits_unpack", f"input must be a 1-D uint8 tensor, got {input.dim()}-D {input.dtype}")
    if dtype not in (torch.float16, torch.float32):
        _fail("npu_sign_bits_unpack", f"dtype must be torch.float16 or torch.float32, got {dtype}")
    if size <= 0 or (input.numel() * 8) % size:
        _fail("npu_sign_bits_unpack", f"size {size} must divide the unpacked length {input.numel() * 8}")
    weights = torch.tensor(_BIT, dtype=torch.uint8, device=input.device)
    bits = (input.unsqueeze(-1) & weights) != 0
    return torch.where(bits, 1.0, -1.0).to(dtype).view(size, -1)


# ---- scatters ---------------------------------------------------------------------------------------------
def npu_scatter(self, indices, updates, dim):
    """Ascend's ArgMaxGrad form: ``indices``/``updates`` have ``self``'s shape without ``dim`` and place one value
    per line along ``dim`` (``self.scatter`` with both unsqueezed); same-rank ``indices`` are torch.scatter's."""
    if indices.numel() == 0:
        return self.clone()
    if not -self.dim() <= dim < self.dim():
        _fail("npu_scatter", f"dim {dim} is out of range for a {self.dim()}-D input")
    if indices.dim() == self.dim() - 1:
        indices, updates = indices.unsqueeze(dim), updates.unsqueeze(dim)
    if indices.shape != updates.shape or indices.dim() != self.dim():
        _fail("npu_scatter", f"indices {tuple(indices.shape)} and updates {tuple(updates.shape)} must match and have "
                             f"the input's shape without dim {dim} (or its rank)")
    return self.scatter(dim, indices.long(), updates.to(self.dtype))


def _nd_index(op, self, indices, updates):
    if indices.dim() < 2 or indices.shape[-1] > self.dim():
        _fail(op, f"indices must be at least 2-D with a last dim of at most {self.dim()}, got {tuple(indices.shape)}")
    a = indices.shape[-1]
    want = tuple(indices.shape[:-1]) + tuple(self.shape[a:])
    if tuple(updates.shape) != want:
        _fail(op, f"updates must have shape {want} (indices' batch shape + the input's shape after {a} dims), got "
                  f"{tuple(updates.shape)}")
    return tuple(indices[..., k].long() for k in range(a))


def npu_scatter_nd_update(self, indices, updates):
    return self.index_put(_nd_index("npu_scatter_nd_update", self, indices, updates), updates)


def npu_scatter_nd_update_(self, indices, updates):
    return self.index_put_(_nd_index("npu_scatter_nd_update_", self, indices, updates), updates)


def _update_index(op, data, indices, updates, axis):
    """The scatter index along ``axis``: batch row ``i`` writes positions ``indices[i] + k``, k < updates' extent."""
    if data.dim() < 2 or updates.dim() != data.dim():
        _fail(op, f"data must be 2-D to 8-D and updates of the same rank, got {data.dim()}-D and {updates.dim()}-D")
    if not -data.dim() <= axis < data.dim() or axis % data.dim() == 0:
        _fail(op, f"axis {axis} must be a non-batch dim of the {data.dim()}-D data")
    if indices.dim() != 1:
        _fail(op, f"indices must be 1-D (one offset per batch row); the {indices.dim()}-D form is not documented")
    axis %= data.dim()
    if indices.shape[0] != data.shape[0] or updates.shape[0] != data.shape[0]:
        _fail(op, f"indices and updates need one row per batch row of data ({data.shape[0]})")
    for d in range(1, data.dim()):
        if d != axis and updates.shape[d] != data.shape[d]:
            _fail(op, f"updates {tuple(updates.shape)} must match data {tuple(data.shape)} except along axis {axis}")
    view = [-1] + [1] * (data.dim() - 1)
    k = torch.arange(updates.shape[axis], device=data.device).view([1] * axis + [-1] + [1] * (data.dim() - axis - 1))
    return axis, (indices.long().view(view) + k).expand(updates.shape)


def scatter_update(self, indices, updates, axis):
    axis, index = _update_index("scatter_update", self, indices, updates, axis)
    return self.scatter(axis, index, updates)


def scatter_update_(self, indices, updates, axis):
    axis, index = _update_index("scatter_update_", self, indices, updates, axis)
    return self.scatter_(axis, index, updates)


def apply_adam_w_out(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad, max_grad_norm, amsgrad,
                     maximize, var, m, v):
    """``torch_npu.npu_apply_adam_w_out``: ``npu_apply_adam_w`` with the state passed positionally, returned."""
    torch.ops.npu.npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad,
                                   max_grad_norm, amsgrad, maximize, var, m, v)
    return var, m, v


def _out_form(fn):
    def run(*args, out):
        result = fn(*args)
        if out.shape != result.shape:
            out.resize_(result.shape)
        return out.copy_(result)
    return run


_lib = torch.library.Library("npu", "FRAGMENT")
for _name, _args, _ret, _fn, _with_out in (
        ("npu_linear", "(Tensor input, Tensor weight, Tensor? bias=None)", "Tensor", npu_linear, False),
        ("npu_max", "(Tensor self, int dim, bool keepdim=False)", "(Tensor values, Tensor indices)", npu_max, False),
        ("npu_max.dim", "(Tensor self, int dim, bool keepdim=False)", "(Tensor values, Tensor indices)", npu_max,
         False),
        ("npu_min", "(Tensor self, int dim, bool keepdim=False)", "(Tensor values, Tensor indices)", npu_min, False),
        ("npu_min.dim", "(Tensor self, int dim, bool keepdim=False)", "(Tensor values, Tensor indices)", npu_min,
         False),
        ("npu_slice", "(Tensor self, int[] offsets, int[] size)", "Tensor", npu_slice, True),
        ("npu_indexing", "(Tensor self, int[] begin, int[] end, int[] strides, int begin_mask=0, int end_mask=0, "
                         "int ellipsis_mask=0, int new_axis_mask=0, int shrink_axis_mask=0)", "Tensor", npu_indexing,
         True),
        ("npu_reshape", "(Tensor self, int[] shape, bool can_refresh=False)", "Tensor", npu_reshape, True),
        ("npu_bmmV2", "(Tensor self, Tensor mat2, int[] output_sizes)", "Tensor", npu_bmmV2, False),
        ("npu_transpose_batchmatmul", "(Tensor input, Tensor weight, *, Tensor? bias=None, Tensor? scale=None, "
                                      "int[]? perm_x1=None, int[]? perm_x2=None, int[]? perm_y=None, "
                                      "int? batch_split_factor=1)", "Tensor", npu_transpose_batchmatmul, False),
        ("npu_sort_v2", "(Tensor self, int dim=-1, bool descending=False)", "Tensor", npu_sort_v2, True),
        ("one_", "(Tensor(a!) self)", "Tensor(a!)", one_, False),
        ("copy_memory_", "(Tensor(a!) self, Tensor src, bool non_blocking=False)", "Tensor(a!)", copy_memory_, False),
        ("fast_gelu", "(Tensor self)", "Tensor", fast_gelu, False),
        ("npu_softmax_cross_entropy_with_logits", "(Tensor self, Tensor labels)", "Tensor",
         npu_softmax_cross_entropy_with_logits, False),
        ("npu_gather_sparse_index", "(Tensor input, Tensor index)", "Tensor", npu_gather_sparse_index, False),
        ("npu_masked_fill_range", "(Tensor self, Tensor start, Tensor end, Tensor value, int axis=-1)", "Tensor",
         npu_masked_fill_range, False),
        ("npu_stride_add", "(Tensor self, Tensor other, Scalar offset1, Scalar offset2, Scalar c1_len)", "Tensor",
         npu_stride_add, False),
        ("npu_sign_bits_pack", "(Tensor self, int size)", "Tensor", npu_sign_bits_pack, False),
        ("npu_sign_bits_unpack", "(Tensor input, int size, ScalarType dtype)", "Tensor", npu_sign_bits_unpack, False),
        ("npu_scatter", "(Tensor self, Tensor indices, Tensor updates, int dim)", "Tensor", npu_scatter, False),
        ("npu_scatter_nd_update", "(Tensor self, Tensor indices, Tensor updates)", "Tensor", npu_scatter_nd_update,
         False),
        ("npu_scatter_nd_update_", "(Tensor(a!) self, Tensor indices, Tensor updates)", "Tensor(a!)",
         npu_scatter_nd_update_, False),
        ("scatter_update", "(Tensor self, Tensor indices, Tensor updates, int axis)", "Tensor", scatter_update, False),
        ("scatter_update_", "(Tensor(a!) self, Tensor indices, Tensor updates, int axis)", "Tensor(a!)",
         scatter_update_, False),
        ("npu_apply_adam_w_out", "(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar weight_decay, "
                                 "Scalar beta1, Scalar beta2, Scalar epsilon, Tensor grad, Tensor? max_grad_norm, "
                                 "bool? amsgrad, bool? maximize, Tensor(a!) var, Tensor(b!) m, Tensor(c!) v)",
         "(Tensor(a!), Tensor(b!), Tensor(c!))", apply_adam_w_out, False)):
    _lib.define(f"{_name}{_args} -> {_ret}")
    _lib.impl(_name, _fn, "CompositeImplicitAutograd")
    if _with_out:
        _lib.define(f"{_name}.out{_args[:-1]}, *, Tensor(a!) out) -> Tensor(a!)")
        _lib.impl(f"{_name}.out", _out_form(_fn), "CompositeImplicitAutograd")
