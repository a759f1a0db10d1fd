"""The checked-in expected-failure list (expected_failures.txt) and the check against a run.

One entry per line: ``op  dtypes  status  reason``. ``dtypes`` is ``*`` (every dtype the op runs in)
or a comma list; ``status`` is the failure expected (mismatch, error, crash, timeout); ``reason``
starts with ``random:`` (the result depends on the random generator, which on npu is independent of
CPU's, as CUDA's is), ``unsupported:`` (a documented absence, e.g. sparse npu tensors, which raise
NotImplementedError naming the op; docs/device.md "Absent") or ``bug:`` (a device bug being fixed). A run fails on a failure the list does
not expect, on a different failure than the one listed, and on a listed pair that now agrees.
"""
import os
from dataclasses import dataclass

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "expected_failures.txt")
REASON_KINDS = ("random:", "unsupported:", "bug:")
FAILURES = ("mismatch", "error", "crash", "timeout")


@dataclass(frozen=True)
class Entry:
    op: str
    dtypes: tuple  # ("*",) or dtype names
    status: str
    reason: str
    line: int

    def covers(self, dtype: str) -> bool:
        return self.dtypes == ("*",) or dtype in self.dtypes


def load(path: str = PATH) -> dict:
    """Op id -> list of Entry; raises ValueError naming the line of a malformed or overlapping entry."""
    entries = {}
    if not os.path.exists(path):
        return entries
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 3)
            if len(parts) < 4 or not parts[3].startswith(REASON_KINDS) or parts[2] not in FAILURES:
                raise ValueError(f"{path}:{n}: expected 'op dtypes status reason' with status in {FAILURES} "
                                 f"and a reason starting with {REASON_KINDS}, got {line!r}")
            op, dtypes, status, reason = parts
            entry = Entry(op, tuple(dtypes.split(",")), status, reason, n)
            for other in entries.get(op, []):
                if "*" in entry.dtypes + other.dtypes or set(entry.dtypes) & set(other.dtypes):
                    raise ValueError(f"{path}:{n}: {op} dtypes overlap with line {other.line}")
            entries.setdefault(op, []).append(entry)
    return entries


def find(entries: dict, op: str, dtype: str):
    """The entry expecting ``op`` in ``dtype`` to fail, or None."""
    return next((e for e in entries.get(op, []) if e.covers(dtype)), None)


def check(records, entries: dict, ops_run, catalog=None) -> list:
    """Problems of a run: unexpected failures and stale entries, each naming op, dtype and reason.

    ``ops_run``: the op ids this run covered (entries of other ops are not judged); ``catalog``: every
    op id of op_db (when given, entries naming unknown ops are stale).
    """
    problems = []
    tested = {}
    for rec in records:
        if rec["status"] == "nosamples":
            continue
        tested.setdefault(rec["op"], set()).add(rec["dtype"])
        entry = find(entries, rec["op"], rec["dtype"])
        where = f"{rec['op']} {rec['dtype']}"
        if rec["status"] == "agree":
            if entry is not None:
                problems.append(f"stale expected failure: {where} now agrees with CPU; remove it from "
                                f"expected_failures.txt line {entry.line} ({entry.reason})")
        elif entry is None:
            problems.append(f"{rec['status']}: {where}: {rec['message']}")
        elif rec["status"] != entry.status:
            problems.append(f"{where}: expected {entry.status} ({entry.reason}), got {rec['status']}: "
                            f"{rec['message']}")
    for op, op_entries in entries.items():
        for entry in op_entries:
            if catalog is not None and op not in catalog:
                problems.append(f"stale expected failure: {op} is not in op_db (line {entry.line}, {entry.reason})")
            elif op in ops_run and entry.dtypes != ("*",):
                for d in entry.dtypes:
                    if d not in tested.get(op, ()):
                        problems.append(f"stale expected failure: {op} {d} was not run (no CPU samples or "
                                        f"dtype unsupported); line {entry.line} ({entry.reason})")
    return problems


def is_expected(rec: dict, entries: dict) -> bool:
    entry = find(entries, rec["op"], rec["dtype"])
    return entry is not None and entry.status == rec["status"]


def write(records, entries: dict, path: str = PATH, header: str = "") -> None:
    """Rewrite the list from a run: one entry per op and status; reasons of still-failing entries are
    kept, new failures get ``bug: <first message>`` (to be edited by whoever fixes or explains them)."""
    run_dtypes, failing = {}, {}
    for rec in records:
        if rec["status"] == "nosamples":
            continue
        run_dtypes.setdefault(rec["op"], set()).add(rec["dtype"])
        if rec["status"] != "agree":
            failing.setdefault((rec["op"], rec["status"]), []).append(rec)
    lines = [header.rstrip("\n")] if header else []
    for (op, status), recs in sorted(failing.items()):
        dtypes = sorted(r["dtype"] for r in recs)
        old = next((e for e in entries.get(op, []) if any(e.covers(d) for d in dtypes)), None)
        reason = old.reason if old is not None else "bug: " + " ".join(recs[0]["message"].split())[:200]
        spec = "*" if set(dtypes) == run_dtypes[op] else ",".join(dtypes)
        lines.append(f"{op}  {spec}  {status}  {reason}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
