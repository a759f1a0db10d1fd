"""torch.npu.init_dump / set_dump / finalize_dump: the operator data dump (npudist/device/op_dump.py).

Each test writes a CANN dump config, runs a few npu ops and reads the dump back: .npy files (and their
index) or the statistics CSV, compared numerically with the tensors the program computed."""
import csv
import glob
import json
import math
import os
import threading

import numpy
import pytest
import torch

from npudist.device import op_dump
from npudist.device.op_dump_config import DumpConfigNotFoundError


@pytest.fixture(autouse=True)
def _no_leftover_dump():
    yield
    if op_dump._state.initialized:   # a failed test must not leave the dispatch mode on for the next one
        torch.npu.finalize_dump()


def _config(tmp_path, name="cfg.json", **dump):
    out = tmp_path / dump.pop("out", "out")
    out.mkdir(exist_ok=True)
    body = {"dump_path": str(out), "dump_op_switch": "on", **dump}
    path = tmp_path / name
    path.write_text(json.dumps({"dump": body}))
    return str(path), out


def _device_dir(out) -> str:
    (stamp,) = os.listdir(out)   # one {YYYYMMDDhhmmss} directory per set_dump
    assert len(stamp) == 14 and stamp.isdigit()
    return os.path.join(out, stamp, "0")


def _load(directory, op_type, kind, slot, occurrence=0):
    files = sorted(glob.glob(os.path.join(directory, f"{op_type}.*.{kind}.{slot}.npy")),
                   key=lambda f: int(os.path.basename(f).split(".")[2]))   # by task id
    assert files, f"no {op_type} {kind} {slot} in {sorted(os.listdir(directory))}"
    return numpy.load(files[occurrence])


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).to("npu")


def test_output_mode_dumps_forward_outputs(tmp_path):
    cfg, out = _config(tmp_path)   # dump_mode defaults to output, as in CANN
    model, x = _model(), torch.randn(2, 4, device="npu")
    torch.npu.init_dump()
    torch.npu.set_dump(cfg)
    y = model(x)
    torch.npu.finalize_dump()
    d = _device_dir(out)
    lin = model[0]
    expected = x.cpu() @ lin.weight.detach().cpu().T + lin.bias.detach().cpu()
    numpy.testing.assert_allclose(_load(d, "addmm", "output", 0), expected.numpy(), rtol=1e-6)
    numpy.testing.assert_array_equal(_load(d, "relu", "output", 0), y.detach().cpu().numpy())
    assert not glob.glob(os.path.join(d, "*.input.*"))
    name = os.path.basename(glob.glob(os.path.join(d, "relu.*.npy"))[0]).split(".")
    assert name[1] == "aten_relu_default" and name[3] == "0" and len(name[4]) == 16   # op name, stream, us stamp
    with open(os.path.join(d, op_dump.INDEX_FILE)) as f:
        rows = list(csv.DictReader(f))
    assert {r["Op Type"] for r in rows} == {"addmm", "relu"}
    assert all(r["Data Type"] == "DT_FLOAT" and os.path.isfile(os.path.join(d, r["File"])) for r in rows)


def test_input_mode_dumps_inputs_in_schema_order(tmp_path):
    cfg, out = _config(tmp_path, dump_mode="input")
    model, x = _model(), torch.randn(2, 4, device="npu")
    torch.npu.init_dump()
    torch.npu.set_dump(cfg)
    model(x)
    torch.npu.finalize_dump()
    d = _device_dir(out)
    lin = model[0]   # addmm(bias, x, weight.t())
    numpy.testing.assert_array_equal(_load(d, "addmm", "input", 0), lin.bias.detach().cpu().numpy())
    numpy.testing.assert_array_equal(_load(d, "addmm", "input", 1), x.cpu().numpy())
    numpy.testing.assert_array_equal(_load(d, "addmm", "input", 2), lin.weight.detach().cpu().T.numpy())
    assert not glob.glob(os.path.join(d, "*.output.*"))


def test_all_mode_in_place_op_and_backward(tmp_path):
    cfg, out = _config(tmp_path, dump_mode="all")
    a = torch.tensor([1.0, 2.0, 3.0], device="npu")
    w = torch.tensor([[1.0, -2.0], [0.5, 4.0]], device="npu", requires_grad=True)
    v = torch.tensor([[3.0, 1.0]], device="npu")
    torch.npu.init_dump()
    torch.npu.set_dump(cfg)
    a.mul_(2.0)   # the input is dumped before the op overwrites it
    b, c = torch.tensor([1.0, -1.0], device="npu"), torch.tensor([5.0], device="npu")
    torch._foreach_add_([b, c], 1.0)   # returns nothing: its outputs are the tensors it writes
    (v @ w).sum().backward()   # backward ops run on the autograd engine's thread, which inherits the mode
    torch.npu.finalize_dump()
    d = _device_dir(out)
    numpy.testing.assert_array_equal(_load(d, "mul_", "input", 0), [1.0, 2.0, 3.0])
    numpy.testing.assert_array_equal(_load(d, "mul_", "output", 0), [2.0, 4.0, 6.0])
    numpy.testing.assert_array_equal(_load(d, "mm", "output", 0), [[3.5, -2.0]])
    for slot, (old_value, new_value) in enumerate((([1.0, -1.0], [2.0, 0.0]), ([5.0], [6.0]))):
        numpy.testing.assert_array_equal(_load(d, "_foreach_add_", "input", slot), old_value)
        numpy.testing.assert_array_equal(_load(d, "_foreach_add_", "output", slot), new_value)
    # w.grad = v^T @ ones: the backward mm, the second mm dumped
    numpy.testing.assert_array_equal(_load(d, "mm", "output", 0, occurrence=1), w.grad.cpu().numpy())


def test_layer_filter_selects_named_ops(tmp_path):
    cfg, out = _config(tmp_path, dump_list=[{"layer": ["relu"]}, {"layer": ["aten.add.Tensor"]}])
    x = torch.tensor([-1.0, 2.0], device="npu")
    torch.npu.init_dump()
    torch.npu.set_dump(cfg)
    r = torch.relu(x)
    s = r + x
    torch.exp(s)
    r.mul(3)
    torch.npu.finalize_dump()
    d = _device_dir(out)
    types = {os.path.basename(f).split(".")[0] for f in glob.glob(os.path.join(d, "*.npy"))}
    assert types == {"relu", "add"}
    numpy.testing.assert_array_equal(_load(d, "add", "output", 0), s.cpu().numpy())


def test_stats_mode_writes_cann_statistics(tmp_path):
    cfg, out = _config(tmp_path, dump_data="stats", dump_mode="all")
    x = torch.tensor([1.0, -3.0, float("nan"), float("inf"), 2.0, float("-inf")], device="npu")
    torch.npu.init_dump()
    torch.npu.set_dump(cfg)
    y = x * 2
    torch.npu.finalize_dump()
    d = _device_dir(out)
    assert not glob.glob(os.path.join(d, "*.npy"))
    with open(os.path.join(d, op_dump.STATS_FILE)) as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == op_dump.STATS_COLUMNS
        rows = [r for r in reader if r["Op Type"] == "mul"]
    by_kind = {r["Input/Output"]: r for r in rows}
    assert set(by_kind) == {"input", "output"}
    for kind, t in (("input", x), ("output", y)):
        row = by_kind[kind]
        finite = t.cpu()[torch.isfinite(t.cpu())].double()
        assert float(row["Max Value"]) == finite.max().item() and float(row["Min Value"]) == finite.min().item()
        assert math.isclose(float(row["Avg Value"]), finite.mean().item())
        assert (row["Count"], row["Nan Count"], row["Negative Inf Count"], row["Positive Inf Count"]) == \
            ("6", "1", "1", "1")
        assert (row["Data Size"], row["Data Type"], row["Shape"], row["Slot"]) == ("24", "DT_FLOAT", "[6]", "0")


def test_bfloat16_is_widened_and_recorded(tmp_path):
    cfg, out = _config(tmp_path)
    x = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16, device="npu")
    torch.npu.init_dump()
    torch.npu.set_dump(cfg)
    y = x * x
    torch.npu.finalize_dump()
    d = _device_dir(out)
    data = _load(d, "mul", "output", 0)
    assert data.dtype == numpy.float32
    numpy.testing.assert_array_equal(data, y.float().cpu().numpy())
    with open(os.path.join(d, op_dump.INDEX_FILE)) as f:
        assert [r["Data Type"] for r in csv.DictReader(f)] == ["DT_BF16"]


def test_ordering_errors():
    with pytest.raises(RuntimeError, match="call torch.npu.init_dump"):
        torch.npu.set_dump("unused.json")
    with pytest.raises(RuntimeError, match="not initialised"):
        torch.npu.finalize_dump()
    torch.npu.init_dump()
    with pytest.raises(RuntimeError, match="already initialised"):
        torch.npu.init_dump()
    torch.npu.finalize_dump()


def test_second_set_dump_overrides_first(tmp_path):
    first, out_a = _config(tmp_path, "a.json", out="a")
    second, out_b = _config(tmp_path, "b.json", out="b", dump_mode="input")
    x = torch.tensor([1.0, 4.0], device="npu")
    torch.npu.init_dump()
    torch.npu.set_dump(first)
    torch.npu.set_dump(second)
    torch.sqrt(x)
    torch.npu.finalize_dump()
    assert os.listdir(out_a) == []   # nothing ran under the first configuration
    d = _device_dir(out_b)
    numpy.testing.assert_array_equal(_load(d, "sqrt", "input", 0), [1.0, 4.0])
    assert not glob.glob(os.path.join(d, "*.output.*"))


@pytest.mark.parametrize("dump, message", [
    ({"dump_list": [{"model_name": "ResNet-50", "layer": ["conv1"]}]},
     "model_name is not supported: it selects an offline model"),
    ({"dump_step": "0|5"}, "dump_step is not supported"),
    ({"dump_scene": "lite_exception"}, "dump_scene is not supported"),
    ({"dump_debug": "on"}, "dump_debug is not supported: overflow"),
    ({"dump_paht": "x"}, "unknown or unsupported key dump.dump_paht"),
    ({"dump_mode": "outputs"}, r"dump_mode must be one of \['output', 'input', 'all'\]"),
    ({"dump_op_switch": "off"}, 'dump_op_switch "off"'),
    ({"dump_data": "npy"}, "dump_data must be one of"),
    ({"dump_list": [{"layer": []}]}, "layer must be a non-empty list"),
    ({"dump_list": {"layer": ["relu"]}}, "dump_list must be a JSON list"),
    ({"dump_list": [{"layer": ["reul", "aten.addmm"]}]}, r"layer names \['reul'\] name no registered op"),
])
def test_bad_keys_raise_value_error(tmp_path, dump, message):
    cfg, _ = _config(tmp_path, **dump)
    torch.npu.init_dump()
    with pytest.raises(ValueError, match=message):
        torch.npu.set_dump(cfg)
    assert not op_dump.is_dumping()   # a refused config turns nothing on
    torch.npu.finalize_dump()


def test_missing_files_and_paths(tmp_path):
    torch.npu.init_dump()
    missing = str(tmp_path / "nope.json")
    with pytest.raises(DumpConfigNotFoundError, match=f"cfg_file {missing} path does not exists") as info:
        torch.npu.set_dump(missing)
    assert isinstance(info.value, AssertionError) and isinstance(info.value, FileNotFoundError)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"dump": {"dump_path": str(tmp_path / "absent"), "dump_op_switch": "on"}}))
    with pytest.raises(ValueError, match="is not an existing directory; create it first"):
        torch.npu.set_dump(str(cfg))
    cfg.write_text(json.dumps({"dump": {"dump_op_switch": "on"}}))
    with pytest.raises(ValueError, match="dump_path is required"):
        torch.npu.set_dump(str(cfg))
    cfg.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        torch.npu.set_dump(str(cfg))
    with pytest.raises(TypeError, match="cfg_file must be a path"):
        torch.npu.set_dump(3)
    torch.npu.finalize_dump()


def test_finalize_stops_dumping_and_init_restarts(tmp_path):
    cfg, out = _config(tmp_path)
    x = torch.tensor([2.0, 3.0], device="npu")
    torch.npu.init_dump()
    torch.npu.set_dump(cfg)
    torch.neg(x)
    torch.npu.finalize_dump()
    assert not op_dump.is_dumping()
    d = _device_dir(out)
    before = sorted(os.listdir(d))
    torch.neg(x)
    torch.exp(x)
    assert sorted(os.listdir(d)) == before
    assert [os.path.basename(f).split(".")[0] for f in glob.glob(os.path.join(d, "*.npy"))] == ["neg"]
    torch.npu.init_dump()   # a new cycle, as ACL allows
    torch.npu.set_dump(cfg)
    torch.exp(x)
    torch.npu.finalize_dump()
    exp_files = glob.glob(os.path.join(out, "*", "0", "exp.*.output.0.npy"))
    assert len(exp_files) == 1
    numpy.testing.assert_allclose(numpy.load(exp_files[0]), torch.exp(x).cpu().numpy())


def test_finalize_on_another_thread_is_refused(tmp_path):
    cfg, _ = _config(tmp_path)
    torch.npu.init_dump()
    torch.npu.set_dump(cfg)
    errors = []

    def finalize():
        try:
            torch.npu.finalize_dump()
        except RuntimeError as e:
            errors.append(str(e))
    t = threading.Thread(target=finalize)
    t.start()
    t.join(timeout=30)
    assert errors and "thread that called set_dump" in errors[0]
    assert op_dump.is_dumping()
    torch.npu.finalize_dump()


def test_views_transfers_fake_and_collectives_are_not_dumped(tmp_path):
    import datetime

    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg, out = _config(tmp_path, dump_level="kernel")   # one kernel per op: the same tensors as "op"
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        torch.npu.init_dump()
        torch.npu.set_dump(cfg)
        x = torch.arange(6.0).to("npu")       # host -> device copy: a memcpy, not an operator
        v = x.view(2, 3).t()                  # views launch nothing
        y = v * 2
        dist.all_reduce(y)                    # comm-stream op, final only at Work.wait()
        y.cpu()
        with FakeTensorMode():
            torch.empty(3, device="npu") + 1   # fake tensors hold no data
        torch.npu.finalize_dump()
    finally:
        dist.destroy_process_group()
    d = _device_dir(out)
    types = {os.path.basename(f).split(".")[0] for f in glob.glob(os.path.join(d, "*.npy"))}
    assert types == {"mul"}
    numpy.testing.assert_array_equal(_load(d, "mul", "output", 0), (torch.arange(6.0).view(2, 3).t() * 2).numpy())


def test_device_directory_and_stream_id(tmp_path):
    cfg, out = _config(tmp_path, dump_data="stats")
    x = torch.tensor([3.0 + 4.0j, 0.0 + 1.0j], device="npu:1")
    side = torch.npu.Stream(device="npu:1")
    torch.npu.init_dump()
    torch.npu.set_dump(cfg)
    with torch.npu.stream(side):
        torch.conj_physical(x)
    torch.npu.finalize_dump()
    (stamp,) = os.listdir(out)
    assert os.listdir(os.path.join(out, stamp)) == ["1"]   # the device the op ran on
    with open(os.path.join(out, stamp, "1", op_dump.STATS_FILE)) as f:
        (row,) = list(csv.DictReader(f))
    assert side.stream_id != 0 and int(row["Stream ID"]) == side.stream_id
    # complex tensors: statistics of the magnitudes |3+4j| = 5, |j| = 1
    assert (row["Data Type"], row["Data Size"], row["Max Value"], row["Min Value"], row["Avg Value"]) == \
        ("DT_COMPLEX64", "16", "5.0", "1.0", "3.0")
