"""torch.onnx.export of npu models (the inference path): TorchScript and Dynamo exporters."""
import io

import pytest
import torch
from torch import nn

# Test dependencies pinned in requirements-test.txt: onnx (checker + reference evaluator), onnxscript (Dynamo exporter).
import onnx  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("compile")]


def _model_and_input():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).npu().eval()
    return model, torch.randn(3, 8, device="npu")


def _run_onnx(proto_bytes: bytes, x: torch.Tensor):
    proto = onnx.load_from_string(proto_bytes)
    onnx.checker.check_model(proto)
    sess = ReferenceEvaluator(proto)
    (out,) = sess.run(None, {sess.input_names[0]: x.cpu().numpy()})
    return torch.from_numpy(out)


def test_torchscript_exporter_exports_npu_model_with_eager_results():
    model, x = _model_and_input()
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False, input_names=["x"])
    torch.testing.assert_close(_run_onnx(buf.getvalue(), x), model(x).detach().cpu(), atol=1e-5, rtol=1e-5)


def test_dynamo_exporter_exports_npu_model_with_eager_results():
    model, x = _model_and_input()
    program = torch.onnx.export(model, (x,), dynamo=True)
    proto_bytes = program.model_proto.SerializeToString()
    torch.testing.assert_close(_run_onnx(proto_bytes, x), model(x).detach().cpu(), atol=1e-5, rtol=1e-5)
