"""Benchmark helper: one long-lived worker process per mode, driven in alternating rounds.

A worker reads one line from stdin per round and answers with one line of JSON (its measurement); the
driver asks every worker once per round, reversing the order every other round, so machine noise hits all
modes alike. Used where a mode is fixed per process (e.g. ASCEND_LAUNCH_BLOCKING, read once)."""
from __future__ import annotations

import json
import subprocess


def alternate(workers: dict[str, tuple[list[str], dict]], rounds: int) -> dict[str, list[dict]]:
    """``workers``: mode -> (command, environment). Returns mode -> one parsed JSON answer per round."""
    procs = {mode: subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for mode, (cmd, env) in workers.items()}
    answers: dict[str, list[dict]] = {mode: [] for mode in procs}
    try:
        for r in range(rounds):
            for mode in (list(procs) if r % 2 == 0 else list(procs)[::-1]):
                p = procs[mode]
                p.stdin.write("go\n")
                p.stdin.flush()
                line = p.stdout.readline()
                if not line:
                    raise RuntimeError(f"{mode} worker exited (code {p.wait()})")
                answers[mode].append(json.loads(line))
    finally:
        for p in procs.values():
            p.stdin.close()
        for p in procs.values():
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return answers
