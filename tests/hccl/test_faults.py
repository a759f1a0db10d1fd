"""hccl under faults: timeouts, killed ranks, teardown/blocking wait, abort/shutdown, mismatches,
flight recorder + analyzer, bad input. Each run is bounded well under a minute."""
import os
import subprocess
import sys

from launcher import REPO, run_ranks


def test_skipped_collective_raises_naming_the_missing_rank():
    run_ranks("skip_collective", 2, timeout=60)


def test_skipped_collective_four_ranks():
    run_ranks("skip_collective", 4, timeout=60)


def test_killed_rank_fails_fast_and_leaves_no_shm():
    results = run_ranks("kill_rank", 2, timeout=60, expect_ok=False)
    assert results[1].returncode == -9, results[1].output[-2000:]
    assert results[0].returncode == 0 and "SCENARIO OK" in results[0].output, results[0].output[-4000:]


def test_default_error_handling_tears_the_process_down():
    results = run_ranks("teardown", 2, timeout=60, expect_ok=False,
                        env={"TORCH_HCCL_ASYNC_ERROR_HANDLING": "1"})
    r0 = results[0]
    assert r0.returncode == 1, r0.output[-3000:]
    assert "tearing down the process" in r0.output and "all_reduce" in r0.output, r0.output[-3000:]
    assert "survived" not in r0.output


def test_blocking_wait_raises_in_wait_and_keeps_the_process():
    run_ranks("blocking_wait", 2, timeout=60,
              env={"TORCH_HCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_HCCL_BLOCKING_WAIT": "1"})


def test_cleanup_only_aborts_and_keeps_the_process():
    run_ranks("cleanup_only", 2, timeout=60, env={"TORCH_HCCL_ASYNC_ERROR_HANDLING": "2"})


def test_connect_timeout_bounds_group_creation():
    run_ranks("connect_timeout", 2, timeout=60, env={"HCCL_CONNECT_TIMEOUT": "2"})


def test_abort_and_shutdown():
    # With the default teardown mode: a deliberate abort() must not kill the process.
    run_ranks("abort_shutdown", 2, timeout=60, env={"TORCH_HCCL_ASYNC_ERROR_HANDLING": "1"})


def test_mismatched_collectives_name_the_ranks():
    results = run_ranks("mismatch", 2, timeout=60)
    assert "differ" in results[0].output or "mismatch" in results[0].output.lower(), results[0].output[-3000:]


def test_flight_recorder_dump_and_analyzer(tmp_path):
    env = {"TORCH_HCCL_DUMP_ON_TIMEOUT": "1", "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "trace_"),
           "TORCH_HCCL_TRACE_BUFFER_SIZE": "64"}
    run_ranks("staged_hang", 2, timeout=60, env=env)
    out = subprocess.run([sys.executable, "-m", "npudist.hccl.trace", str(tmp_path)], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "BEHIND: rank 1 never issued seq 5 (all_reduce" in text, text
    assert "rank 0: last completed seq 4" in text and "rank 1: last completed seq 4" in text, text
    assert "failed on rank 0: all_reduce seq 5" in text, text


def test_flight_recorder_on_demand_ring_buffer(tmp_path):
    run_ranks("trace_on_demand", 2, timeout=60,
              env={"TORCH_HCCL_TRACE_BUFFER_SIZE": "8", "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "trace_")})


def test_analyzer_reports_first_mismatch(tmp_path):
    import json

    def dump(rank, entries):
        g = {"group_name": "0", "group_desc": "default_pg", "rank": rank, "size": 2, "global_ranks": [0, 1],
             "capacity": 8, "last_started_seq": 2, "last_completed_seq": 1, "entries": entries}
        (tmp_path / f"trace_{rank}").write_text(json.dumps(
            {"version": 1, "global_rank": rank, "pid": 1, "reason": "test", "time_us": 0, "groups": [g]}))

    def entry(seq, op, shapes):
        return {"id": seq, "seq": seq, "p2p": False, "peer": -1, "op": op, "dtype": "Float", "reduce_op": "SUM",
                "shapes": shapes, "root": -1, "state": "completed", "t_issued_us": 0, "t_started_us": 0,
                "t_done_us": 0, "error": ""}

    dump(0, [entry(1, "all_reduce", "in=[[4]]"), entry(2, "all_reduce", "in=[[4]]")])
    dump(1, [entry(1, "all_reduce", "in=[[4]]"), entry(2, "all_reduce", "in=[[5]]")])
    sys.path.insert(0, REPO)
    from npudist.hccl.trace import analyze

    text = analyze([str(tmp_path)])
    assert "MISMATCH at seq 2" in text and "in=[[5]]" in text, text
    assert "no rank is behind" in text, text


def test_bad_input_errors():
    run_ranks("bad_input", 2, timeout=60)
