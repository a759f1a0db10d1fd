"""hccl under faults: timeouts, killed ranks, teardown/blocking wait, abort/shutdown, mismatches,
flight recorder (its analyzers: test_flight_recorder_format.py), bad input. Each run is bounded well under a minute."""
from launcher import run_ranks


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


def test_flight_recorder_on_demand_ring_buffer(tmp_path):
    run_ranks("trace_on_demand", 2, timeout=60,
              env={"TORCH_HCCL_TRACE_BUFFER_SIZE": "8", "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "trace_")})


def test_bad_input_errors():
    run_ranks("bad_input", 2, timeout=60)
