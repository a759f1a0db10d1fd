"""``npu-smi``: the emulated devices and the processes using them, in the layout of Ascend's npu-smi.

    npu-smi info          # devices (name, health, HBM used / total) and processes with their device memory
    npu-smi info -l       # list the devices

Torch-free and quick. Devices are the physical devices of the emulated runtime (``NPUDIST_DEVICE_COUNT`` in this
command's environment, default 8). Memory comes from the usage record every process using an npu device publishes
(``/dev/shm/npudist-usage-<pid>``, device_core/runtime/runtime_usage.cpp): the device memory it holds (caching-allocator
segments and aclrtMalloc blocks) per device, and the capacity it sees (``NPUDIST_DEVICE_MEMORY``); a device no
process uses shows this command's own ``NPUDIST_DEVICE_MEMORY`` (default 16GiB).
"""
from __future__ import annotations

import argparse
import os
import struct
import sys
from dataclasses import dataclass, field

from npudist import env

SHM = "/dev/shm"
PREFIX = "npudist-usage-"           # NPUDIST_USAGE_PREFIX (npudist/runtime_usage.h)
MAGIC = b"NPUUSAGE"
MAX_DEVICES = env.MAX_DEVICES
RECORD = struct.Struct(f"=8sIi{MAX_DEVICES}Q{MAX_DEVICES}Q")  # NpudistUsageRecord, version 1
SOC_NAME = "NpudistEmulatedNPU"      # aclrtGetSocName of the emulated libascendcl.so
MIB = 1 << 20
EXIT_USAGE = 2


@dataclass
class Process:
    pid: int
    name: str
    used: dict[int, int] = field(default_factory=dict)       # physical device -> bytes
    capacity: dict[int, int] = field(default_factory=dict)   # physical device -> bytes


def configured_devices() -> tuple[int, int]:
    """(device count, capacity in bytes) from this command's environment, as the runtime reads it."""
    return env.read("NPUDIST_DEVICE_COUNT"), env.read("NPUDIST_DEVICE_MEMORY")


def _maps_record(pid: int, path: str) -> bool:
    """The process is alive and has the record mapped (a reused pid has not)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(line.rstrip().endswith(path) for line in f)
    except OSError:
        return False


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def read_processes(shm: str = SHM) -> list[Process]:
    """Every live process's usage record; records of processes that are gone (killed) are removed."""
    procs = []
    try:
        names = sorted(n for n in os.listdir(shm) if n.startswith(PREFIX))
    except OSError:
        return procs
    for name in names:
        path = os.path.join(shm, name)
        try:
            with open(path, "rb") as f:
                raw = f.read(RECORD.size)
        except OSError:
            continue
        if len(raw) < RECORD.size:
            continue  # being created
        fields = RECORD.unpack(raw)
        magic, version, pid = fields[:3]
        if magic != MAGIC or version != 1:
            continue
        if not _maps_record(pid, path):
            try:
                os.unlink(path)  # stale: its process died without unlinking it
            except OSError:
                pass
            continue
        used, capacity = fields[3:3 + MAX_DEVICES], fields[3 + MAX_DEVICES:]
        procs.append(Process(pid, _process_name(pid), {d: b for d, b in enumerate(used) if b},
                             {d: b for d, b in enumerate(capacity) if b}))
    return procs


def _mb(n: int) -> int:
    return (n + MIB - 1) // MIB


def render_info(count: int, capacity: int, procs: list[Process]) -> str:
    w1, w2, w3 = 27, 15, 52

    def row(a: str, b: str, c: str) -> str:
        return f"| {a:<{w1 - 1}}| {b:<{w2 - 1}}| {c:<{w3 - 1}}|"

    sep = f"+{'-' * w1}+{'-' * w2}+{'-' * w3}+"
    bold = f"+{'=' * w1}+{'=' * w2}+{'=' * w3}+"
    title = "npu-smi (npudist emulated devices)"
    lines = [f"+{'-' * (w1 + w2 + w3 + 2)}+", f"| {title:<{w1 + w2 + w3 + 1}}|", sep,
             row("NPU   Name", "Health", "Power(W)    Temp(C)           Hugepages-Usage(page)"),
             row("Chip", "Bus-Id", "AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)"), bold]
    for d in range(count):
        used = sum(p.used.get(d, 0) for p in procs)
        total = max([p.capacity[d] for p in procs if d in p.capacity], default=capacity)
        lines += [row(f"{d:<6}{SOC_NAME}", "OK", f"{'-':<12}{'-':<18}-"),
                  row("0", "-", f"{'-':<12}{'-':<18}{_mb(used)} / {_mb(total)}"), bold]
    lines += [sep, row("NPU     Chip", "Process id", f"{'Process name':<25}| Process memory(MB)"), bold]
    for d in range(count):
        users = [p for p in procs if p.used.get(d)]
        if not users:
            lines.append(f"| {'No running processes found in NPU ' + str(d):<{w1 + w2 + w3 + 1}}|")
        for p in users:
            lines.append(row(f"{d:<8}0", str(p.pid), f"{p.name:<25}| {_mb(p.used[d])}"))
        lines.append(bold)
    return "\n".join(lines)


def render_list(count: int) -> str:
    lines = [f"\tTotal Count                    : {count}", ""]
    for d in range(count):
        lines += [f"\tNPU ID                         : {d}", f"\tName                           : {SOC_NAME}",
                  "\tChip Count                     : 1", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="npu-smi", description="npudist's emulated NPU devices and their processes")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="devices, memory and processes (-l: list the devices)")
    info.add_argument("-l", action="store_true", dest="list", help="list the devices")
    args = parser.parse_args(argv)
    try:
        count, capacity = configured_devices()
    except ValueError as e:
        print(f"npu-smi: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(render_list(count) if args.list else render_info(count, capacity, read_processes()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
