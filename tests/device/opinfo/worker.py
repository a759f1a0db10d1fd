"""Worker processes, forked from a zygote that has imported torch, npudist and op_db once.

The pool starts ``python -m tests.device.opinfo.worker`` (the zygote) and talks to it in JSON lines
over stdin/stdout: ``{"cmd": "fork", "socket": path}`` forks a worker that connects to the pool's
Unix socket at ``path`` (reply ``{"pid": n}``); ``{"cmd": "wait", "pid": n}`` reaps a worker (reply
``{"status": returncode}``, negative for a signal, as subprocess reports it). Forking costs
milliseconds where a fresh interpreter costs seconds of imports, so a crashed worker is cheap to
replace. The zygote never runs an op (no intra-op or autograd threads exist when it forks).

The zygote's ``ready`` message also says which launch mode the process runs in (``blocking``: the pool
sets ``ASCEND_LAUNCH_BLOCKING`` in the zygote's environment, read once by the device).

A worker receives tasks ``{"op": id, "dtypes": [names], "max_samples": K, "more_forms": [forms]}`` (the
forms that continue beyond K samples) and sends ``begin`` and
``progress`` (sample, form, call) before anything that could kill the process (so the pool knows where a
crash happened), ``pair`` (one op x dtype result) and ``done``.
"""
import json
import os
import socket
import sys


def serve_zygote(catalog: dict, run_task, blocking: bool = False) -> None:
    """Announce ``catalog`` (op id -> dtype names) and the launch mode, then fork workers that call
    ``run_task(task, send)``."""
    out = sys.stdout
    out.write(json.dumps({"t": "ready", "ops": catalog, "blocking": blocking}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "fork":
            pid = os.fork()
            if pid == 0:
                _serve_worker(cmd, run_task)  # never returns
            out.write(json.dumps({"pid": pid}) + "\n")
        elif cmd["cmd"] == "wait":
            _, status = os.waitpid(cmd["pid"], 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            out.write(json.dumps({"status": code}) + "\n")
        out.flush()


def _serve_worker(cmd: dict, run_task) -> None:
    code = 1
    try:
        err = os.open(cmd["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(err, 2)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)  # ops may print; stdout is the zygote's channel to the pool
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(cmd["socket"])
        channel = sock.makefile("rw", buffering=1)

        def send(**msg):
            channel.write(json.dumps(msg) + "\n")
            channel.flush()

        for line in channel:
            run_task(json.loads(line), send)
            send(t="done")
        code = 0
    finally:
        os._exit(code)


def _catalog_and_runner():
    import torch

    import npudist  # noqa: F401  (registers the npu device)
    from torch.testing._internal.common_methods_invocations import op_db

    from .execute import dtype_name, op_id, run_op_dtype
    from .observe import expose_draws

    torch.set_num_threads(1)  # one core per worker: the pool decides the parallelism
    torch._C._set_warnAlways(True)  # warn-once C++ warnings fire on every call (observe.py)
    expose_draws()
    ops = {op_id(op): op for op in op_db}

    def run_task(task, send):
        op = ops[task["op"]]
        for name in task["dtypes"]:
            send(t="begin", dtype=name)
            result = run_op_dtype(op, getattr(torch, name), task["max_samples"],
                                  lambda i, form, call: send(t="progress", sample=i, form=form, call=call),
                                  task.get("more_forms", ()))
            send(t="pair", op=task["op"], dtype=name, result=result)

    catalog = {name: sorted(dtype_name(d) for d in op.supported_dtypes("cpu")) for name, op in ops.items()}
    return catalog, run_task, torch.npu.launch.is_blocking()


if __name__ == "__main__":
    serve_zygote(*_catalog_and_runner())
