"""Flight-recorder analyzer: ``python -m npudist.hccl.trace <dir-or-files...>``.

Reads the per-rank flight-recorder dumps in PyTorch's format, written by the hccl watchdog
(``TORCH_HCCL_DUMP_ON_TIMEOUT=1``) or by ``npudist.hccl.dump_flight_recorder_to_file()`` (NCCL's dumps read
the same way), lines the ranks of each process group up by collective sequence number, and reports: the last
completed (and last started) sequence number per rank, which ranks are behind (never issued an op the
others issued), the first op on which ranks disagree (op, sizes, dtypes, reduce op or root) and the ops
that failed, with hccl's error. PyTorch's analyzer reads the same files:
``python -m torch.distributed.flight_recorder.fr_trace <dir>``.
"""
from __future__ import annotations

import argparse
import ast
import glob
import io
import os
import pickle
import re
import sys
from dataclasses import dataclass, field

_TRAILING_RANK = re.compile(r"(\d+)$")


@dataclass
class RankTrace:
    file: str
    entries: list[dict]          # this group's entries, oldest first
    status: dict | None = None   # the dump's pg_status of this group


@dataclass
class GroupView:
    name: str
    desc: str = ""
    global_ranks: list[int] = field(default_factory=list)
    ranks: dict[int, RankTrace] = field(default_factory=dict)  # group rank -> that rank's trace

    @property
    def size(self) -> int:
        return len(self.global_ranks)


class _PlainUnpickler(pickle.Unpickler):
    """A dump holds only dicts, lists, tuples, strings and numbers: refuse anything that names a global, so
    reading a directory never runs code from a file in it."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a flight-recorder dump")


def _read_dump(path: str) -> dict | None:
    try:
        with open(path, "rb") as fh:
            doc = _PlainUnpickler(io.BytesIO(fh.read())).load()
    except (OSError, EOFError, ValueError, TypeError, IndexError, KeyError, pickle.UnpicklingError):
        return None
    if not (isinstance(doc, dict) and isinstance(doc.get("entries"), list) and "pg_config" in doc
            and "version" in doc):
        return None
    rank = doc.get("hccl_rank")
    if rank is None:  # a dump of another backend: the rank is the file name's suffix, as fr_trace reads it
        m = _TRAILING_RANK.search(os.path.basename(path))
        if not m:
            return None
        rank = int(m.group(1))
    doc["_rank"] = int(rank)
    doc["_file"] = path
    return doc


def load_dumps(paths: list[str]) -> list[dict]:
    """Every flight-recorder dump among `paths` (directories are searched one level deep)."""
    files: list[str] = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "*"))) if os.path.isdir(p) else [p]
    dumps = []
    for f in files:
        if f.endswith(".tmp") or not os.path.isfile(f):
            continue
        doc = _read_dump(f)
        if doc is not None:
            dumps.append(doc)
    return dumps


def group_views(dumps: list[dict]) -> dict[str, GroupView]:
    views: dict[str, GroupView] = {}
    for d in dumps:
        for name, cfg in d["pg_config"].items():
            ranks = [int(r) for r in ast.literal_eval(cfg["ranks"])]
            if d["_rank"] not in ranks:
                continue
            v = views.setdefault(name, GroupView(name, cfg.get("desc", ""), ranks))
            entries = [e for e in d["entries"] if e["process_group"][0] == name]
            pg_ids = {e["pg_id"] for e in entries}
            status = d.get("pg_status", {}).get(str(pg_ids.pop())) if len(pg_ids) == 1 else None
            v.ranks[ranks.index(d["_rank"])] = RankTrace(d["_file"], entries, status)
    return views


def _op(e: dict) -> str:
    """'hccl:send 0->1' -> 'send'."""
    return e["profiling_name"].split(":", 1)[-1].split(" ")[0]


def _shapes(e: dict) -> str:
    return f"in={e['input_sizes']} out={e['output_sizes']}"


def _signature(e: dict) -> tuple:
    return (_op(e), repr(e["input_sizes"]), repr(e["output_sizes"]), repr(e["input_dtypes"]),
            repr(e["output_dtypes"]), e.get("hccl_reduce_op"), e.get("hccl_root"))


def _collectives(t: RankTrace) -> dict[int, dict]:
    return {e["collective_seq_id"]: e for e in t.entries if not e["is_p2p"]}


def _state(e: dict) -> str:
    return "failed" if e.get("hccl_error") else e["state"]


def _last(t: RankTrace, colls: dict[int, dict], key: str, states: tuple[str, ...]) -> str:
    if t.status is not None:
        seq = t.status[key]
    else:
        seq = max((s for s, e in colls.items() if _state(e) in states), default=-1)
    return str(seq) if seq >= 0 else "none"


def analyze_group(v: GroupView) -> list[str]:
    desc = f" ({v.desc})" if v.desc and v.desc != "undefined" else ""
    lines = [f"group '{v.name}'{desc} (size {v.size}, global ranks {v.global_ranks})"]
    missing = [r for r in range(v.size) if r not in v.ranks]
    if missing:
        lines.append(f"  no dump from group ranks {missing}: they may have died, hung outside the group, "
                     "or run without TORCH_HCCL_DUMP_ON_TIMEOUT=1")
    colls = {r: _collectives(t) for r, t in v.ranks.items()}
    issued = {r: max(c) if c else 0 for r, c in colls.items()}
    for r in sorted(v.ranks):
        t = v.ranks[r]
        last = colls[r].get(issued[r])
        state = f"{_op(last)} seq {issued[r]} {_state(last)}" if last else "nothing issued"
        lines.append(f"  rank {r}: last completed seq {_last(t, colls[r], 'last_completed_collective', ('completed',))}"
                     f", last started seq "
                     f"{_last(t, colls[r], 'last_started_collective', ('started', 'completed', 'failed'))}"
                     f", last issued: {state}")
    top = max(issued.values(), default=0)
    behind = sorted(r for r, s in issued.items() if s < top)
    if behind:
        for r in behind:
            nxt = next((colls[o][issued[r] + 1] for o in colls if issued[r] + 1 in colls[o]), None)
            what = f" ({_op(nxt)} {_shapes(nxt)})" if nxt else ""
            lines.append(f"  BEHIND: rank {r} never issued seq {issued[r] + 1}{what}; the others reached "
                         f"seq {top}")
    else:
        lines.append(f"  no rank is behind (all issued up to seq {top})")
    first = None
    for seq in sorted({s for c in colls.values() for s in c}):
        present = {r: c[seq] for r, c in colls.items() if seq in c}
        if len(present) > 1 and len({_signature(e) for e in present.values()}) > 1:
            first = (seq, present)
            break
    if first:
        seq, present = first
        lines.append(f"  MISMATCH at seq {seq}:")
        for r in sorted(present):
            e = present[r]
            dtypes = ",".join(dict.fromkeys(e["input_dtypes"] + e["output_dtypes"])) or "-"
            lines.append(f"    rank {r}: {_op(e)} dtype={dtypes} "
                         f"reduce_op={e.get('hccl_reduce_op') or '-'} root={e.get('hccl_root', -1)} {_shapes(e)}")
    else:
        lines.append("  no mismatched collective among the recorded entries")
    failed = [(r, e) for r, c in colls.items() for e in c.values() if e.get("hccl_error")]
    for r, e in sorted(failed, key=lambda x: (x[1]["collective_seq_id"], x[0]))[:8]:
        lines.append(f"  failed on rank {r}: {_op(e)} seq {e['collective_seq_id']}: {e['hccl_error'][:300]}")
    return lines


def analyze(paths: list[str]) -> str:
    dumps = load_dumps(paths)
    if not dumps:
        raise ValueError(f"no flight-recorder dumps found in {paths}; hccl writes them to "
                         "$TORCH_HCCL_DEBUG_INFO_TEMP_FILE<rank> (default /tmp/hccl_trace_rank_<rank>)")
    out = [f"{len(dumps)} dump(s): global ranks {sorted(d['_rank'] for d in dumps)}"]
    for d in sorted(dumps, key=lambda d: d["_rank"]):
        reason = d.get("hccl_reason")
        out.append(f"  rank {d['_rank']}: {d['_file']}" + (f" (reason: {reason[:200]})" if reason else ""))
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
