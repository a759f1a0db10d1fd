"""The ONNX operators of npudist's offline models, as torch functions, and the graph executor.

Each operator is ``f(inputs, attrs) -> tensor or tuple of tensors``: ``inputs`` the node's input tensors (None for
an absent optional input), ``attrs`` its attributes with ONNX's names (tensor attributes already tensors). The
semantics follow the ONNX operator specification (opset 13-17); an attribute value or input this module does not
implement raises :class:`Unsupported` naming it, so atc refuses the model instead of computing something else.
"""
import math

import torch
import torch.nn.functional as F


class Unsupported(Exception):
    """An operator, attribute value or input form the executor does not implement."""


# ONNX TensorProto data types -> torch
ONNX_DTYPES = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32, 7: torch.int64,
               9: torch.bool, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16}


def _ints(t):
    return [int(v) for v in t.reshape(-1).tolist()]


def _unary(fn):
    return lambda inputs, attrs: fn(inputs[0])


def _binary(fn):
    return lambda inputs, attrs: fn(inputs[0], inputs[1])


def _div(a, b):
    if a.dtype.is_floating_point:
        return a / b
    return torch.div(a, b, rounding_mode="trunc")


def _mod(inputs, attrs):
    a, b = inputs
    if attrs.get("fmod", 0):
        return torch.fmod(a, b)
    if a.dtype.is_floating_point:
        raise Unsupported("Mod with fmod=0 on floating-point tensors (ONNX requires fmod=1)")
    return torch.remainder(a, b)


def _spatial_padding(x, pads, value):
    """Apply ONNX pads [x1_begin, x2_begin, ..., x1_end, x2_end, ...] to the spatial dimensions of x."""
    n = len(pads) // 2
    torch_pads = []
    for i in reversed(range(n)):
        torch_pads += [pads[i], pads[i + n]]
    return F.pad(x, torch_pads, value=value)


def _check_auto_pad(attrs, op):
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        raise Unsupported(f"{op} with auto_pad={auto_pad}")


def _conv(inputs, attrs):
    x, w, b = (inputs + [None])[:3]
    _check_auto_pad(attrs, "Conv")
    nd = w.dim() - 2
    if nd not in (1, 2, 3):
        raise Unsupported(f"Conv over {nd} spatial dimensions")
    pads = attrs.get("pads", [0] * 2 * nd)
    if pads[:nd] != pads[nd:]:
        x, pads = _spatial_padding(x, pads, 0.0), [0] * 2 * nd
    conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    return conv(x, w, b, stride=attrs.get("strides", [1] * nd), padding=pads[:nd],
                dilation=attrs.get("dilations", [1] * nd), groups=attrs.get("group", 1))


def _pool_common(x, attrs, op):
    _check_auto_pad(attrs, op)
    k = attrs["kernel_shape"]
    nd = len(k)
    if nd not in (1, 2, 3):
        raise Unsupported(f"{op} over {nd} spatial dimensions")
    return k, nd, attrs.get("strides", [1] * nd), attrs.get("pads", [0] * 2 * nd), bool(attrs.get("ceil_mode", 0))


def _max_pool(inputs, attrs):
    x = inputs[0]
    k, nd, strides, pads, ceil = _pool_common(x, attrs, "MaxPool")
    if attrs.get("storage_order", 0):
        raise Unsupported("MaxPool with storage_order=1")
    if pads[:nd] != pads[nd:]:
        x, pads = _spatial_padding(x, pads, float("-inf")), [0] * 2 * nd
    pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
    return pool(x, k, strides, pads[:nd], dilation=attrs.get("dilations", [1] * nd), ceil_mode=ceil)


def _avg_pool(inputs, attrs):
    x = inputs[0]
    k, nd, strides, pads, ceil = _pool_common(x, attrs, "AveragePool")
    include = bool(attrs.get("count_include_pad", 0))
    if pads[:nd] != pads[nd:]:
        if not include:
            raise Unsupported("AveragePool with asymmetric pads and count_include_pad=0")
        x, pads = _spatial_padding(x, pads, 0.0), [0] * 2 * nd
    if any(d != 1 for d in attrs.get("dilations", [1] * nd)):
        raise Unsupported("AveragePool with dilations")
    pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nd - 1]
    return pool(x, k, strides, pads[:nd], ceil_mode=ceil, count_include_pad=include)


def _global_pool(reduce):
    def f(inputs, attrs):
        x = inputs[0]
        dims = tuple(range(2, x.dim()))
        return x.mean(dims, keepdim=True) if reduce == "mean" else x.amax(dims, keepdim=True)
    return f


def _batch_norm(inputs, attrs):
    x, scale, bias, mean, var = inputs[:5]
    if attrs.get("training_mode", 0):
        raise Unsupported("BatchNormalization with training_mode=1")
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, attrs.get("epsilon", 1e-5))


def _flatten(inputs, attrs):
    x = inputs[0]
    axis = attrs.get("axis", 1)
    axis = axis + x.dim() if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def _gemm(inputs, attrs):
    a, b, c = (inputs + [None])[:3]
    if attrs.get("transA", 0):
        a = a.t()
    if attrs.get("transB", 0):
        b = b.t()
    y = a @ b
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return y


def _softmax(fn):
    return lambda inputs, attrs: fn(inputs[0], dim=attrs.get("axis", -1))


def _layer_norm(inputs, attrs):
    x, scale, bias = (inputs + [None, None])[:3]
    axis = attrs.get("axis", -1)
    axis = axis + x.dim() if axis < 0 else axis
    if attrs.get("stash_type", 1) != 1:
        raise Unsupported("LayerNormalization with stash_type other than 1 (float32)")
    return F.layer_norm(x, x.shape[axis:], scale, bias, attrs.get("epsilon", 1e-5))


def _reduce(name, fn, axes_from_input):
    def f(inputs, attrs):
        x = inputs[0]
        if axes_from_input:
            axes = _ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        else:
            axes = attrs.get("axes")
        keep = bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.dim()))
        return fn(x, axes, keep)
    return f


def _reshape(inputs, attrs):
    x, shape = inputs[0], _ints(inputs[1])
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _transpose(inputs, attrs):
    x = inputs[0]
    return x.permute(attrs.get("perm", list(reversed(range(x.dim())))))


def _shape(inputs, attrs):
    shape = list(inputs[0].shape)
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return torch.tensor(shape[slice(start, end)], dtype=torch.int64)


def _gather(inputs, attrs):
    x, idx = inputs
    axis = attrs.get("axis", 0)
    axis = axis + x.dim() if axis < 0 else axis
    idx = torch.where(idx < 0, idx + x.shape[axis], idx).to(torch.int64)
    out = x.index_select(axis, idx.reshape(-1).to(x.device))
    return out.reshape(list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:]))


def _unsqueeze(inputs, attrs):
    x = inputs[0]
    axes = sorted(a + x.dim() + len(_ints(inputs[1])) if a < 0 else a for a in _ints(inputs[1]))
    for a in axes:
        x = x.unsqueeze(a)
    return x


def _squeeze(inputs, attrs):
    x = inputs[0]
    if len(inputs) < 2 or inputs[1] is None:
        return x.squeeze()
    axes = [a + x.dim() if a < 0 else a for a in _ints(inputs[1])]
    for a in sorted(axes, reverse=True):
        if x.shape[a] != 1:
            raise Unsupported(f"Squeeze of axis {a} of size {x.shape[a]}")
        x = x.squeeze(a)
    return x


def _concat(inputs, attrs):
    return torch.cat([t for t in inputs if t is not None], dim=attrs["axis"])


def _slice(inputs, attrs):
    x = inputs[0]
    starts, ends = _ints(inputs[1]), _ints(inputs[2])
    axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
    steps = _ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = axis + x.dim() if axis < 0 else axis
        if step == 0:
            raise Unsupported("Slice with step 0")
        index = torch.arange(*slice(start, end, step).indices(x.shape[axis]), device=x.device)
        x = x.index_select(axis, index)
    return x


def _cast(inputs, attrs):
    to = attrs["to"]
    if to not in ONNX_DTYPES:
        raise Unsupported(f"Cast to ONNX data type {to}")
    return inputs[0].to(ONNX_DTYPES[to])


def _constant(inputs, attrs):
    for key, make in (("value", lambda v: v), ("value_float", lambda v: torch.tensor(v, dtype=torch.float32)),
                      ("value_int", lambda v: torch.tensor(v, dtype=torch.int64)),
                      ("value_floats", lambda v: torch.tensor(v, dtype=torch.float32)),
                      ("value_ints", lambda v: torch.tensor(v, dtype=torch.int64))):
        if key in attrs:
            return make(attrs[key])
    raise Unsupported("Constant without value, value_float(s) or value_int(s)")


def _constant_of_shape(inputs, attrs):
    value = attrs.get("value", torch.zeros(1, dtype=torch.float32))
    return torch.full(_ints(inputs[0]), value.reshape(-1)[0].item(), dtype=value.dtype, device=inputs[0].device)


def _expand(inputs, attrs):
    x, shape = inputs[0], _ints(inputs[1])
    return x.expand(torch.broadcast_shapes(x.shape, tuple(shape))).contiguous()


def _range(inputs, attrs):
    start, limit, delta = (t.item() for t in inputs)
    return torch.arange(start, limit, delta, dtype=inputs[0].dtype)


def _split(inputs, attrs):
    x = inputs[0]
    axis = attrs.get("axis", 0)
    if len(inputs) > 1 and inputs[1] is not None:
        return tuple(torch.split(x, _ints(inputs[1]), dim=axis))
    n = attrs.get("num_outputs")
    if n is None:
        raise Unsupported("Split without a split input or num_outputs")
    return tuple(torch.tensor_split(x, n, dim=axis))


def _clip(inputs, attrs):
    x, lo, hi = (inputs + [None, None])[:3]
    return torch.clamp(x, min=lo.item() if lo is not None else None, max=hi.item() if hi is not None else None)


def _dropout(inputs, attrs):
    if len(inputs) > 2 and inputs[2] is not None and bool(inputs[2].item()):
        raise Unsupported("Dropout with training_mode=true")
    return inputs[0]


def _variadic(fn):
    def f(inputs, attrs):
        out = inputs[0]
        for t in inputs[1:]:
            out = fn(out, t)
        return out
    return f


OPS = {
    "Add": _binary(torch.add), "Sub": _binary(torch.sub), "Mul": _binary(torch.mul), "Div": _binary(_div),
    "Pow": _binary(torch.pow), "Mod": _mod, "MatMul": _binary(torch.matmul),
    "Equal": _binary(torch.eq), "Less": _binary(torch.lt), "Greater": _binary(torch.gt),
    "LessOrEqual": _binary(torch.le), "GreaterOrEqual": _binary(torch.ge),
    "And": _binary(torch.logical_and), "Or": _binary(torch.logical_or), "Not": _unary(torch.logical_not),
    "Where": lambda i, a: torch.where(i[0], i[1], i[2]),
    "Max": _variadic(torch.maximum), "Min": _variadic(torch.minimum), "Sum": _variadic(torch.add),
    "Relu": _unary(torch.relu), "Sigmoid": _unary(torch.sigmoid), "Tanh": _unary(torch.tanh),
    "Erf": _unary(torch.erf), "Sqrt": _unary(torch.sqrt), "Exp": _unary(torch.exp), "Log": _unary(torch.log),
    "Neg": _unary(torch.neg), "Abs": _unary(torch.abs), "Reciprocal": _unary(torch.reciprocal),
    "Identity": _unary(lambda x: x),
    "LeakyRelu": lambda i, a: F.leaky_relu(i[0], a.get("alpha", 0.01)),
    "Gelu": lambda i, a: F.gelu(i[0], approximate=a.get("approximate", "none")),
    "Clip": _clip, "Dropout": _dropout,
    "Conv": _conv, "MaxPool": _max_pool, "AveragePool": _avg_pool,
    "GlobalAveragePool": _global_pool("mean"), "GlobalMaxPool": _global_pool("max"),
    "BatchNormalization": _batch_norm, "Flatten": _flatten, "Gemm": _gemm,
    "Softmax": _softmax(torch.softmax), "LogSoftmax": _softmax(torch.log_softmax),
    "LayerNormalization": _layer_norm,
    "ReduceMean": _reduce("ReduceMean", lambda x, ax, k: x.mean(ax, keepdim=k), False),
    "ReduceSum": _reduce("ReduceSum", lambda x, ax, k: x.sum(ax, keepdim=k), True),
    "ReduceMax": _reduce("ReduceMax", lambda x, ax, k: x.amax(ax, keepdim=k), False),
    "Reshape": _reshape, "Transpose": _transpose, "Shape": _shape, "Gather": _gather,
    "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Concat": _concat, "Slice": _slice, "Cast": _cast,
    "Constant": _constant, "ConstantOfShape": _constant_of_shape, "Expand": _expand, "Range": _range,
    "Split": _split,
}

# Operators whose result depends only on the input's shape (folded once shapes are static).
SHAPE_ONLY = {"Shape"}


def resolve_attrs(attrs, weights):
    """The attributes with ``{"weight": name}`` replaced by the weight tensor."""
    return {k: weights[v["weight"]] if isinstance(v, dict) and "weight" in v else v for k, v in attrs.items()}


def run_node(node, values, weights):
    """Execute one node: read its inputs from ``values``, store its outputs there."""
    fn = OPS.get(node["op"])
    if fn is None:
        raise Unsupported(f"operator {node['op']}")
    inputs = [values[n] if n else None for n in node["inputs"]]
    out = fn(inputs, resolve_attrs(node.get("attrs", {}), weights))
    outs = out if isinstance(out, tuple) else (out,)
    for name, t in zip(node["outputs"], outs):
        if name:
            values[name] = t


def run(graph, weights, feeds):
    """The graph's outputs (a list) for ``feeds`` ({input name: tensor}); ``weights`` on the feeds' device."""
    values = dict(weights)
    values.update(feeds)
    for node in graph["nodes"]:
        run_node(node, values, weights)
    return [values[o["name"]] for o in graph["outputs"]]
