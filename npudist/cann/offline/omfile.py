"""npudist's ``.om`` offline-model file: what ``atc`` writes and ``acl.mdl.load_from_file`` reads.

Not Huawei's ``.om`` format (undocumented); a file of one cannot be read by the other. Layout (little endian)::

    offset 0   magic      8 bytes  b"NPUDSTOM"
           8   version    u32      1
          12   flags      u32      0
          16   json_len   u64      length of the graph description (UTF-8 JSON)
          24   blob_len   u64      length of the weight blob
          32   crc32      u32      zlib.crc32 of the JSON bytes followed by the blob bytes
          36   JSON                the graph (below)
               zero padding        up to the next multiple of 64
               blob                the weights, each at a 64-byte-aligned offset of the blob

The JSON holds ``{"format": "npudist-om", "version": 1, "producer": ..., "soc_version": ..., "framework": ...,
"inputs": [{"name", "dtype", "shape"}], "outputs": [...], "nodes": [{"op", "name", "inputs", "outputs",
"attrs"}], "weights": {name: {"dtype", "shape", "offset", "nbytes"}}}``. Node inputs and outputs name values
(graph inputs, weights or other nodes' outputs; "" is an absent optional input); attribute values are JSON
numbers, strings and lists, and a tensor attribute is ``{"weight": name}``. dtypes are torch's names
("float32", "int64", "bool", ...). Shapes are static: atc fixes every input shape.
"""
import json
import struct
import zlib

MAGIC = b"NPUDSTOM"
VERSION = 1
_HEADER = struct.Struct("<8sIIQQI")
ALIGN = 64

# ACL error codes (CANN's acl_base.h) for the ways a file can be unusable.
ACL_ERROR_DESERIALIZE_MODEL = 100012
ACL_ERROR_PARSE_MODEL = 100013
ACL_ERROR_READ_MODEL_FAILURE = 100014
ACL_ERROR_MODEL_SIZE_INVALID = 100015
ACL_ERROR_MODEL_MISSING_ATTR = 100016

DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")


class OmError(Exception):
    """A file that is not a loadable npudist .om: ``code`` is the ACL error code, ``str()`` the message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _pad(n):
    return (-n) % ALIGN


def write(path, graph, weights):
    """Write ``graph`` (the JSON dict without "weights") and ``weights`` ({name: cpu tensor}) to ``path``."""
    blob = bytearray()
    table = {}
    for name, tensor in weights.items():
        tensor = tensor.detach().cpu().contiguous()
        raw = tensor.view(-1).view(_byte_view_dtype(tensor)).numpy().tobytes() if tensor.numel() else b""
        table[name] = {"dtype": str(tensor.dtype).replace("torch.", ""), "shape": list(tensor.shape),
                       "offset": len(blob), "nbytes": len(raw)}
        blob += raw + bytes(_pad(len(raw)))
    doc = dict(graph, format="npudist-om", version=VERSION, weights=table)
    text = json.dumps(doc, separators=(",", ":")).encode()
    crc = zlib.crc32(bytes(blob), zlib.crc32(text))
    with open(path, "wb") as f:
        f.write(_HEADER.pack(MAGIC, VERSION, 0, len(text), len(blob), crc))
        f.write(text)
        f.write(bytes(_pad(_HEADER.size + len(text))))
        f.write(blob)


def _byte_view_dtype(tensor):
    import torch

    return torch.uint8 if tensor.dtype != torch.bool else torch.bool


def read(path):
    """(graph dict, {name: cpu tensor}) of an .om file; OmError (an ACL code and a message) when unusable."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise OmError(ACL_ERROR_READ_MODEL_FAILURE, f"cannot read model file {path!r}: {e.strerror}") from None
    return parse(data, path)


def parse(data, path="<memory>"):
    if len(data) < _HEADER.size:
        raise OmError(ACL_ERROR_MODEL_SIZE_INVALID,
                      f"model file {path!r} has {len(data)} bytes, fewer than the {_HEADER.size}-byte om header")
    magic, version, _flags, json_len, blob_len, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise OmError(ACL_ERROR_PARSE_MODEL, f"{path!r} is not an npudist offline model (magic {magic!r}, expected "
                      f"{MAGIC!r}); convert the model with npudist's atc (Ascend's own .om files cannot be read)")
    if version != VERSION:
        raise OmError(ACL_ERROR_PARSE_MODEL, f"{path!r} is om format version {version}; this pyACL reads version "
                      f"{VERSION}: convert the model again with this npudist's atc")
    blob_off = _HEADER.size + json_len + _pad(_HEADER.size + json_len)
    if len(data) != blob_off + blob_len:
        raise OmError(ACL_ERROR_MODEL_SIZE_INVALID, f"model file {path!r} has {len(data)} bytes, its header "
                      f"announces {blob_off + blob_len} (truncated or extended)")
    text = data[_HEADER.size:_HEADER.size + json_len]
    blob = data[blob_off:]
    if zlib.crc32(blob, zlib.crc32(text)) != crc:
        raise OmError(ACL_ERROR_DESERIALIZE_MODEL, f"model file {path!r} is corrupted (checksum mismatch)")
    try:
        doc = json.loads(text)
        graph_ok = isinstance(doc, dict) and all(k in doc for k in ("inputs", "outputs", "nodes", "weights"))
    except ValueError:
        graph_ok = False
    if not graph_ok:
        raise OmError(ACL_ERROR_MODEL_MISSING_ATTR, f"model file {path!r}: the graph description is incomplete")
    import torch

    weights = {}
    try:
        for name, w in doc["weights"].items():
            if w["dtype"] not in DTYPES or w["offset"] + w["nbytes"] > len(blob):
                raise ValueError(name)
            dtype = getattr(torch, w["dtype"])
            raw = bytearray(blob[w["offset"]:w["offset"] + w["nbytes"]])
            t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            weights[name] = t.reshape(w["shape"])
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise OmError(ACL_ERROR_MODEL_MISSING_ATTR, f"model file {path!r}: weight {e} is malformed") from None
    return doc, weights
