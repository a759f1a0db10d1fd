"""A process that has imported torch once and forks test ranks from that state (tests/hccl/launcher.py).

Every multi-rank test starts 2-4 fresh Python processes, and `import torch` costs each ~1.6 s of CPU here, about
as much as the scenario itself; on the 2-core CI machine that was a large share of the suite's time. A rank forked
from this process starts with torch (and torch.distributed, numpy) imported and nothing else: npudist is not
(TORCH_DEVICE_BACKEND_AUTOLOAD=0 here), no torch op has run (so no thread pool exists to be lost in the fork),
no device or group exists. The child then takes its own environment, working directory, argv and output file
and runs the worker script as `python worker.py ...` would: torch's backend autoload (which loads npudist,
reading the rank's NPUDIST_* / HCCL_* variables), `__main__`, a traceback and exit code 1 on an uncaught
exception, `sys.exit` codes, and the interpreter's normal finalization (atexit handlers, thread joins).

The launcher uses it only when the rank's environment differs from the launcher's in variables read after torch's
import (its allow-list); anything else, or HCCL_TEST_FRESH_INTERPRETERS=1, gets a fresh interpreter as before.

Protocol: one JSON object per line on stdin, one reply per line on stdout, carrying the request's "id".
  {"op": "spawn", "argv": [script, ...], "env": {...}, "cwd": dir, "out": path} -> {"pid": n}
  {"op": "wait", "pid": n, "timeout": s} -> {"code": returncode or null}  (Popen's returncode)
EOF on stdin (the launcher's process exited) ends the zygote.
"""
import gc
import json
import os
import sys
import time


def _preload():
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401


def _returncode(status):
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _become_rank(req):
    """In the forked child: take the rank's session, files, environment and argv. Returns the script's path."""
    os.setsid()  # as Popen(start_new_session=True): the launcher kills the rank's whole group on a timeout
    out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # also closes the protocol's pipes (fds 0 and 1) in the child
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    # Line-buffered (a fresh interpreter buffers a file's output in blocks unless PYTHONUNBUFFERED is set): a rank
    # that aborts keeps its last lines.
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    script = req["argv"][0]
    sys.argv = list(req["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    if req["env"].get("PYTHONFAULTHANDLER"):
        import faulthandler
        faulthandler.enable()
    import torch
    if torch._is_device_backend_autoload_enabled():
        torch._import_device_backends()  # what `import torch` does in a fresh interpreter
    return script


def _serve():
    """The zygote's loop. Returns only in a forked child: the request it is to run."""
    children = {}  # pid -> returncode (None while running)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "spawn":
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                return req
            children[pid] = None
            reply = {"pid": pid}
        elif req["op"] == "wait":
            pid, deadline = req["pid"], time.monotonic() + req["timeout"]
            while children.get(pid) is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    children[pid] = _returncode(status)
                elif time.monotonic() >= deadline:
                    break
                else:
                    time.sleep(0.005)
            reply = {"code": children.get(pid)}
            if reply["code"] is not None:  # reported once: forget a finished child
                del children[pid]
        else:
            reply = {"error": f"unknown op {req['op']!r}"}
        reply["id"] = req.get("id")
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return None


if __name__ == "__main__":
    _preload()
    gc.freeze()  # the preloaded objects stay shared with the children instead of being copied on their first gc
    job = _serve()
    if job is None:
        sys.exit(0)
    script = _become_rank(job)
    import runpy
    del job
    runpy.run_path(script, run_name="__main__")
