"""`npurun`'s entry point: the environment check that must precede ``import torch``, then the job (job.py).

``import torch`` loads npudist (PyTorch's device-backend autoload), and a malformed npudist variable would
only warn there. npurun checks every variable first and reports a malformed one as its own usage error
(exit code 2) before anything starts; valid values reach the workers in their canonical spelling.
"""
from __future__ import annotations

import os
import signal
import sys

from npudist import env

EXIT_USAGE = 2
AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def main(argv: list[str] | None = None) -> None:
    # Worker lines are relayed through this process: flush each one even when stdout is a pipe or file.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    # Until torchelastic installs its handlers (when workers start), Ctrl-C must end npurun at once: a
    # KeyboardInterrupt would wait for the C++ rendezvous wait to return (up to its 900 s timeout).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        env.check()
    except env.EnvVarError as e:
        print(f"npurun: {e} (nothing was started; accepted values: docs/environment.md)", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    # npurun's own process needs torch's launcher, not the npu device: it registers npudist itself only when it
    # counts devices, so a usage error is reported without waiting for the device to load. The workers inherit
    # the user's setting.
    saved = os.environ.get(AUTOLOAD)
    os.environ[AUTOLOAD] = "0"
    try:
        from .job import run
    finally:
        if saved is None:
            del os.environ[AUTOLOAD]
        else:
            os.environ[AUTOLOAD] = saved
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
