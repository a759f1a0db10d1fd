"""Worker that fails on one rank: by exception (default), exit code or signal.

CRASH_RANK: the failing rank; CRASH_MODE: raise | torch (an error raised inside torch) | exit | abort;
CRASH_ATTEMPTS: fail only in the first N attempts (TORCHELASTIC_RESTART_COUNT < N), so a restarted group can succeed.
"""
import os
import sys
import time

rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"ALIVE rank={rank} attempt={attempt}", flush=True)
fails = rank == int(os.environ.get("CRASH_RANK", "1")) and attempt < int(os.environ.get("CRASH_ATTEMPTS", "1000"))
if fails:
    mode = os.environ.get("CRASH_MODE", "raise")
    if mode == "raise":
        def load_batch(step):
            raise ValueError(f"corrupt batch at step {step} on rank {rank}")
        load_batch(7)
    elif mode == "torch":
        import torch
        import torch.distributed as dist

        def sync_grads():
            dist.all_reduce(torch.ones(2))   # no process group: torch raises inside distributed_c10d.py
        sync_grads()
    elif mode == "exit":
        print("giving up with exit code 3", file=sys.stderr, flush=True)
        sys.exit(3)
    elif mode == "abort":
        os.abort()
else:
    time.sleep(float(os.environ.get("SURVIVOR_SLEEP", "0.5")))
print(f"DONE rank={rank} attempt={attempt}", flush=True)
