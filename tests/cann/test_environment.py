"""The CANN home is chosen at import: npudist's emulated one when none is configured, a configured one left alone."""
import json
import os
import subprocess
import sys

import pytest

from npudist.cann import environment

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NPUDIST_CMD = os.path.join(os.path.dirname(sys.executable), "npudist")

PROBE = """
import json, os, sys
before_env, before_path = dict(os.environ), list(sys.path)
import torch, torch_npu
after_env = dict(os.environ)
maps = open("/proc/self/maps").read()
try:
    import acl
    acl_info = [acl.get_soc_name(), acl.rt.get_device_count()]
except ImportError as e:
    acl_info = "ImportError: " + str(e)
print(json.dumps({"changed": {k: v for k, v in after_env.items() if before_env.get(k) != v},
                  "path_added": [p for p in sys.path if p not in before_path],
                  "libascendcl": "libascendcl.so" in maps, "libtorch_npu": "libtorch_npu.so" in maps, "acl": acl_info}))
"""


def _clean_env(**extra) -> dict[str, str]:
    """A new user's environment: none of the variables npudist set in this test process."""
    env = {k: v for k, v in os.environ.items() if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")}
    for var, entry in (("LD_LIBRARY_PATH", environment.LIB64), ("PYTHONPATH", environment.PYTHON_DIR)):
        kept = [p for p in env.get(var, "").split(os.pathsep) if p and os.path.realpath(p) != os.path.realpath(entry)]
        env[var] = os.pathsep.join(kept)
    env.update(extra)
    return env


def _probe(env) -> dict:
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(200)
def test_import_selects_the_emulated_home_when_none_is_configured():
    out = _probe(_clean_env())
    home = environment.HOME
    assert out["changed"]["ASCEND_HOME_PATH"] == out["changed"]["ASCEND_TOOLKIT_HOME"] == home, out
    assert environment.LIB64 in out["changed"]["LD_LIBRARY_PATH"].split(os.pathsep), out
    assert environment.PYTHON_DIR in out["changed"]["PYTHONPATH"].split(os.pathsep), out
    assert out["libtorch_npu"] and out["libascendcl"], out   # loaded as torch_npu's import loads them
    assert out["acl"] == ["NpudistEmulatedNPU", [8, 0]], out  # pyACL's (value, ret)
    for name in ("include/acl/acl.h", "include/acl/acl_base.h", "include/acl/acl_rt.h", "lib64/libascendcl.so",
                 "ascend_toolkit_install.info"):
        assert os.path.exists(os.path.join(home, name)), name


@pytest.mark.timeout(200)
def test_a_configured_home_is_left_alone(tmp_path):
    out = _probe(_clean_env(ASCEND_HOME_PATH=str(tmp_path)))
    assert out["changed"] == {} and out["path_added"] == [], out
    assert not out["libascendcl"] and not out["libtorch_npu"], out
    assert out["acl"].startswith("ImportError: this 'acl' is npudist's emulated pyACL, but ASCEND_HOME_PATH="), out
    res = subprocess.run([NPUDIST_CMD, "env"], env=_clean_env(ASCEND_HOME_PATH=str(tmp_path)), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and res.stdout == "" and "selects a CANN toolkit" in res.stderr, res


@pytest.mark.timeout(200)
def test_npudist_env_prints_set_env_equivalent():
    # eval in a shell, then a fresh Python finds the home and pyACL without importing torch or npudist first.
    probe = "import os, acl; print(os.environ['ASCEND_HOME_PATH'], acl.get_soc_name())"
    script = f'eval "$({NPUDIST_CMD} env)" && {sys.executable} -S -c "{probe}"'
    res = subprocess.run(["bash", "-c", script], env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [environment.HOME, "NpudistEmulatedNPU"], res.stdout
