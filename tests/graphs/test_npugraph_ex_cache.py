"""torch.npu.npugraph_ex.inference.cache_compile: saved per rank, loaded without tracing on a later start, a
stale or foreign cache refused with a message and rebuilt; readable_cache (docs/graphs.md)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("compile_dist")]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training"))
from _train_spawn import run_ranks  # noqa: E402

from ._npugraph_ex_dist_worker import cache_compile_worker  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_second_start_of_a_two_rank_job_loads_the_cache(tmp_path):
    cache, outs = tmp_path / "cache", tmp_path / "outs"
    outs.mkdir()
    run_ranks(cache_compile_worker, 2, (str(cache), str(outs), False), str(tmp_path), timeout=300)
    run_ranks(cache_compile_worker, 2, (str(cache), str(outs), True), str(tmp_path), timeout=300)
    for rank in range(2):
        saved, loaded = torch.load(outs / f"rank{rank}_save.pt"), torch.load(outs / f"rank{rank}_load.pt")
        for a, b in zip(saved, loaded):
            assert torch.equal(a, b)


_START = textwrap.dedent("""
    import json, sys, warnings
    import torch, npudist
    from torch._dynamo.utils import counters
    import torch.npu.npugraph_ex.inference as inference

    class {name}(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(8, {width})
        def forward(self, x):
            return torch.relu(self.l(x)) * 2

    torch.manual_seed(0)
    model = {name}().npu()
    compiled = inference.cache_compile(model.forward, cache_dir=sys.argv[1], dynamic=False)
    x = torch.randn(3, 8, device="npu")
    with warnings.catch_warnings(record=True) as w, torch.no_grad():
        warnings.simplefilter("always")
        torch.testing.assert_close(compiled(x), model(x))
    try:
        compiled(torch.randn(5, 8, device="npu"))  # dynamic=False: another batch size does not fit
        refused = ""
    except ValueError as e:
        refused = str(e)
    print(json.dumps({{"stats": dict(counters["npugraph_ex"]), "path": str(compiled.path), "refused": refused,
                      "warnings": [str(m.message) for m in w if "cache_compile" in str(m.message)]}}))
""")


def _start(tmp_path, cache, name="Mlp", width=4):
    script = tmp_path / f"{name}{width}.py"
    script.write_text(_START.format(name=name, width=width))
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(script), str(cache)], capture_output=True, text=True, env=env,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_stale_and_foreign_caches_are_refused_and_rebuilt(tmp_path, capsys):
    cache = tmp_path / "cache"
    first = _start(tmp_path, cache)
    assert first["stats"]["cache_saves"] == 1 and not first["warnings"]
    assert "do not fit the compiled program" in first["refused"] and "dynamic=True" in first["refused"]
    assert _start(tmp_path, cache)["stats"]["cache_loads"] == 1
    meta = os.path.join(os.path.dirname(first["path"]), "cache.json")
    described = json.load(open(meta))
    described["torch"] = "1.0.0"  # another torch version wrote it
    json.dump(described, open(meta, "w"))
    stale = _start(tmp_path, cache)
    assert stale["stats"]["cache_rebuilds"] == 1 and "torch: saved '1.0.0'" in stale["warnings"][0]
    assert _start(tmp_path, cache)["stats"]["cache_loads"] == 1  # the rebuilt cache is valid again
    # Another model's cache placed where this model's belongs: refused (fingerprint and weights differ).
    other = _start(tmp_path, tmp_path / "other", width=6)
    target = os.path.dirname(_start(tmp_path, tmp_path / "mine", width=4)["path"])
    for f in ("cache.json", "compiled_program.pt2"):
        os.replace(os.path.join(os.path.dirname(other["path"]), f), os.path.join(target, f))
    foreign = _start(tmp_path, tmp_path / "mine", width=4)
    assert foreign["stats"]["cache_rebuilds"] == 1
    assert "fingerprint" in foreign["warnings"][0] and "state" in foreign["warnings"][0]


def test_readable_cache_prints_what_the_cache_holds(tmp_path, capsys):
    import torch.npu.npugraph_ex.inference as inference

    path = _start(tmp_path, tmp_path / "cache")["path"]
    text = inference.readable_cache(path)
    assert "function: Mlp.forward" in text and "ranks:" in text and "relu" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="no npugraph_ex cache"):
        inference.readable_cache(tmp_path / "missing")


def test_bad_arguments_are_refused():
    import torch.npu.npugraph_ex.inference as inference

    with pytest.raises(ValueError, match="not supported"):
        inference.cache_compile(torch.sin, frozen_parameter=True)
    with pytest.raises(TypeError, match="function or a bound method"):
        inference.cache_compile(3)
