"""Per-step reporting on rank 0: one human-readable line with a progress bar, and JSON-lines metrics."""
from __future__ import annotations

import json
import os
import resource
import sys
import time

import torch


def memory_in_use(device: torch.device) -> tuple[int, int, str]:
    """(bytes now, peak bytes since the last ``reset_peak_memory``, label): allocator bytes on an accelerator,
    else this process's resident set (its peak is the process's high-water mark, never reset)."""
    if device.type != "cpu":
        mod = getattr(torch, device.type)
        return int(mod.memory_allocated(device)), int(mod.max_memory_allocated(device)), "dev"
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        rss = 0
    return rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss"


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak window (one per step) on an accelerator; a no-op on cpu."""
    if device.type != "cpu":
        getattr(torch, device.type).reset_peak_memory_stats(device)


def progress_bar(done: int, total: int, width: int = 20) -> str:
    filled = int(width * done / max(total, 1))
    return "[" + "#" * filled + "-" * (width - filled) + f"] {100 * done // max(total, 1):3d}%"


def format_seconds(s: float) -> str:
    m, s = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class MetricsLogger:
    """Writes only on rank 0 (the loss is already global). ``log_every`` thins the console lines but the
    first step of the run (so a new user sees training has started) and the last are always shown; every
    step is also one JSON object per line in ``metrics_path``.

    Memory: ``memory_bytes`` is what the npu allocator holds at the end of the step (parameters, gradients,
    optimizer state), ``memory_peak_bytes`` the most it held during the step (adds gathered FSDP units and
    activations) -- the number ``npudist plan check``'s per-rank estimate is comparable to. Rank 0's only."""

    def __init__(self, logging_cfg, total_steps: int, tokens_per_step: int, device: torch.device,
                 rank: int = 0, stream=None):
        self.cfg, self.total, self.tokens_per_step, self.device = logging_cfg, total_steps, tokens_per_step, device
        self.enabled = rank == 0
        self.stream = stream or sys.stdout
        self.start = time.perf_counter()
        self._first = True
        self._file = None
        if self.enabled and logging_cfg.metrics_path:
            os.makedirs(os.path.dirname(os.path.abspath(logging_cfg.metrics_path)), exist_ok=True)
            self._file = open(logging_cfg.metrics_path, "a", encoding="utf-8")

    def log(self, step: int, loss: float, lr: float, grad_norm: float, step_time: float,
            expert_load: list[int] | None = None) -> dict:
        """``expert_load``: routed token slots per expert in this step (MoE models), summed over the MoE layers
        and all ranks; logged as ``expert_load`` and, on the console, as the least/most loaded expert's share
        of the mean (1.00/1.00 = perfectly balanced)."""
        mem, peak, mem_kind = memory_in_use(self.device)
        record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                  "tokens": step * self.tokens_per_step,
                  "tokens_per_s": self.tokens_per_step / step_time if step_time > 0 else 0.0,
                  "step_time_s": step_time, "elapsed_s": time.perf_counter() - self.start,
                  "memory_bytes": mem, "memory_peak_bytes": peak, "memory_kind": mem_kind}
        balance = ""
        if expert_load:
            record["expert_load"] = expert_load
            mean = sum(expert_load) / len(expert_load)
            if mean > 0:
                balance = f" | experts min/max {min(expert_load) / mean:.2f}/{max(expert_load) / mean:.2f} of mean"
        if not self.enabled:
            return record
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        first, self._first = self._first, False
        if first or step % self.cfg.log_every == 0 or step == self.total:
            bar = progress_bar(step, self.total) + " " if self.cfg.progress_bar else ""
            eta = (self.total - step) * record["elapsed_s"] / max(step, 1)
            line = (f"{bar}step {step:>{len(str(self.total))}}/{self.total} | loss {loss:.4f} | "
                    f"tok/s {record['tokens_per_s']:,.0f} | mem({mem_kind}) {mem / 2**20:,.1f} MiB "
                    f"peak {peak / 2**20:,.1f} MiB | "
                    f"lr {lr:.2e} | gnorm {grad_norm:.3f}{balance} | {step_time:.2f} s/step | "
                    f"{format_seconds(record['elapsed_s'])} elapsed, eta {format_seconds(eta)}")
            print(line, file=self.stream, flush=True)
        return record

    def describe_outputs(self) -> str | None:
        """Where the metrics go (absolute path), for the start-up lines; None when there is no file."""
        if not self.cfg.metrics_path:
            return None
        return f"metrics: {os.path.abspath(self.cfg.metrics_path)} (one JSON line per step)"

    def message(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
