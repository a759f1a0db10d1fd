"""Runs PyTorch's own test files for the parallel layer (FSDP2, DTensor, tensor parallel, pipelining) from a
PyTorch source tree on npu + hccl, and compares the outcome with an expected-failure list.

    python tests/upstream/run_pytorch_tests.py --pytorch-src ~/pytorch --suite fsdp2 [--suite tp ...]
        [--file test/distributed/...py ...] [--devices 4] [--test-timeout 600] [--out results.jsonl] [--check]

The files are PyTorch's, never copied here: check out PyTorch at the commit of the installed torch
(``python -c "import torch; print(torch.version.git_version)"``). Each file runs in its own pytest process with
``npu_harness`` (the one place where the harness learns the npu device, applied in every process it starts) and without PyTorch's own conftest (its
CI sharding), with ``--devices`` npu devices visible (the harnesses size their worlds by it). A test is
identified as ``<file>::<class>::<test>``; a line of expected_failures.txt names a test or a whole file (one that
fails to import) and gives the reason after ``#``. ``--check`` fails on a failure not listed and on a listed
test that passed (stale in either direction); docs/hccl.md records each run.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "expected_failures.txt")
SUITES = {
    "fsdp2": "test/distributed/_composable/fsdp/test_fully_shard_*.py",
    "dtensor": "test/distributed/tensor/test_*.py",
    "tp": "test/distributed/tensor/parallel/test_*.py",
    "pipelining": "test/distributed/pipelining/test_*.py",
}


def select_files(src: str, suites: list[str], files: list[str]) -> list[str]:
    """Paths relative to ``src`` of the suites' files and the named ones, sorted, each once."""
    out = set(files)
    for suite in suites:
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}: one of {sorted(SUITES)}")
        out.update(os.path.relpath(p, src) for p in glob.glob(os.path.join(src, SUITES[suite])))
    missing = [f for f in out if not os.path.isfile(os.path.join(src, f))]
    if missing:
        raise ValueError(f"not in the PyTorch tree {src}: {missing} (is --pytorch-src the repository's root?)")
    return sorted(out)


def run_file(src: str, rel: str, devices: int, test_timeout: float) -> list[dict]:
    """One file's tests as records {"test", "outcome": passed|failed|skipped|error, "seconds", "detail"}."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "junit.xml")
        env = dict(os.environ, ASCEND_RT_VISIBLE_DEVICES=",".join(str(i) for i in range(devices)),
                   PYTHONPATH=os.pathsep.join([os.path.join(HERE, "site"), HERE, os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "pytest", os.path.join(src, rel), "--noconftest",
               "-p", "no:cacheprovider", "-o", "addopts=", "-q", f"--junitxml={junit}",
               f"--timeout={test_timeout}", "--rootdir", src]
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                                  timeout=test_timeout * 50 + 300)
        except subprocess.TimeoutExpired as e:
            return [{"test": rel, "outcome": "error", "seconds": time.monotonic() - start,
                     "detail": f"the file ran past {e.timeout:.0f} s"}]
        records = _junit_records(junit, rel) if os.path.exists(junit) else []
        if not records or proc.returncode in (2, 3, 4):   # interrupted, internal or usage error: nothing ran
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            records.append({"test": rel, "outcome": "error", "seconds": time.monotonic() - start,
                            "detail": "\n".join(tail)})
        return records


def _junit_records(path: str, rel: str) -> list[dict]:
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        record = {"test": f"{rel}::{cls}::{case.get('name')}" if cls else f"{rel}::{case.get('name')}",
                  "outcome": "passed", "seconds": float(case.get("time", 0)), "detail": ""}
        for tag, outcome in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
            node = case.find(tag)
            if node is not None:
                record["outcome"] = outcome
                record["detail"] = (node.text or node.get("message") or "")[-1500:]   # the end names the cause
                break
        if record["test"].endswith("::") or not case.get("name"):
            continue
        out.append(record)
    return out


def read_expected(path: str) -> dict[str, str]:
    """{test or file: reason}; a line without a reason, or listed twice, is an error."""
    out: dict[str, str] = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            name, sep, reason = line.partition("#")
            name, reason = name.strip(), reason.strip()
            if not sep or not reason:
                raise ValueError(f"{path}:{n}: {name!r} has no reason (write it after '#')")
            if name in out:
                raise ValueError(f"{path}:{n}: {name!r} is listed twice")
            out[name] = reason
    return out


def check(records: list[dict], expected: dict[str, str]) -> list[str]:
    """Problems: failures not listed, and listed tests or files (of the files that ran) that did not fail."""
    files_run = {r["test"].split("::")[0] for r in records}
    failed = {r["test"] for r in records if r["outcome"] in ("failed", "error")}
    problems = [f"not listed in expected_failures.txt: {t}" for t in sorted(failed)
                if t not in expected and t.split("::")[0] not in expected]
    for name in sorted(expected):
        if name.split("::")[0] not in files_run:
            continue
        listed_failed = name in failed if "::" in name else any(t.split("::")[0] == name for t in failed)
        if not listed_failed:
            problems.append(f"stale: {name} is listed but did not fail")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pytorch-src", required=True, help="root of a PyTorch checkout (at the installed torch)")
    ap.add_argument("--suite", action="append", default=[], choices=sorted(SUITES))
    ap.add_argument("--file", action="append", default=[], help="a test file, relative to --pytorch-src")
    ap.add_argument("--devices", type=int, default=4, help="npu devices visible to the tests (world sizes)")
    ap.add_argument("--test-timeout", type=float, default=600.0, help="seconds per test")
    ap.add_argument("--expected", default=EXPECTED)
    ap.add_argument("--out", help="write one JSON line per test")
    ap.add_argument("--check", action="store_true", help="exit 1 on unexpected or stale entries")
    args = ap.parse_args(argv)
    src = os.path.abspath(os.path.expanduser(args.pytorch_src))
    files = select_files(src, args.suite, args.file)
    if not files:
        ap.error("no test file selected: name --suite or --file")
    records = []
    for rel in files:
        got = run_file(src, rel, args.devices, args.test_timeout)
        counts = {k: sum(r["outcome"] == k for r in got) for k in ("passed", "failed", "skipped", "error")}
        print(f"{rel}: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v), flush=True)
        records += got
    if args.out:
        with open(args.out, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    total = {k: sum(r["outcome"] == k for r in records) for k in ("passed", "failed", "skipped", "error")}
    print(f"{total['passed']} passed, {total['failed'] + total['error']} failed, {total['skipped']} skipped")
    if args.check:
        problems = check(records, read_expected(args.expected))
        for p in problems:
            print(p)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
