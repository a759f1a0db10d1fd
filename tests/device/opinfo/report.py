"""Counts and a readable failure list from the records of a run."""
from collections import Counter

from .expected import is_expected


def count(records, entries: dict) -> dict:
    """Totals: ops, op x dtype pairs, samples, pair outcomes, bitwise share, all-dtype op agreement."""
    run = [r for r in records if r["status"] != "nosamples"]
    outcome = Counter()
    for r in run:
        outcome["expected-fail" if r["status"] != "agree" and is_expected(r, entries) else r["status"]] += 1
    ops = sorted({r["op"] for r in records})
    ops_agree = [op for op in ops if all(r["status"] == "agree" for r in run if r["op"] == op)]
    ops_ok = [op for op in ops if all(r["status"] == "agree" or is_expected(r, entries)
                                      for r in run if r["op"] == op)]
    totals = Counter()
    for r in run:
        for phase in ("forward", "backward"):
            t = r.get(phase)
            if t:
                totals[f"{phase}_samples"] += t["samples"]
                totals[f"{phase}_agree"] += t["agree"]
                totals[f"{phase}_bitwise"] += t["bitwise"]
    fwd_ok = [r for r in run if r.get("forward") and r["forward"]["status"] == "agree" and r.get("backward")]
    bwd_ok = [r for r in fwd_ok if r["backward"]["status"] == "agree"]
    agreeing = totals["forward_agree"] + totals["backward_agree"]
    return {
        "ops": len(ops), "pairs": len(run), "dtypes": len({r["dtype"] for r in run}),
        "nosamples_pairs": len(records) - len(run),
        "outcomes": dict(outcome),
        "ops_agree_every_dtype": len(ops_agree), "ops_agree_or_expected": len(ops_ok),
        "forward_samples": totals["forward_samples"], "backward_samples": totals["backward_samples"],
        "bitwise_share": (totals["forward_bitwise"] + totals["backward_bitwise"]) / agreeing if agreeing else 1.0,
        "backward_pairs_where_forward_agrees": len(fwd_ok), "backward_agrees_there": len(bwd_ok),
        "seconds": round(sum(r.get("seconds", 0.0) for r in records), 1),
        "cpu_seconds": round(sum(r.get("cpu_seconds", 0.0) for r in records), 1),
    }


def format_report(records, entries: dict, title: str = "") -> str:
    c = count(records, entries)
    o = c["outcomes"]
    lines = [title] if title else []
    lines += [
        f"ops: {c['ops']}  op x dtype pairs: {c['pairs']} ({c['dtypes']} dtypes; {c['nosamples_pairs']} more "
        f"pairs without CPU samples)  samples: {c['forward_samples']} forward, {c['backward_samples']} backward",
        "pairs: " + ", ".join(f"{k} {o.get(k, 0)}" for k in
                              ("agree", "expected-fail", "crash", "timeout", "mismatch", "error")),
        f"ops agreeing in every dtype: {c['ops_agree_every_dtype']}/{c['ops']} "
        f"({100.0 * c['ops_agree_every_dtype'] / max(1, c['ops']):.1f}%); with expected failures: "
        f"{c['ops_agree_or_expected']}/{c['ops']}",
        f"bitwise-equal share of agreeing samples: {100.0 * c['bitwise_share']:.2f}%",
        f"backward agrees in {c['backward_agrees_there']} of {c['backward_pairs_where_forward_agrees']} "
        f"differentiable pairs whose forward agrees",
        f"worker time: {c['seconds']} s wall, {c['cpu_seconds']} s CPU (excluding process start)",
        "",
    ]
    failing = [r for r in records if r["status"] not in ("agree", "nosamples")]
    for r in sorted(failing, key=lambda r: (r["status"] != "crash", r["op"], r["dtype"])):
        tag = " (expected)" if is_expected(r, entries) else ""
        lines.append(f"{r['status']:8} {r['op']:40} {r['dtype']:12}{tag} {' '.join(r['message'].split())}")
    inexact = []
    for r in records:
        for phase in ("forward", "backward"):
            t = r.get(phase)
            if t and t["bitwise"] < t["agree"]:
                inexact.append(f"{r['op']:40} {r['dtype']:12} {phase:8} {t['agree'] - t['bitwise']} of "
                               f"{t['agree']} agreeing samples within tolerance, not bitwise")
    if inexact:
        lines += ["", "agree but not bitwise equal:"] + sorted(inexact)
    return "\n".join(lines) + "\n"
