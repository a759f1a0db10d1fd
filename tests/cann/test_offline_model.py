"""Offline models: a small CNN and a small transformer block exported from PyTorch to ONNX, converted by npudist's
``atc`` (a subprocess), loaded and executed through the emulated pyACL's ``acl.mdl`` on device memory, equal to
PyTorch; atc's and acl.mdl's errors (docs/cann.md, "Offline models: atc and acl.mdl")."""
import ctypes
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import npudist  # noqa: F401  (registers npu; puts the emulated home's python dir on sys.path)

acl = pytest.importorskip("acl", reason="the emulated home's acl module is not importable (run scripts/setup.sh)")
onnx = pytest.importorskip("onnx", reason="the onnx package (a test dependency, scripts/setup.sh) is missing")

ACL_SUCCESS, ACL_ERROR_INVALID_PARAM, ACL_ERROR_INVALID_MODEL_ID = 0, 100000, 100011
ACL_ERROR_DESERIALIZE_MODEL, ACL_ERROR_PARSE_MODEL, ACL_ERROR_READ_MODEL_FAILURE = 100012, 100013, 100014
ACL_ERROR_MODEL_SIZE_INVALID = 100015
ACL_MEM_MALLOC_HUGE_FIRST, H2D, D2H = 0, 1, 2
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
        x = F.avg_pool2d(torch.tanh(self.c2(x)), 2, stride=1, padding=1, count_include_pad=False)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return torch.softmax(self.fc(x), -1)


class TransformerBlock(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, 32), nn.Linear(32, d)

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        h = self.ff1(self.ln2(x))
        h = 0.5 * h * (1 + torch.tanh(0.79788456 * (h + 0.044715 * torch.pow(h, 3)))) + F.gelu(h)
        return x + self.ff2(h) / torch.sqrt(torch.tensor(2.0)) - x.mean(-1, keepdim=True)


class Unsupported(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 1)


def export(model, example, path, dynamic=False, fold=True):
    model.eval()
    torch.manual_seed(0)
    for p in model.parameters():  # non-trivial BatchNorm statistics
        p.data.uniform_(-0.5, 0.5)
    for name, b in model.named_buffers():
        if "running_var" in name:
            b.uniform_(0.5, 1.5)
        elif "running_mean" in name:
            b.uniform_(-0.2, 0.2)
    kw = {"dynamic_axes": {"x": {0: "batch"}}} if dynamic else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(model, (example,), path, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["y"], do_constant_folding=fold, **kw)


def atc(*args, env=None):
    return subprocess.run([sys.executable, "-m", "npudist.cann.atc", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)


def convert(onnx_path, out, *extra):
    r = atc(f"--model={onnx_path}", "--framework=5", f"--output={out}", "--soc_version=Ascend910B", *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ATC run success" in r.stdout
    return out + ".om"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("offline")
    torch.manual_seed(0)
    cnn, block = SmallCNN(), TransformerBlock()
    x_cnn, x_block = torch.randn(2, 3, 8, 8), torch.randn(1, 5, 16)
    export(cnn, x_cnn, str(tmp / "cnn.onnx"), fold=False)  # BatchNormalization stays a node
    export(block, x_block, str(tmp / "block.onnx"), dynamic=True)
    oms = {"cnn": convert(str(tmp / "cnn.onnx"), str(tmp / "cnn")),
           "block": convert(str(tmp / "block.onnx"), str(tmp / "block"), '--input_shape=x:3,5,16')}
    return tmp, oms, {"cnn": (cnn, x_cnn), "block": (block, torch.randn(3, 5, 16))}


class Buffers:
    """Device buffers for one execution: acl.rt.malloc'd memory wrapped in data buffers and datasets."""

    def __init__(self):
        self.device, self.buffers, self.datasets = [], [], []

    def dataset(self, sizes):
        ds = acl.mdl.create_dataset()
        self.datasets.append(ds)
        for size in sizes:
            dev, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
            assert ret == ACL_SUCCESS
            self.device.append(dev)
            buf = acl.create_data_buffer(dev, size)
            self.buffers.append(buf)
            _, ret = acl.mdl.add_dataset_buffer(ds, buf)
            assert ret == ACL_SUCCESS
        return ds

    def release(self):
        for ds in self.datasets:
            assert acl.mdl.destroy_dataset(ds) == ACL_SUCCESS
        for buf in self.buffers:
            assert acl.destroy_data_buffer(buf) == ACL_SUCCESS
        for dev in self.device:
            assert acl.rt.free(dev) == ACL_SUCCESS


def run_om(path, x):
    """Load path, run it on x through device memory, return the outputs (cpu tensors) and the dims."""
    model_id, ret = acl.mdl.load_from_file(path)
    assert ret == ACL_SUCCESS, acl.get_recent_err_msg()
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == ACL_SUCCESS
    assert acl.mdl.get_num_inputs(desc) == 1
    n_out = acl.mdl.get_num_outputs(desc)
    in_size = acl.mdl.get_input_size_by_index(desc, 0)
    assert in_size == x.numel() * 4
    dims, ret = acl.mdl.get_input_dims(desc, 0)
    assert ret == ACL_SUCCESS and dims["dims"] == list(x.shape)
    out_sizes = [acl.mdl.get_output_size_by_index(desc, i) for i in range(n_out)]
    out_dims = [acl.mdl.get_output_dims(desc, i)[0]["dims"] for i in range(n_out)]
    bufs = Buffers()
    try:
        inp, out = bufs.dataset([in_size]), bufs.dataset(out_sizes)
        assert acl.mdl.get_dataset_num_buffers(inp) == 1
        dev = acl.get_data_buffer_addr(acl.mdl.get_dataset_buffer(inp, 0))
        assert acl.get_data_buffer_size_v2(acl.mdl.get_dataset_buffer(inp, 0)) == in_size
        x = x.contiguous()
        assert acl.rt.memcpy(dev, in_size, x.data_ptr(), in_size, H2D) == ACL_SUCCESS
        assert acl.mdl.execute(model_id, inp, out) == ACL_SUCCESS, acl.get_recent_err_msg()
        results = []
        for i in range(n_out):
            y = torch.empty(out_dims[i])
            addr = acl.get_data_buffer_addr(acl.mdl.get_dataset_buffer(out, i))
            assert acl.rt.memcpy(y.data_ptr(), out_sizes[i], addr, out_sizes[i], D2H) == ACL_SUCCESS
            results.append(y)
    finally:
        bufs.release()
    assert acl.mdl.unload(model_id) == ACL_SUCCESS
    assert acl.mdl.destroy_desc(desc) == ACL_SUCCESS
    return results


@pytest.mark.parametrize("name", ["cnn", "block"])
def test_converted_model_matches_pytorch(models, name):
    tmp, oms, nets = models
    onnx_ops = {n.op_type for n in onnx.load(str(tmp / f"{name}.onnx")).graph.node}
    assert onnx_ops >= ({"Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "Gemm",
                         "Softmax", "Tanh"} if name == "cnn" else
                        {"LayerNormalization", "MatMul", "Softmax", "Erf", "Pow", "Sqrt", "Tanh", "ReduceMean"})
    net, x = nets[name]
    with torch.no_grad():
        expected = net(x)
    (y,) = run_om(oms[name], x)
    assert y.shape == expected.shape
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
    with open(oms[name], "rb") as f:
        assert f.read(8) == b"NPUDSTOM"


def test_constant_folding_shrinks_the_transformer_graph(models):
    from npudist.cann.offline import omfile

    tmp, oms, _ = models
    graph, _ = omfile.read(oms["block"])
    onnx_ops = [n.op_type for n in onnx.load(str(tmp / "block.onnx")).graph.node]
    kept = [n["op"] for n in graph["nodes"]]
    assert "Shape" in onnx_ops and "Shape" not in kept and "Constant" not in kept
    assert 2 * len(kept) < len(onnx_ops)  # 183 -> 55 nodes (docs/cann.md)
    assert graph["inputs"] == [{"name": "x", "dtype": "float32", "shape": [3, 5, 16]}]


def test_atc_argument_errors(models, tmp_path):
    tmp, _, _ = models
    r = atc(f"--model={tmp / 'cnn.onnx'}", "--framework=3", f"--output={tmp_path / 'x'}", "--soc_version=Ascend910B")
    assert r.returncode == 1 and "ATC run failed" in r.stdout
    assert "E10001: Value [3] for parameter [--framework] is invalid" in r.stdout
    r = atc("--framework=5", f"--output={tmp_path / 'x'}", "--soc_version=Ascend910B")
    assert r.returncode == 1 and "E10001" in r.stdout and "[--model]" in r.stdout
    r = atc(f"--model={tmp / 'block.onnx'}", "--framework=5", f"--output={tmp_path / 'x'}",
            "--soc_version=Ascend910B")
    assert r.returncode == 1 and "E10001: Value [-1] for parameter [x]" in r.stdout and "input_shape" in r.stdout
    r = atc(f"--model={tmp / 'block.onnx'}", "--framework=5", f"--output={tmp_path / 'x'}",
            "--soc_version=Ascend910B", "--input_shape=y:1,5,16")
    assert r.returncode == 1 and "no input named y" in r.stdout
    assert not os.path.exists(tmp_path / "x.om")
    assert atc("--help").returncode == 0


def test_atc_malformed_and_unsupported_models(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf \xff\xff\xff")
    r = atc(f"--model={bad}", "--framework=5", f"--output={tmp_path / 'bad'}", "--soc_version=Ascend910B")
    assert r.returncode == 1, r.stdout
    assert "ATC run failed" in r.stdout and "E19999" in r.stdout and "cannot be parsed" in r.stdout
    export(Unsupported(), torch.randn(1, 4), str(tmp_path / "cumsum.onnx"))
    node = [n.name for n in onnx.load(str(tmp_path / "cumsum.onnx")).graph.node if n.op_type == "CumSum"][0]
    r = atc(f"--model={tmp_path / 'cumsum.onnx'}", "--framework=5", f"--output={tmp_path / 'c'}",
            "--soc_version=Ascend910B")
    assert r.returncode == 1 and f"Operator [CumSum] of node [{node}] is not supported" in r.stdout, r.stdout
    assert not os.path.exists(tmp_path / "c.om") and not os.path.exists(tmp_path / "bad.om")


def test_atc_without_onnx_names_the_package(models, tmp_path):
    tmp, _, _ = models
    fake = tmp_path / "site" / "onnx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named onnx (test stub)')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")]))
    r = atc(f"--model={tmp / 'cnn.onnx'}", "--framework=5", f"--output={tmp_path / 'x'}",
            "--soc_version=Ascend910B", env=env)
    assert r.returncode == 1 and "ATC run failed" in r.stdout and "pip install onnx" in r.stdout


def test_installed_atc_script(models, tmp_path):
    # The script of this environment's install, found beside its interpreter: the suite runs .venv/bin/python
    # without activating the environment, so PATH need not hold that folder.
    exe = os.path.join(os.path.dirname(sys.executable), "atc")
    assert os.access(exe, os.X_OK), f"{exe}: the atc console script is missing (reinstall npudist: pip install -e .)"
    tmp, _, _ = models
    r = subprocess.run([exe, f"--model={tmp / 'cnn.onnx'}", "--framework=5", f"--output={tmp_path / 'cnn'}",
                        "--soc_version=Ascend910B"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and (tmp_path / "cnn.om").exists(), r.stdout + r.stderr


def test_execute_errors(models):
    _, oms, nets = models
    model_id, ret = acl.mdl.load_from_file(oms["cnn"])
    assert ret == ACL_SUCCESS
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == ACL_SUCCESS
    in_size, out_size = acl.mdl.get_input_size_by_index(desc, 0), acl.mdl.get_output_size_by_index(desc, 0)
    assert acl.mdl.get_output_dims(desc, 0)[0]["dims"] == [2, 5] and out_size == 40
    bufs = Buffers()
    try:
        short, out = bufs.dataset([in_size - 4]), bufs.dataset([out_size])
        assert acl.mdl.execute(model_id, short, out) == ACL_ERROR_INVALID_PARAM
        msg = acl.get_recent_err_msg()
        assert f"holds {in_size - 4} bytes" in msg and f"needs {in_size}" in msg, msg
        assert acl.get_recent_err_msg() == ""
        inp, small_out = bufs.dataset([in_size]), bufs.dataset([out_size - 1])
        assert acl.mdl.execute(model_id, inp, small_out) == ACL_ERROR_INVALID_PARAM
        assert "output 0" in acl.get_recent_err_msg()
        assert acl.mdl.execute(model_id, inp, 12345) == ACL_ERROR_INVALID_PARAM
        assert acl.mdl.get_input_dims(desc, 3)[1] == ACL_ERROR_INVALID_PARAM
        assert "out of range" in acl.get_recent_err_msg()
        assert acl.mdl.execute(model_id, inp, out) == ACL_SUCCESS
        assert acl.mdl.unload(model_id) == ACL_SUCCESS
        assert acl.mdl.execute(model_id, inp, out) == ACL_ERROR_INVALID_MODEL_ID
        assert f"model id {model_id} is not a loaded model" in acl.get_recent_err_msg()
        assert acl.mdl.unload(model_id) == ACL_ERROR_INVALID_MODEL_ID
        assert acl.mdl.execute(987654, inp, out) == ACL_ERROR_INVALID_MODEL_ID
    finally:
        bufs.release()
    assert acl.mdl.destroy_desc(desc) == ACL_SUCCESS
    assert acl.mdl.destroy_desc(desc) == ACL_ERROR_INVALID_PARAM


def test_malformed_om_files(models, tmp_path):
    _, oms, _ = models
    data = open(oms["cnn"], "rb").read()
    cases = {
        "missing.om": (None, ACL_ERROR_READ_MODEL_FAILURE, "cannot read model file"),
        "tiny.om": (b"NPU", ACL_ERROR_MODEL_SIZE_INVALID, "fewer than"),
        "huawei.om": (b"IMOD" + bytes(200), ACL_ERROR_PARSE_MODEL, "not an npudist offline model"),
        "truncated.om": (data[:-10], ACL_ERROR_MODEL_SIZE_INVALID, "truncated"),
        "flipped.om": (data[:-1] + bytes([data[-1] ^ 0xFF]), ACL_ERROR_DESERIALIZE_MODEL, "checksum"),
    }
    for name, (content, code, text) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        model_id, ret = acl.mdl.load_from_file(str(path))
        assert (model_id, ret) == (0, code), name
        assert text in acl.get_recent_err_msg(), name
    # a well-formed file whose graph names an operator the executor lacks
    from npudist.cann.offline import omfile

    graph, weights = omfile.read(oms["cnn"])
    graph["nodes"][0]["op"] = "FancyOp"
    omfile.write(str(tmp_path / "fancy.om"), {k: v for k, v in graph.items() if k != "weights"}, weights)
    assert acl.mdl.load_from_file(str(tmp_path / "fancy.om")) == (0, ACL_ERROR_PARSE_MODEL)
    assert "FancyOp" in acl.get_recent_err_msg()
    graph["nodes"][0]["op"] = "Conv"
    graph["inputs"] = [["x", "float32"]]  # a list where an object belongs
    omfile.write(str(tmp_path / "shape.om"), {k: v for k, v in graph.items() if k != "weights"}, weights)
    assert acl.mdl.load_from_file(str(tmp_path / "shape.om")) == (0, ACL_ERROR_PARSE_MODEL)
    assert "malformed graph description" in acl.get_recent_err_msg()
    assert acl.mdl.load_from_file("") == (0, ACL_ERROR_INVALID_PARAM)
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_num_inputs(desc) == 0 and "filled by acl.mdl.get_desc" in acl.get_recent_err_msg()
    assert acl.mdl.get_desc(desc, 424242) == ACL_ERROR_INVALID_MODEL_ID
    assert acl.mdl.destroy_desc(desc) == ACL_SUCCESS


def test_data_buffer_calls():
    host = ctypes.create_string_buffer(64)
    buf = acl.create_data_buffer(ctypes.addressof(host), 64)
    assert acl.get_data_buffer_addr(buf) == ctypes.addressof(host) and acl.get_data_buffer_size_v2(buf) == 64
    assert acl.destroy_data_buffer(buf) == ACL_SUCCESS
    assert acl.destroy_data_buffer(buf) == ACL_ERROR_INVALID_PARAM
    assert acl.get_data_buffer_size_v2(buf) == 0 and "is not a data buffer" in acl.get_recent_err_msg()
    ds = acl.mdl.create_dataset()
    assert acl.mdl.add_dataset_buffer(ds, buf)[1] == ACL_ERROR_INVALID_PARAM
    assert acl.mdl.get_dataset_num_buffers(ds) == 0 and acl.mdl.get_dataset_buffer(ds, 0) == 0
    assert acl.mdl.destroy_dataset(ds) == ACL_SUCCESS
