"""Flight-recorder analyzer: ``python -m npudist.hccl.trace <dir-or-files...>``.

Reads the per-rank dumps written by the hccl watchdog (``TORCH_HCCL_DUMP_ON_TIMEOUT=1``) or by
``npudist.hccl.dump_flight_recorder_to_file()``, lines the ranks of each process group up by collective
sequence number, and reports: the last completed (and last started) sequence number per rank, which ranks
are behind (never issued an op the others issued) and the first op on which ranks disagree (op, dtype,
shapes, reduce op or root).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from dataclasses import dataclass, field

_SIGNATURE = ("op", "dtype", "reduce_op", "shapes", "root")


@dataclass
class GroupView:
    name: str
    size: int = 0
    global_ranks: list[int] = field(default_factory=list)
    # group rank -> dump of that rank for this group
    ranks: dict[int, dict] = field(default_factory=dict)


def load_dumps(paths: list[str]) -> list[dict]:
    """Every flight-recorder dump among `paths` (directories are searched one level deep)."""
    files: list[str] = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "*"))) if os.path.isdir(p) else [p]
    dumps = []
    for f in files:
        if f.endswith(".tmp") or not os.path.isfile(f):
            continue
        try:
            with open(f, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and "groups" in doc and "global_rank" in doc:
            doc["_file"] = f
            dumps.append(doc)
    return dumps


def group_views(dumps: list[dict]) -> dict[str, GroupView]:
    views: dict[str, GroupView] = {}
    for d in dumps:
        for g in d["groups"]:
            v = views.setdefault(g["group_name"], GroupView(g["group_name"]))
            v.size = g["size"]
            v.global_ranks = g.get("global_ranks") or list(range(g["size"]))
            v.ranks[g["rank"]] = g
    return views


def _collectives(g: dict) -> dict[int, dict]:
    return {e["seq"]: e for e in g["entries"] if not e["p2p"]}


def analyze_group(v: GroupView) -> list[str]:
    lines = [f"group '{v.name}' (size {v.size}, global ranks {v.global_ranks})"]
    missing = [r for r in range(v.size) if r not in v.ranks]
    if missing:
        lines.append(f"  no dump from group ranks {missing}: they may have died, hung outside the group, "
                     "or run without TORCH_HCCL_DUMP_ON_TIMEOUT=1")
    colls = {r: _collectives(g) for r, g in v.ranks.items()}
    issued = {r: max(c) if c else 0 for r, c in colls.items()}
    for r in sorted(v.ranks):
        g = v.ranks[r]
        last = colls[r].get(issued[r])
        state = f"{last['op']} seq {last['seq']} {last['state']}" if last else "nothing issued"
        lines.append(f"  rank {r}: last completed seq {g['last_completed_seq']}, last started seq "
                     f"{g['last_started_seq']}, last issued: {state}")
    top = max(issued.values(), default=0)
    behind = sorted(r for r, s in issued.items() if s < top)
    if behind:
        for r in behind:
            nxt = next((colls[o][issued[r] + 1] for o in colls if issued[r] + 1 in colls[o]), None)
            what = f" ({nxt['op']} {nxt['shapes']})" if nxt else ""
            lines.append(f"  BEHIND: rank {r} never issued seq {issued[r] + 1}{what}; the others reached "
                         f"seq {top}")
    else:
        lines.append(f"  no rank is behind (all issued up to seq {top})")
    first = None
    for seq in sorted({s for c in colls.values() for s in c}):
        present = {r: c[seq] for r, c in colls.items() if seq in c}
        if len(present) < 2:
            continue
        sigs = {r: tuple(e.get(k) for k in _SIGNATURE) for r, e in present.items()}
        if len(set(sigs.values())) > 1:
            first = (seq, present, sigs)
            break
    if first:
        seq, present, sigs = first
        lines.append(f"  MISMATCH at seq {seq}:")
        for r in sorted(present):
            e = present[r]
            lines.append(f"    rank {r}: {e['op']} dtype={e['dtype']} reduce_op={e['reduce_op'] or '-'} "
                         f"root={e['root']} {e['shapes']}")
    else:
        lines.append("  no mismatched collective among the recorded entries")
    failed = [(r, e) for r, c in colls.items() for e in c.values() if e["state"] == "failed"]
    for r, e in sorted(failed, key=lambda x: (x[1]["seq"], x[0]))[:8]:
        lines.append(f"  failed on rank {r}: {e['op']} seq {e['seq']}: {e['error'][:300]}")
    return lines


def analyze(paths: list[str]) -> str:
    dumps = load_dumps(paths)
    if not dumps:
        raise ValueError(f"no hccl flight-recorder dumps found in {paths}; dumps are written to "
                         "$TORCH_HCCL_DEBUG_INFO_TEMP_FILE<rank> (default /tmp/hccl_trace_rank_<rank>)")
    out = [f"{len(dumps)} dump(s): global ranks {sorted(d['global_rank'] for d in dumps)}"]
    for d in sorted(dumps, key=lambda d: d["global_rank"]):
        out.append(f"  rank {d['global_rank']}: {d['_file']} (reason: {d['reason'][:200]})")
    for name, v in sorted(group_views(dumps).items()):
        out += analyze_group(v)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npudist.hccl.trace", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="directory holding the dumps, or dump files")
    args = ap.parse_args(argv)
    try:
        print(analyze(args.paths))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
