"""Malformed environment variables: the typed readers of npudist/env.py (in process), and what a user sees at
`import torch` / `import npudist` / process-group creation (a few subprocesses, one per case)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npudist import env

pytestmark = pytest.mark.timeout(120)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("raw,value", [("1", True), ("0", False), ("true", True), ("FALSE", False), ("Yes", True),
                                       ("no", False), ("ON", True), ("off", False), (" 1 ", True)])
def test_booleans_accept_the_usual_spellings(raw, value):
    assert env.read("ASCEND_LAUNCH_BLOCKING", {"ASCEND_LAUNCH_BLOCKING": raw}) is value


@pytest.mark.parametrize("raw", ["maybe", "2", "y", "enabled", "-1"])
def test_booleans_reject_other_spellings(raw):
    with pytest.raises(env.EnvVarError) as e:
        env.read("ASCEND_LAUNCH_BLOCKING", {"ASCEND_LAUNCH_BLOCKING": raw})
    assert str(e.value).startswith(f"ASCEND_LAUNCH_BLOCKING={raw!r} is not a boolean: expected 1/0, true/false")


@pytest.mark.parametrize("name,raw", [
    ("HCCL_CONNECT_TIMEOUT", "-1"), ("HCCL_EXEC_TIMEOUT", "-1"), ("HCCL_EXEC_TIMEOUT", "0"), ("HCCL_BUFFSIZE", "0"),
    ("HCCL_BUFFSIZE", "2147483648"),     # beyond the C int the extension reads it into
    ("HCCL_BUFFSIZE", "1_000"), ("HCCL_BUFFSIZE", "8MB"), ("NPUDIST_LAUNCH_QUEUE_DEPTH", "-3"),
    ("NPUDIST_DEVICE_COUNT", "65"), ("NPUDIST_ENGINE_CHUNK_KB", "0"), ("NPUDIST_ENGINE_SPIN_US", "-5"),
    ("TORCH_HCCL_ASYNC_ERROR_HANDLING", "4"), ("NPUDIST_HCCL_COMMUNICATOR", "mpi"), ("OOM_SNAPSHOT_ENABLE", "yes"),
    ("NPUDIST_DEVICE_MEMORY", "16gib"),  # units are case-sensitive in the runtime
    ("NPUDIST_DEVICE_MEMORY", "0GiB"), ("NPUDIST_DEVICE_MEMORY", "1e400"), ("NPUDIST_ENGINE_DIRECT", "sometimes"),
])
def test_numbers_and_choices_out_of_their_form_name_variable_value_and_form(name, raw):
    with pytest.raises(env.EnvVarError) as e:
        env.read(name, {name: raw})
    var = env.VARIABLES[name]
    assert str(e.value) == (f"{name}={raw!r} is not {var.noun}: expected {var.accepted}; fix it or unset {name}")
    assert (e.value.name, e.value.value) == (name, raw)


def test_visible_devices_list_rules():
    read = env.read
    assert read("ASCEND_RT_VISIBLE_DEVICES", {"ASCEND_RT_VISIBLE_DEVICES": "3, 1"}) == [3, 1]
    assert read("ASCEND_RT_VISIBLE_DEVICES", {"ASCEND_RT_VISIBLE_DEVICES": ""}) == []   # empty: no device
    for raw, problem in (("0,,1", "(an empty item)"), ("0,1,", "(an empty item)"), ("1,1", "(device 1 is listed twice)"),
                         ("a", "('a' is not a device id)"), ("-1", "('-1' is not a device id)")):
        with pytest.raises(env.EnvVarError, match=rf"^ASCEND_RT_VISIBLE_DEVICES='{raw}' is not a device list "
                                                  rf"{problem.replace('(', '[(]').replace(')', '[)]')}"):
            read("ASCEND_RT_VISIBLE_DEVICES", {"ASCEND_RT_VISIBLE_DEVICES": raw})
    found = env.problems(("device",), {"ASCEND_RT_VISIBLE_DEVICES": "0,5", "NPUDIST_DEVICE_COUNT": "4"})
    assert [str(e) for e in found] == [
        "ASCEND_RT_VISIBLE_DEVICES='0,5' is not a device list (device 5 does not exist: NPUDIST_DEVICE_COUNT=4): "
        "expected ids in 0..3; fix it or unset ASCEND_RT_VISIBLE_DEVICES"]


def test_empty_means_unset_and_defaults_apply():
    assert env.read("HCCL_CONNECT_TIMEOUT", {"HCCL_CONNECT_TIMEOUT": ""}) == 120
    assert env.read("NPUDIST_DEVICE_MEMORY", {}) == 16 << 30
    assert env.read("NPUDIST_DEVICE_MEMORY", {"NPUDIST_DEVICE_MEMORY": "1.5 MiB"}) == 3 << 19


def test_check_reports_every_problem_and_rewrites_valid_values_for_the_cpp_readers(monkeypatch):
    monkeypatch.setenv("HCCL_BUFFSIZE", "0")
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "-1")
    with pytest.raises(env.EnvironmentErrors) as e:
        env.check(("hccl",))
    assert [x.name for x in e.value.errors] == ["HCCL_CONNECT_TIMEOUT", "HCCL_BUFFSIZE"]
    assert str(e.value).startswith("2 malformed environment variables:\n  HCCL_CONNECT_TIMEOUT='-1' is not")
    # Valid spellings the C++ readers would misread: "false" is true for a reader that tests != "0", "0" of a
    # presence test is true, a padded number fails strtol's end check.
    for name in ("HCCL_BUFFSIZE", "HCCL_CONNECT_TIMEOUT"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("TORCH_HCCL_BLOCKING_WAIT", "Yes")
    monkeypatch.setenv("NPUDIST_ENGINE_NO_AVX2", "off")
    monkeypatch.setenv("NPUDIST_ENGINE_DIRECT", "auto")
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", " 30 ")
    monkeypatch.setenv("NPUDIST_HCCL_COMMUNICATOR", "")
    env.check(("hccl", "engine"))
    assert os.environ["TORCH_HCCL_BLOCKING_WAIT"] == "1" and os.environ["HCCL_EXEC_TIMEOUT"] == "30"
    for unset in ("NPUDIST_ENGINE_NO_AVX2", "NPUDIST_ENGINE_DIRECT", "NPUDIST_HCCL_COMMUNICATOR"):
        assert unset not in os.environ


def _python(code: str, **extra) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    full.update(extra)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=100,
                          cwd=REPO)


# Each: the variable's message, the warning at `import torch`, then torch.ones(4, device="npu") raising that
# same message instead of torch's "Expected one of cpu, cuda, ... device type at start of device string: npu".
DEVICE_CASES = [
    ("NPUDIST_DEVICE_COUNT", "abc", "is not a device count"),
    ("NPUDIST_DEVICE_MEMORY", "lots", "is not a positive size"),
    ("NPUDIST_LAUNCH_QUEUE_DEPTH", "many", "is not a queue depth"),
    ("ASCEND_RT_VISIBLE_DEVICES", "0,9", "is not a device list (device 9 does not exist"),
]


@pytest.mark.parametrize("name,raw,noun", DEVICE_CASES, ids=[c[0] for c in DEVICE_CASES])
def test_malformed_device_variable_at_import_torch(name, raw, noun):
    r = _python("import torch\n"
                "print(torch.ones(2).sum().item(), torch.npu.is_available(), torch.npu.device_count())\n"
                "try:\n    torch.ones(4, device='npu')\nexcept ValueError as e:\n    print('raised:', e)\n"
                "import npudist", **{name: raw})
    head = f"{name}={raw!r} {noun}"
    out = r.stdout.splitlines()
    assert out[0] == "2.0 False 0", r.stderr
    assert out[1].startswith(f"raised: {head}"), r.stdout
    assert f"RuntimeWarning: npudist: {head}" in r.stderr            # at import torch
    assert "an extension that is not built" not in r.stderr
    # the user's own `import npudist` raises the ValueError, as it does without autoload
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1].startswith(f"npudist.env.EnvVarError: {head}")


def test_a_variable_fixed_in_the_process_lets_register_install_the_real_device():
    r = _python("import os, torch\n"
                "os.environ['ASCEND_LAUNCH_BLOCKING'] = 'false'\n"
                "import npudist\nnpudist.register()\n"
                "print(torch.ones(2, device='npu').sum().item(), torch.npu.launch.is_blocking(),"
                " os.environ['ASCEND_LAUNCH_BLOCKING'])",
                ASCEND_LAUNCH_BLOCKING="maybe")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2.0", "False", "0"]
    assert "ASCEND_LAUNCH_BLOCKING='maybe' is not a boolean" in r.stderr


HCCL_GROUPS = r"""
import os, torch, torch.distributed as dist
from npudist import env
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
for name, raw in (("HCCL_BUFFSIZE", "0"), ("HCCL_CONNECT_TIMEOUT", "-1"), ("HCCL_EXEC_TIMEOUT", "-1"),
                  ("TORCH_HCCL_BLOCKING_WAIT", "maybe"), ("HCCL_BUFFSIZE", "99999999"),
                  ("HCCL_DETERMINISTIC", "always")):
    os.environ[name] = raw
    try:
        g = dist.new_group([0], backend="hccl")
        print("created", name)
        dist.all_reduce(torch.ones(2, device="npu"), group=g)   # the communicator's device buffers, 2 x raw MB
    except (env.EnvVarError, torch.OutOfMemoryError) as e:
        print(f"{type(e).__name__}: {e}")
    del os.environ[name]
g = dist.new_group([0], backend="hccl")
t = torch.ones(2, device="npu")
dist.all_reduce(t, group=g)
print("ok", t.tolist())
dist.destroy_process_group()
"""


def test_malformed_hccl_variables_fail_group_creation_with_their_name():
    r = _python(HCCL_GROUPS, HCCL_BUFFSIZE="0")     # also malformed at import: a warning, the device works
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("EnvVarError: HCCL_BUFFSIZE='0' is not a buffer size: expected a whole number of MB")
    assert lines[1].startswith("EnvVarError: HCCL_CONNECT_TIMEOUT='-1' is not a timeout")
    assert lines[2].startswith("EnvVarError: HCCL_EXEC_TIMEOUT='-1' is not a timeout")
    assert lines[3].startswith("EnvVarError: TORCH_HCCL_BLOCKING_WAIT='maybe' is not a boolean")
    # A size the device cannot hold: the group is created (CANN allocates the buffers with the communicator,
    # which torch_npu creates at the first op on npu tensors), its first npu op is an out-of-memory error
    # naming the variable.
    assert lines[4] == "created HCCL_BUFFSIZE", lines[4]
    assert lines[5].startswith("OutOfMemoryError: NPU out of memory: the hccl communicator of group"), lines[5]
    assert "(2 x HCCL_BUFFSIZE=99999999 MB, as CANN allocates them for every communicator)" in lines[5], lines[5]
    assert "Lower HCCL_BUFFSIZE" in lines[5], lines[5]
    assert lines[6].startswith("EnvVarError: HCCL_DETERMINISTIC='always' is not a determinism level"), lines[6]
    assert lines[7] == "ok [1.0, 1.0]"
    assert "RuntimeWarning: npudist: HCCL_BUFFSIZE='0' is not a buffer size" in r.stderr
    assert "creating an hccl process group raises this error" in r.stderr
