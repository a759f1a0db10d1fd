"""Reading an exported Chrome trace: the npu tracks, kernels, collectives and memory events in it."""
from __future__ import annotations

import json

PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1, as the trace's "[memory]" events give "Device Type"


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)  # Perfetto and chrome://tracing need valid JSON


def npu_tracks(trace: dict) -> dict[tuple[int, int], str]:
    """(pid, tid) -> thread name of every npu stream track."""
    names = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            name = e["args"]["name"]
            if name.startswith("npu:"):
                names[(e["pid"], e["tid"])] = name
    return names


def device_events(trace: dict, cat: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == cat]


def memory_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"]
            if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == PRIVATEUSE1]
