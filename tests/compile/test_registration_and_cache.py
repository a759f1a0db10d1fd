"""Graph-mode registration is lazy (nothing at ``import npudist``) and the FX graph cache works across runs."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("compile_cache")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = r"""
import json, sys, time
import torch, npudist
lazy = not any(m in sys.modules for m in ("torch._inductor", "torch._dynamo"))
try:
    torch.npu.Scheduling_typo
    unknown_attr_error = False
except AttributeError:
    unknown_attr_error = True
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).npu()
x = torch.randn(4, 16, device="npu")
t0 = time.perf_counter()
out = torch.compile(model)(x)
first_step = time.perf_counter() - t0
c = torch._dynamo.utils.counters["inductor"]
from torch._inductor.codegen.common import custom_backend_codegen_configs
npu_config = custom_backend_codegen_configs.get("npu")
print(json.dumps({"fingerprint": getattr(npu_config, "sources_fingerprint", None), "lazy": lazy, "unknown_attr_error": unknown_attr_error, "device": str(out.device),
                  "ok": bool(torch.allclose(out, model(x))), "hit": c["fxgraph_cache_hit"],
                  "miss": c["fxgraph_cache_miss"], "first_step": first_step}))
"""


def _run_child(cache_dir) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), TORCHINDUCTOR_COMPILE_THREADS="1",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=500,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_lazy_registration_and_fx_graph_cache_across_processes(tmp_path):
    cold = _run_child(tmp_path)
    assert cold["lazy"], "import npudist must not import torch._inductor / torch._dynamo"
    assert cold["unknown_attr_error"], "torch.npu.<unknown> must still raise AttributeError"
    assert cold["device"] == "npu:0" and cold["ok"]
    assert cold["miss"] >= 1 and cold["hit"] == 0, cold
    assert cold["fingerprint"] == _compile_sources_fingerprint(), "npu's cache-key config was lost (see test below)"
    warm = _run_child(tmp_path)  # a new process, same cache directory
    assert warm["device"] == "npu:0" and warm["ok"]
    assert warm["hit"] >= 1 and warm["miss"] == 0, warm


def _compile_sources_fingerprint() -> str:
    import hashlib
    import pathlib

    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(REPO, "npudist", "compile").glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def test_npudist_compile_sources_join_the_cache_keys():
    """Inductor's and AOTAutograd's cache keys include npu's device_custom_config, which hashes npudist.compile --
    also when Inductor's own registration ran first (it registers looked-up names without a config)."""
    import npudist.compile
    from torch._inductor.codegen.common import custom_backend_codegen_configs, init_backend_registration

    init_backend_registration()
    npudist.compile.register()
    config = custom_backend_codegen_configs["npu"]
    assert config is not None, "npu's device_custom_config was replaced by Inductor's registration"
    assert config.sources_fingerprint == _compile_sources_fingerprint()
    assert "sources_fingerprint" in config.save_config_portable(ignore_private_configs=False, readonly_values=True)


def test_another_npudist_compile_source_misses_the_fx_graph_cache():
    """The FX graph cache key of the same graph changes with npudist's compile sources, so a cache written by
    another version of them (e.g. before the tracing-time attention kernel) is missed rather than served.
    AOTAutograd's key is built by a subclass of the same details (``AOTAutogradCacheDetails``)."""
    import npudist.compile
    import torch
    from torch._inductor.codecache import compiled_fx_graph_hash
    from torch._inductor.codegen.common import custom_backend_codegen_configs, init_backend_registration

    init_backend_registration()
    npudist.compile.register()
    config = custom_backend_codegen_configs["npu"]
    graph = torch.fx.symbolic_trace(lambda x: x + 1)
    inputs = [torch.randn(2, device="npu")]
    key, _ = compiled_fx_graph_hash(graph, inputs, {}, [])
    with config.patch(sources_fingerprint="another npudist.compile"):
        other, _ = compiled_fx_graph_hash(graph, inputs, {}, [])
    assert other != key
    assert compiled_fx_graph_hash(graph, inputs, {}, [])[0] == key, "the key must be stable for the same sources"
