"""The worker process: imports torch, npudist and op_db once, then runs ops sent by the pool.

Protocol (JSON lines): tasks arrive on stdin as ``{"op": id, "dtypes": [names], "max_samples": K}``;
messages go to the file descriptor given as argv[1]: ``ready`` (with every op id and its CPU
dtypes), ``begin``/``progress`` before anything that could kill the process (so the pool knows where
a crash happened), ``pair`` (one op x dtype result) and ``done`` (the task is finished).
"""
import json
import os
import sys


def main(fd: int) -> None:
    import torch

    import npudist  # noqa: F401  (registers the npu device)
    from torch.testing._internal.common_methods_invocations import op_db

    from .execute import dtype_name, op_id, run_op_dtype

    torch.set_num_threads(1)  # one core per worker: the pool decides the parallelism
    out = os.fdopen(fd, "w", buffering=1)

    def send(**msg):
        out.write(json.dumps(msg) + "\n")
        out.flush()

    ops = {op_id(op): op for op in op_db}
    send(t="ready", ops={name: sorted(dtype_name(d) for d in op.supported_dtypes("cpu"))
                         for name, op in ops.items()})
    for line in sys.stdin:
        task = json.loads(line)
        op = ops[task["op"]]
        for name in task["dtypes"]:
            dtype = getattr(torch, name)
            send(t="begin", op=task["op"], dtype=name)
            result = run_op_dtype(op, dtype, task["max_samples"],
                                  lambda i, phase: send(t="progress", sample=i, phase=phase))
            send(t="pair", op=task["op"], dtype=name, result=result)
        send(t="done", op=task["op"])


if __name__ == "__main__":
    main(int(sys.argv[1]))
