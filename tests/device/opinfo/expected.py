"""The checked-in expected-failure list (expected_failures.txt) and the check against a run.

One entry per line: ``op  dtypes  forms  status  reason``.
- ``dtypes``: ``*`` (every dtype the op runs in) or a comma list;
- ``forms``: ``*`` (every form the op defines) or a comma list of ``function``, ``method``, ``inplace``,
  ``out``, ``out_resize``, ``backward``, ``inference``, ``autocast`` (names.FORMS), each optionally limited to
  one launch mode: ``out@async``, ``function@blocking``;
- ``status``: ``random`` (samples draw from the random generator, so their values are not compared: npu's
  generator is independent of CPU's, as CUDA's is; the reason starts with ``random:``) or the failure kind
  expected (warning: npu warns differently; mismatch: a result differs; error: an exception differs or a
  result is on the wrong device; crash; timeout; the reason starts with ``unsupported:``, a documented
  absence such as sparse npu tensors, docs/device.md "Absent", or ``bug:``, a device bug being fixed).

A unit is one op x dtype x launch mode x form; it fails in a set of kinds (a wrong warning and a wrong value
of one form are two failures, so listing one does not excuse the other). A run fails on a failure kind no
entry of that status covers, on a unit that draws random numbers without a ``random`` entry, and on an entry
covering a unit that no longer fails that way (or no longer draws): stale in either direction. Entries of
one op overlap only with different statuses.
"""
import os
from dataclasses import dataclass

from .names import FORMS, MODES

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "expected_failures.txt")
REASON_KINDS = ("random:", "unsupported:", "bug:")
FAILURES = ("warning", "mismatch", "error", "crash", "timeout")
STATUSES = ("random",) + FAILURES
RANDOM_REASON = ("random: values of samples that draw from the random generator are not compared (npu's "
                 "generator is independent of CPU's, as CUDA's is)")


@dataclass(frozen=True)
class Entry:
    op: str
    dtypes: tuple  # ("*",) or dtype names
    forms: tuple  # ("*",) or form tokens: "out", "out@async"
    status: str
    reason: str
    line: int

    def covers(self, dtype: str, form: str, mode: str) -> bool:
        return ((self.dtypes == ("*",) or dtype in self.dtypes)
                and (self.forms == ("*",) or form in self.forms or f"{form}@{mode}" in self.forms))

    @property
    def is_random(self) -> bool:
        return self.status == "random"


def _tokens_overlap(a: tuple, b: tuple) -> bool:
    if "*" in a + b:
        return True
    base = lambda t: t.split("@")[0]  # noqa: E731
    return any(x == y or (base(x) == base(y) and ("@" not in x or "@" not in y)) for x in a for y in b)


def _parse(path: str, n: int, line: str) -> Entry:
    parts = line.split(None, 4)
    bad = f"{path}:{n}: expected 'op dtypes forms status reason'"
    if len(parts) < 5:
        raise ValueError(f"{bad} with a reason starting with {REASON_KINDS}, got {line!r}")
    op, dtypes, forms, status, reason = parts
    if status not in STATUSES:
        raise ValueError(f"{bad} with status in {STATUSES}, got {status!r}")
    if not reason.startswith(REASON_KINDS):
        raise ValueError(f"{bad} with a reason starting with {REASON_KINDS}, got {reason!r}")
    if (status == "random") != reason.startswith("random:"):
        raise ValueError(f"{path}:{n}: status 'random' goes with a 'random:' reason and only with it, got "
                         f"{status!r} with {reason.split(':')[0]!r}")
    tokens = tuple(forms.split(","))
    for t in tokens:
        form, _, mode = t.partition("@")
        if t != "*" and (form not in FORMS or (mode and mode not in MODES)):
            raise ValueError(f"{path}:{n}: form {t!r}: expected '*' or one of {FORMS}, optionally "
                             f"'@' one of {MODES}")
    return Entry(op, tuple(dtypes.split(",")), tokens, status, reason, n)


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
            entry = _parse(path, n, line)
            for other in entries.get(entry.op, []):
                if (other.status == entry.status and _tokens_overlap(entry.forms, other.forms)
                        and ("*" in entry.dtypes + other.dtypes or set(entry.dtypes) & set(other.dtypes))):
                    raise ValueError(f"{path}:{n}: {entry.op} dtypes and forms overlap with line {other.line} "
                                     f"(same status {entry.status})")
            entries.setdefault(entry.op, []).append(entry)
    return entries


def listed_forms(entries: dict) -> dict:
    """Op -> the forms its entries name ("*" for every form): what a sampled run still runs on every sample."""
    forms = {}
    for op, op_entries in entries.items():
        for e in op_entries:
            forms.setdefault(op, set()).update(t.split("@")[0] for t in e.forms)
    return {op: {"*"} if "*" in fs else fs for op, fs in forms.items()}


def find(entries: dict, op: str, dtype: str, form: str, mode: str, status: str):
    """The entry of ``status`` covering a unit, or None."""
    return next((e for e in entries.get(op, []) if e.status == status and e.covers(dtype, form, mode)), None)


def units(records):
    """(op, dtype, mode, form, {failure kind: first message}, samples that drew) of every form run."""
    for rec in records:
        if rec["status"] == "nosamples":
            continue
        for form, tally in rec["forms"].items():
            yield rec["op"], rec["dtype"], rec["mode"], form, tally.get("failures", {}), tally.get("drew", 0)


def judge_unit(entries: dict, op, dtype, mode, form, failures: dict, drew) -> list:
    """Problems of one unit against the list."""
    where = f"{op} {dtype} {form}@{mode}"
    problems = []
    for kind, message in failures.items():
        if find(entries, op, dtype, form, mode, kind) is None:
            listed = [e for e in entries.get(op, []) if not e.is_random and e.covers(dtype, form, mode)]
            also = f" (listed: {', '.join(f'{e.status} line {e.line}' for e in listed)})" if listed else ""
            problems.append(f"{kind}: {where}: {message}{also}")
    for e in entries.get(op, []):
        if not e.is_random and e.covers(dtype, form, mode) and e.status not in failures:
            problems.append(f"stale expected failure: {where} no longer fails with {e.status}; remove it from "
                            f"expected_failures.txt line {e.line} ({e.reason})")
    if set(failures) & {"crash", "timeout"}:
        return problems  # the pair stopped: whether it draws is unknown
    random = find(entries, op, dtype, form, mode, "random")
    if drew and random is None:
        problems.append(f"random: {where}: {drew} sample(s) drew from a random generator, so their values were "
                        f"not compared; list the unit with status 'random' if that is by design")
    elif not drew and random is not None:
        problems.append(f"stale expected failure: {where} drew no random numbers in any sample (values all "
                        f"compared); line {random.line} ({random.reason})")
    return problems


def check(records, entries: dict, ops_run, catalog=None) -> list:
    """Problems of a run: unexpected failures and draws, stale entries, each naming op, dtype, form and mode.

    ``ops_run``: the op ids this run covered (entries of other ops are not judged); ``catalog``: every
    op id of op_db (when given, entries naming unknown ops are stale).
    """
    problems, tested, forms_run = [], {}, {}
    for op, dtype, mode, form, failures, drew in units(records):
        tested.setdefault(op, set()).add(dtype)
        forms_run.setdefault(op, set()).update({form, f"{form}@{mode}"})
        problems += judge_unit(entries, op, dtype, mode, form, failures, drew)
    modes_run = {r["mode"] for r in records}
    for op, op_entries in entries.items():
        for entry in op_entries:
            if catalog is not None and op not in catalog:
                problems.append(f"stale expected failure: {op} is not in op_db (line {entry.line}, {entry.reason})")
                continue
            if op not in ops_run:
                continue
            for d in entry.dtypes if entry.dtypes != ("*",) else ():
                if d not in tested.get(op, ()):
                    problems.append(f"stale expected failure: {op} {d} was not run (no CPU samples or "
                                    f"dtype unsupported); line {entry.line} ({entry.reason})")
            for t in entry.forms if entry.forms != ("*",) else ():
                mode = t.partition("@")[2]
                if (not mode or mode in modes_run) and t not in forms_run.get(op, ()):
                    problems.append(f"stale expected failure: {op} form {t} was not run; line {entry.line} "
                                    f"({entry.reason})")
    return problems


def outcome(rec: dict, entries: dict) -> str:
    """A record's outcome for the report: 'agree', 'random' (agrees where values were compared; drawing
    samples listed), 'expected-fail' (every failure listed as it fails), 'unlisted' (a failure or draw the
    list does not cover) or 'stale' (agrees, but listed as failing)."""
    if rec["status"] == "nosamples":
        return "nosamples"
    problems = [p for form, t in rec["forms"].items()
                for p in judge_unit(entries, rec["op"], rec["dtype"], rec["mode"], form, t.get("failures", {}),
                                    t.get("drew", 0))]
    if problems:
        return "stale" if all(p.startswith("stale") for p in problems) else "unlisted"
    if rec["status"] != "agree":
        return "expected-fail"
    return "random" if any(t.get("drew") for t in rec["forms"].values()) else "agree"


def write(records, entries: dict, path: str = PATH, header: str = "") -> None:
    """Rewrite the list from a run: one entry per op, status and reason, naming the forms (with a mode
    where only one mode fails) and dtypes it covers; reasons of still-failing entries are kept, new
    failures get ``bug: <first message>`` (to be edited by whoever fixes or explains them)."""
    run_dtypes, run_forms, failing, messages = {}, {}, {}, {}
    modes_run = {r["mode"] for r in records}
    for op, dtype, mode, form, failures, drew in units(records):
        run_dtypes.setdefault(op, set()).add(dtype)
        run_forms.setdefault(op, set()).add(form)
        kinds = list(failures) + (["random"] if drew and not set(failures) & {"crash", "timeout"} else [])
        for status in kinds:
            failing.setdefault((op, status, form), {}).setdefault(dtype, set()).add(mode)
            messages.setdefault((op, status, form), failures.get(status, ""))
    grouped = {}  # (op, status, dtype spec) -> form tokens
    for (op, status, form), by_dtype in failing.items():
        for mode_set in {frozenset(m) for m in by_dtype.values()}:
            dtypes = sorted(d for d, m in by_dtype.items() if frozenset(m) == mode_set)
            token = form if mode_set == modes_run else f"{form}@{next(iter(mode_set))}"
            spec = "*" if set(dtypes) == run_dtypes[op] else ",".join(dtypes)
            grouped.setdefault((op, status, spec), []).append(token)
    lines = [header.rstrip("\n")] if header else []
    for (op, status, spec), tokens in sorted(grouped.items()):
        forms = "*" if set(tokens) == run_forms[op] else ",".join(sorted(tokens))
        old = next((e for e in entries.get(op, []) if e.status == status), None)
        if old is not None:
            reason = old.reason
        elif status == "random":
            reason = RANDOM_REASON
        else:
            msg = messages.get((op, status, tokens[0].split("@")[0]), "")
            reason = "bug: " + " ".join(msg.split())[:200]
        lines.append(f"{op}  {spec}  {forms}  {status}  {reason}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
