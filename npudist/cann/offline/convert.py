"""ONNX -> npudist offline graph: parse (``onnx``, imported lazily), fix the input shapes, check every operator,
fold what does not depend on the inputs' values, drop what the outputs do not need.

Errors raise :class:`ConvertError` with an ATC error code: ``E10001`` for an argument (a missing or dynamic input
shape, an unknown input name), ``E19999`` for the model itself (unreadable, an unsupported operator, a node that
fails to compute).
"""
import torch

from npudist.cann.offline import ops


class ConvertError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def import_onnx():
    try:
        import onnx
        from onnx import numpy_helper  # noqa: F401
    except ImportError as e:
        raise ConvertError("E19999", f"parsing an ONNX model needs the onnx package ({e}): pip install onnx") from None
    return onnx


def parse_input_shape(text):
    """--input_shape "a:1,3,8,8;b:2,4" -> {"a": [1, 3, 8, 8], "b": [2, 4]}."""
    shapes = {}
    for item in filter(None, (part.strip() for part in (text or "").split(";"))):
        name, sep, dims = item.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shape = [int(d) for d in dims.split(",")] if dims.strip() else []
        except ValueError:
            raise ConvertError("E10001", f"Value [{text}] for parameter [--input_shape] is invalid. Reason: "
                               "expected \"name:d1,d2,...;name2:...\" with integer dimensions") from None
        if any(d <= 0 for d in shape):
            raise ConvertError("E10001", f"Value [{item}] for parameter [--input_shape] is invalid. Reason: "
                               "dynamic dimensions (-1, ranges) need dynamic shape support, which npudist's atc "
                               "does not have: give fixed positive dimensions")
        shapes[name] = shape
    return shapes


def _attr_value(onnx, attr, node_name, weights):
    from onnx import numpy_helper

    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        name = f"{node_name}/{attr.name}"
        weights[name] = _tensor(numpy_helper.to_array(value))
        return {"weight": name}
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    if isinstance(value, (int, float)) or (isinstance(value, list) and all(isinstance(v, (int, float))
                                                                           for v in value)):
        return value
    raise ConvertError("E19999", f"node [{node_name}]: attribute [{attr.name}] of a kind npudist's atc does not "
                       "convert (graphs, sparse tensors, type protos)")


def _tensor(array):
    import numpy as np

    return torch.from_numpy(np.array(array, copy=True))


def convert(model_path, input_shape=None, soc_version=""):
    """(graph dict, {weight name: cpu tensor}) of an ONNX file; ConvertError when it cannot be converted."""
    onnx = import_onnx()
    from onnx import numpy_helper

    try:
        model = onnx.load(model_path)
        onnx.checker.check_model(model)
    except Exception as e:  # protobuf's DecodeError, onnx's ValidationError, OSError
        raise ConvertError("E19999", f"the ONNX model {model_path} cannot be parsed: "
                           f"{type(e).__name__}: {str(e).strip() or 'invalid protobuf'}") from None
    g = model.graph
    weights = {init.name: _tensor(numpy_helper.to_array(init)) for init in g.initializer}
    shapes = parse_input_shape(input_shape)
    inputs = []
    graph_inputs = [i for i in g.input if i.name not in weights]
    known = {i.name for i in graph_inputs}
    for name in shapes:
        if name not in known:
            raise ConvertError("E10001", f"Value [{name}] for parameter [--input_shape] is invalid. Reason: the "
                               f"model has no input named {name} (its inputs: {', '.join(sorted(known))})")
    for i in graph_inputs:
        tt = i.type.tensor_type
        if tt.elem_type not in ops.ONNX_DTYPES:
            raise ConvertError("E19999", f"input [{i.name}] has ONNX data type {tt.elem_type}, not supported")
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tt.shape.dim]
        if i.name in shapes:
            if len(shapes[i.name]) != len(dims) or any(d not in (-1, s) for d, s in zip(dims, shapes[i.name])):
                raise ConvertError("E10001", f"Value [{i.name}:{','.join(map(str, shapes[i.name]))}] for parameter "
                                   f"[--input_shape] is invalid. Reason: the model's input has shape {dims}")
            dims = shapes[i.name]
        elif -1 in dims:
            raise ConvertError("E10001", f"Value [-1] for parameter [{i.name}] is invalid. Reason: maybe you should "
                               "set input_shape to specify its shape")
        inputs.append({"name": i.name, "dtype": str(ops.ONNX_DTYPES[tt.elem_type]).replace("torch.", ""),
                       "shape": dims})
    for opset in model.opset_import:
        if opset.domain not in ("", "ai.onnx"):
            continue
        if opset.version < 13:
            raise ConvertError("E19999", f"the model uses ONNX opset {opset.version}; npudist's atc converts "
                               "opsets 13 and later (export with opset_version=17)")

    nodes = []
    for n, proto in enumerate(g.node):
        name = proto.name or f"{proto.op_type}_{n}"
        if proto.domain not in ("", "ai.onnx") or proto.op_type not in ops.OPS:
            domain = f" (domain {proto.domain})" if proto.domain not in ("", "ai.onnx") else ""
            raise ConvertError("E19999", f"Operator [{proto.op_type}]{domain} of node [{name}] is not supported by "
                               "npudist's atc")
        attrs = {a.name: _attr_value(onnx, a, name, weights) for a in proto.attribute}
        nodes.append({"op": proto.op_type, "name": name, "inputs": list(proto.input), "outputs": list(proto.output),
                      "attrs": attrs})

    # Dry run on cpu with the fixed shapes: every value's shape and dtype, and which values are constant.
    values = dict(weights)
    for i in inputs:
        values[i["name"]] = torch.ones(i["shape"], dtype=getattr(torch, i["dtype"]))
    constant = set(weights)
    kept = []
    with torch.no_grad():
        for node in nodes:
            missing = [x for x in node["inputs"] if x and x not in values]
            if missing:
                raise ConvertError("E19999", f"node [{node['name']}] ({node['op']}) reads {missing[0]}, which no "
                                   "earlier node produces")
            try:
                ops.run_node(node, values, weights)
            except ops.Unsupported as e:
                raise ConvertError("E19999", f"Operator [{node['op']}] of node [{node['name']}] is not supported by "
                                   f"npudist's atc: {e}") from None
            except Exception as e:
                raise ConvertError("E19999", f"node [{node['name']}] ({node['op']}) fails on the model's shapes: "
                                   f"{type(e).__name__}: {e}") from None
            if node["op"] in ops.SHAPE_ONLY or all(x in constant for x in node["inputs"] if x):
                constant.update(x for x in node["outputs"] if x)   # folded: its outputs become weights
            else:
                kept.append(node)
    outputs = []
    for o in g.output:
        if o.name not in values:
            raise ConvertError("E19999", f"graph output [{o.name}] is produced by no node")
        t = values[o.name]
        outputs.append({"name": o.name, "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)})

    # Keep the nodes the outputs need, and the weights (original or folded) those nodes and the outputs read.
    needed = {o["name"] for o in outputs}
    live = []
    for node in reversed(kept):
        if any(x in needed for x in node["outputs"]):
            live.append(node)
            needed.update(x for x in node["inputs"] if x)
            needed.update(a["weight"] for a in node["attrs"].values() if isinstance(a, dict) and "weight" in a)
    live.reverse()
    produced = {x for node in live for x in node["outputs"]} | {i["name"] for i in inputs}
    final_weights = {}
    for name in sorted(needed - produced):
        t = values[name] if name in values else weights[name]
        final_weights[name] = t.detach().contiguous()
    graph = {"producer": "npudist atc", "framework": "onnx", "soc_version": soc_version,
             "source": {"onnx_nodes": len(nodes), "opset": [o.version for o in model.opset_import
                                                            if o.domain in ("", "ai.onnx")]},
             "inputs": inputs, "outputs": outputs, "nodes": live}
    return graph, final_weights
