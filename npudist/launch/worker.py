"""Worker bootstrap: bind this process to its npu device, then run the user's program as ``__main__``.

``npurun`` starts every worker as ``python -u -m npudist.launch.worker [--device npu|cpu] [-m] TARGET ARGS``
so that ``torch.npu.current_device()`` is already right when the first line of the user's script runs,
exactly as if the script had called ``torch.npu.set_device(LOCAL_RANK)`` itself. The script then runs
with ``runpy`` under the name ``__main__`` with ``sys.argv``/``sys.path[0]`` as ``python script.py``
(or ``python -m module``) would set them.

An uncaught exception is printed as python prints it (without the bootstrap's frames) and written to
torchelastic's per-worker error file (``TORCHELASTIC_ERROR_FILE``, the JSON format of torchelastic's
``record``), so the launcher's exit summary can show the error even when the user did not decorate
their entrypoint; the exit code is 1, as for ``python script.py``.
"""
from __future__ import annotations

import faulthandler
import json
import os
import runpy
import sys
import time
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import NoReturn

DEVICE_KINDS = ("npu", "cpu")


@dataclass
class WorkerArgs:
    device: str
    module: bool
    target: str
    args: list[str]


def parse_worker_argv(argv: list[str]) -> WorkerArgs:
    """Parse the bootstrap's own options; everything from TARGET on belongs to the user program."""
    device, module, i = "npu", False, 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--device":
            if i + 1 >= len(argv):
                raise ValueError("npudist.launch.worker: --device needs a value (npu or cpu)")
            device = argv[i + 1]
            i += 2
        elif tok.startswith("--device="):
            device = tok.split("=", 1)[1]
            i += 1
        elif tok == "-m":
            module = True
            i += 1
        elif tok == "--":
            i += 1
            break
        else:
            break
    if device not in DEVICE_KINDS:
        raise ValueError(f"npudist.launch.worker: unknown --device {device!r}; expected one of {DEVICE_KINDS}")
    if i >= len(argv):
        raise ValueError("npudist.launch.worker: missing the script (or -m module) to run")
    return WorkerArgs(device=device, module=module, target=argv[i], args=list(argv[i + 1:]))


def bind_device(device: str) -> int | None:
    """Make npu:LOCAL_RANK the current device of this process; return it (None when not binding)."""
    if device == "cpu":
        return None
    local_rank_env = os.environ.get("LOCAL_RANK")
    if local_rank_env is None:
        raise ValueError("npudist.launch.worker: LOCAL_RANK is not set; start workers through npurun")
    local_rank = int(local_rank_env)
    import torch

    import npudist  # noqa: F401  (registers the npu device as torch.npu)

    count = torch.npu.device_count()
    if local_rank >= count:
        visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        raise ValueError(
            f"local rank {local_rank} has no npu device: only {count} visible"
            + (f" (ASCEND_RT_VISIBLE_DEVICES={visible})" if visible is not None else "")
            + "; start fewer ranks per node (--nproc) or make more devices visible")
    torch.npu.set_device(local_rank)
    return local_rank


def run_target(wargs: WorkerArgs) -> None:
    """Run the user program in this interpreter as ``__main__`` (python's own argv/sys.path rules)."""
    if wargs.module:
        # `python -m pkg.mod`: sys.path[0] is the working directory (already so under `-m` bootstrap).
        sys.argv = [wargs.target, *wargs.args]
        runpy.run_module(wargs.target, run_name="__main__", alter_sys=True)
    else:
        script = wargs.target
        if not os.path.exists(script):
            raise FileNotFoundError(f"npurun: training script not found: {script!r}")
        sys.argv = [script, *wargs.args]
        # `python script.py` puts the script's directory first on sys.path, not the working directory.
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """Drop the bootstrap's and runpy's frames so tracebacks look like `python script.py`'s."""
    here = os.path.abspath(__file__)
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name == here or name == "<frozen runpy>" or name == runpy.__file__:
            tb = tb.tb_next
        else:
            break
    return tb


def _report_and_exit(e: BaseException) -> NoReturn:
    """Print the exception as Python would and record it in torchelastic's error file, then exit 1."""
    tb = _user_traceback(e.__traceback__)
    text = "".join(traceback.format_exception(type(e), e, tb))
    sys.stderr.write(text)
    sys.stderr.flush()
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        # The format torchelastic's ErrorHandler writes and ProcessFailure reads.
        data = {"message": {"message": f"{type(e).__name__}: {e}",
                            "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))}}}
        try:
            with open(error_file, "w") as fp:
                json.dump(data, fp)
        except OSError as err:
            sys.stderr.write(f"npudist.launch.worker: could not write error file {error_file}: {err}\n")
    sys.exit(1)


def run_worker(wargs: WorkerArgs) -> None:
    """Bind, run, and turn an uncaught exception into an error report + exit code 1 (as python does)."""
    faulthandler.enable(all_threads=True)  # native crashes still print a Python stack, as with @record
    try:
        bind_device(wargs.device)
        run_target(wargs)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001  (KeyboardInterrupt too: python reports it the same way)
        _report_and_exit(e)


def run_bound_script_path(device: str, script: str, *script_args: str) -> None:
    """Entrypoint for ``npurun --run-path``: a function run by the agent's multiprocessing start method."""
    run_worker(WorkerArgs(device=device, module=False, target=script, args=list(script_args)))


def main(argv: list[str] | None = None) -> None:
    try:
        wargs = parse_worker_argv(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        sys.exit(str(e))
    run_worker(wargs)


if __name__ == "__main__":
    main()
