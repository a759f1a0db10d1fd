"""Counts and a readable failure list from the records of a run."""
from collections import Counter

from .expected import outcome

OUTCOMES = ("agree", "random", "expected-fail", "unlisted", "stale")


def count(records, entries: dict) -> dict:
    """Totals: ops, op x dtype x mode records and their outcomes, per-form samples and calls, bitwise share."""
    run = [r for r in records if r["status"] != "nosamples"]
    outcomes = Counter(outcome(r, entries) for r in run)
    kinds = Counter(kind for r in run for t in r["forms"].values() for kind in t.get("failures", {}))
    ops = sorted({r["op"] for r in records})
    bad = {r["op"] for r in run if outcome(r, entries) not in ("agree", "random", "expected-fail")}
    failing = {r["op"] for r in run if r["status"] != "agree"}
    forms = {}
    for r in run:
        for form, t in r["forms"].items():
            f = forms.setdefault(form, Counter())
            f["pairs"] += 1
            for k in ("samples", "calls", "agree", "bitwise", "drew", "random_agree"):
                f[k] += t.get(k, 0)
    compared = sum(f["agree"] - f["random_agree"] for f in forms.values())
    return {
        "ops": len(ops), "records": len(run), "pairs": len({(r["op"], r["dtype"]) for r in run}),
        "modes": sorted({r["mode"] for r in run}), "dtypes": len({r["dtype"] for r in run}),
        "nosamples_records": len(records) - len(run),
        "outcomes": dict(outcomes), "failure_kinds": dict(kinds),
        "ops_without_failure": len(set(ops) - failing), "ops_as_listed": len(set(ops) - bad),
        "forms": {k: dict(v) for k, v in sorted(forms.items())},
        "calls": sum(f["calls"] for f in forms.values()),
        "bitwise_share": sum(f["bitwise"] for f in forms.values()) / compared if compared else 1.0,
        "seconds": round(sum(r.get("seconds", 0.0) for r in records), 1),
        "cpu_seconds": round(sum(r.get("cpu_seconds", 0.0) for r in records), 1),
    }


def format_report(records, entries: dict, title: str = "") -> str:
    c = count(records, entries)
    o = c["outcomes"]
    lines = [title] if title else []
    lines += [
        f"ops: {c['ops']}  op x dtype pairs: {c['pairs']} ({c['dtypes']} dtypes; launch modes: "
        f"{', '.join(c['modes'])}; {c['records']} op x dtype x mode records, {c['nosamples_records']} more "
        f"without CPU samples)  npu calls compared: {c['calls']}",
        "records: " + ", ".join(f"{k} {o.get(k, 0)}" for k in OUTCOMES),
        "  (random: agree wherever values were compared; the samples that drew random numbers are listed)",
        "failing op x dtype x mode x form units by kind: " + ", ".join(
            f"{k} {c['failure_kinds'].get(k, 0)}" for k in ("warning", "mismatch", "error", "crash", "timeout")),
        f"ops without any failing form: {c['ops_without_failure']}/{c['ops']}; ops whose every failure and "
        f"draw is listed: {c['ops_as_listed']}/{c['ops']}",
        "per form (op x dtype x mode units / samples / npu calls / samples agreeing / of which drew):",
    ]
    for form, f in c["forms"].items():
        lines.append(f"  {form:9} {f['pairs']:6} / {f['samples']:7} / {f['calls']:8} / {f['agree']:7} / "
                     f"{f['random_agree']}")
    lines += [f"bitwise-equal share of agreeing samples whose values were compared: {100.0 * c['bitwise_share']:.2f}%",
              f"worker time: {c['seconds']} s wall, {c['cpu_seconds']} s CPU (excluding process start)", ""]
    failing = [r for r in records if r["status"] not in ("agree", "nosamples")]
    for r in sorted(failing, key=lambda r: (r["status"] != "crash", r["op"], r["dtype"], r["mode"])):
        tag = " (expected)" if outcome(r, entries) == "expected-fail" else ""
        for form, t in r["forms"].items():
            for kind, message in t.get("failures", {}).items():
                lines.append(f"{kind:8} {r['op']:36} {r['dtype']:10} {form + '@' + r['mode']:16}{tag} "
                             f"{' '.join(message.split())}")
    inexact = []
    for r in records:
        for form, t in r.get("forms", {}).items():
            n = t["agree"] - t.get("random_agree", 0) - t["bitwise"]
            if n > 0:
                inexact.append(f"{r['op']:36} {r['dtype']:10} {form + '@' + r['mode']:16} {n} of "
                               f"{t['agree']} agreeing samples within tolerance, not bitwise")
    if inexact:
        lines += ["", "agree but not bitwise equal:"] + sorted(inexact)
    return "\n".join(lines) + "\n"
