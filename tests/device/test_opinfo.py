"""PyTorch's OpInfo database as a conformance suite: every op_db op on npu vs cpu (tests/device/opinfo).

CI runs every op in every dtype the CPU supports, forward and backward, on the first
``MAX_SAMPLES`` samples of each op x dtype, spread over ``SHARDS`` tests so ``-n 2 --dist loadgroup``
keeps both xdist workers busy. The full run (every sample) is ``python -m tests.device.opinfo.run``;
docs/device.md records why and the last full result.
"""
import signal
import sys
import textwrap

import pytest

from .opinfo import expected
from .opinfo.pool import Pool, Task
from .opinfo.run import select_tasks

SHARDS = 8
MAX_SAMPLES = 5
PAIR_TIMEOUT = 120.0  # seconds per op x dtype; a hang is killed and recorded as that pair's failure


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("shard", range(SHARDS))
def test_op_db_agrees_with_cpu(shard):
    entries = expected.load()
    with Pool(1, MAX_SAMPLES, PAIR_TIMEOUT) as pool:
        catalog = pool.load_catalog()
        tasks = select_tasks(catalog, shard=(shard, SHARDS))
        records = list(pool.run(tasks))
    assert records, "no op x dtype ran"
    problems = expected.check(records, entries, {t.op for t in tasks}, catalog if shard == 0 else None)
    assert not problems, f"{len(problems)} problem(s) in shard {shard}:\n" + "\n".join(problems)


def test_expected_failures_have_reasons():
    entries = expected.load()  # raises ValueError on a line without status or reason
    for op_entries in entries.values():
        for e in op_entries:
            assert len(e.reason.split(":", 1)[1].strip()) > 10, f"line {e.line}: reason too short"


# -- the harness itself, on a scripted worker (no torch): crashes, hangs, failures, stale entries ----
_FAKE_ZYGOTE = textwrap.dedent('''
    import os, signal, sys, time
    sys.path.insert(0, os.getcwd())
    from tests.device.opinfo.worker import serve_zygote

    def run_task(task, send):
        for d in task["dtypes"]:
            send(t="begin", dtype=d)
            send(t="progress", sample=1, phase="backward")
            if task["op"] == "segv" and d == "float32":
                os.kill(os.getpid(), signal.SIGSEGV)
            if task["op"] == "abort":
                os.abort()
            if task["op"] == "hang" and d == "float32":
                time.sleep(60)
            status = "mismatch" if task["op"] == "bad" else "agree"
            tally = {"samples": 2, "agree": 2 if status == "agree" else 1, "bitwise": 1, "status": status,
                     "message": "sample 1: output: differs" if status != "agree" else ""}
            send(t="pair", op=task["op"], dtype=d, result={"forward": tally, "backward": None, "seconds": 0.1})

    serve_zygote({"ok": ["float32", "int64"], "segv": ["float32", "int64"], "abort": ["float32"],
                  "hang": ["float32", "int64"], "bad": ["float32"]}, run_task)
''')


@pytest.fixture
def fake_pool(tmp_path):
    script = tmp_path / "fake_zygote.py"
    script.write_text(_FAKE_ZYGOTE)
    with Pool(2, None, pair_timeout=3.0, startup_timeout=30.0, zygote_argv=[sys.executable, str(script)]) as pool:
        yield pool


def test_pool_records_crashes_and_hangs_and_carries_on(fake_pool):
    catalog = fake_pool.load_catalog()
    records = list(fake_pool.run(select_tasks(catalog)))
    by = {(r["op"], r["dtype"]): r for r in records}
    assert len(records) == 8 and len(by) == 8
    assert by["segv", "float32"]["status"] == "crash"
    assert f"({signal.Signals.SIGSEGV.name}) at sample 1 (backward)" in by["segv", "float32"]["message"]
    assert by["segv", "int64"]["status"] == "agree"  # the op's remaining dtypes ran in a new worker
    assert by["abort", "float32"]["status"] == "crash" and "SIGABRT" in by["abort", "float32"]["message"]
    assert by["hang", "float32"]["status"] == "timeout" and by["hang", "int64"]["status"] == "agree"
    assert by["bad", "float32"]["status"] == "mismatch"
    assert by["ok", "float32"]["status"] == by["ok", "int64"]["status"] == "agree"
    assert fake_pool.restarts == 3


def _entries(tmp_path, text):
    path = tmp_path / "expected.txt"
    path.write_text(text)
    return expected.load(str(path))


def test_check_fails_on_unlisted_and_stale_and_wrong_status(tmp_path):
    recs = [{"op": "a", "dtype": "float32", "status": "crash", "message": "worker died (SIGSEGV)"},
            {"op": "b", "dtype": "float32", "status": "agree", "message": ""},
            {"op": "c", "dtype": "int64", "status": "error", "message": "npu raised"},
            {"op": "d", "dtype": "float32", "status": "mismatch", "message": "differs"}]
    entries = _entries(tmp_path, "b * mismatch random: draws from the generator\n"
                                 "c int64 mismatch bug: something being fixed\n"
                                 "d float32,int64 mismatch random: draws\n"
                                 "gone * crash bug: an op that left op_db\n")
    problems = expected.check(recs, entries, {"a", "b", "c", "d"}, catalog={"a", "b", "c", "d"})
    text = "\n".join(problems)
    assert "crash: a float32" in text  # off the list
    assert "stale expected failure: b float32 now agrees" in text and "random: draws from" in text
    assert "c int64: expected mismatch (bug: something being fixed), got error" in text
    assert "stale expected failure: d int64 was not run" in text
    assert "gone is not in op_db" in text
    assert len(problems) == 5  # d float32 is expected: no problem


def test_expected_list_rejects_entries_without_reason(tmp_path):
    with pytest.raises(ValueError, match="reason"):
        _entries(tmp_path, "a * mismatch\n")
    with pytest.raises(ValueError, match="reason"):
        _entries(tmp_path, "a * mismatch because\n")
    with pytest.raises(ValueError, match="overlap"):
        _entries(tmp_path, "a float32 mismatch bug: x is wrong\na * crash bug: y crashes\n")


def test_runner_rejects_unknown_ops():
    with pytest.raises(ValueError, match="unknown op"):
        select_tasks({"conj": ["complex64"]}, ops=["conjj"])
    assert [t.op for t in select_tasks({"linalg.pinv": ["float32"], "linalg.pinv.hermitian": ["float32"],
                                        "linalg.pinv_x": ["float32"]}, ops=["linalg.pinv"])] == \
        ["linalg.pinv", "linalg.pinv.hermitian"]


def test_report_counts(tmp_path):
    from .opinfo.report import count
    recs = [{"op": "a", "dtype": "float32", "status": "agree",
             "forward": {"samples": 3, "agree": 3, "bitwise": 2, "status": "agree", "message": ""},
             "backward": {"samples": 3, "agree": 3, "bitwise": 3, "status": "agree", "message": ""}},
            {"op": "b", "dtype": "float32", "status": "mismatch",
             "forward": {"samples": 2, "agree": 1, "bitwise": 1, "status": "mismatch", "message": "x"},
             "backward": None, "message": "x"},
            {"op": "b", "dtype": "int64", "status": "nosamples", "message": "none"}]
    c = count(recs, _entries(tmp_path, "b float32 mismatch random: draws from the generator\n"))
    assert (c["ops"], c["pairs"], c["nosamples_pairs"]) == (2, 2, 1)
    assert c["outcomes"] == {"agree": 1, "expected-fail": 1}
    assert (c["ops_agree_every_dtype"], c["ops_agree_or_expected"]) == (1, 2)
    assert c["bitwise_share"] == pytest.approx(6 / 7)
    assert (c["backward_pairs_where_forward_agrees"], c["backward_agrees_there"]) == (1, 1)

