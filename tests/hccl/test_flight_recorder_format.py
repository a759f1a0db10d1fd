"""hccl's flight-recorder dumps are in PyTorch's format: PyTorch's analyzer
(`python -m torch.distributed.flight_recorder.fr_trace`) and npudist's (`python -m npudist.hccl.trace`) read
the dumps of a hang and of a mismatch, and name the same rank and the same collective."""
import os
import pickle
import re
import subprocess
import sys

import pytest

from launcher import REPO, run_ranks

pytestmark = pytest.mark.timeout(240)


def _dump_env(tmp_path) -> dict:
    return {"TORCH_HCCL_DUMP_ON_TIMEOUT": "1", "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "trace_"),
            "TORCH_HCCL_TRACE_BUFFER_SIZE": "64"}


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert out.returncode == 0, f"{module} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def fr_trace(dump_dir, *options: str) -> str:
    """PyTorch's analyzer; it logs its findings to stderr."""
    out = _run("torch.distributed.flight_recorder.fr_trace", str(dump_dir), *options)
    return out.stdout + out.stderr


def npudist_trace(dump_dir) -> str:
    return _run("npudist.hccl.trace", str(dump_dir)).stdout


def _field(text: str, name: str) -> str:
    m = re.search(rf"^{name}: (.*)$", text, re.M)
    assert m, f"fr_trace printed no '{name}':\n{text}"
    return m.group(1)


def test_hang_both_analyzers_name_the_missing_rank(tmp_path):
    """Rank 1 skips the 5th collective (an all_reduce); rank 0 times out and both ranks dump."""
    run_ranks("staged_hang", 2, timeout=60, env=_dump_env(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["trace_0", "trace_1"], os.listdir(tmp_path)

    ours = npudist_trace(tmp_path)
    assert "BEHIND: rank 1 never issued seq 5 (all_reduce in=[[8]] out=[[8]])" in ours, ours
    assert "rank 0: last completed seq 4" in ours and "rank 1: last completed seq 4" in ours, ours
    assert "failed on rank 0: all_reduce seq 5" in ours and "timed out" in ours, ours
    assert "no mismatched collective" in ours, ours

    theirs = fr_trace(tmp_path)
    assert "Not all ranks joining collective, sequence number: 5" in theirs, theirs
    assert _field(theirs, "collective") == "hccl:all_reduce", theirs
    assert _field(theirs, "missing ranks") == "{1}", theirs
    assert _field(theirs, "input sizes") == "[[8]]", theirs
    assert "has errors" not in theirs, theirs  # seq 1..4 matched on both ranks


@pytest.mark.parametrize("kind, culprit_error", [
    ("size", "Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input sizes: '[[8]]' does not match found input "
             "sizes: '[[9]]'"),
    ("op", "Error type: COLLECTIVE_TYPE_MISMATCH, Expected collective type: 'all_reduce' does not match found "
           "collective type: 'broadcast'"),
])
def test_mismatch_both_analyzers_name_the_rank_and_collective(tmp_path, kind, culprit_error):
    """Ranks agree on three collectives; on the 4th, rank 1 passes 9 elements instead of 8 (size) or calls
    broadcast instead of all_reduce (op)."""
    run_ranks("staged_mismatch", 2, timeout=60, env=_dump_env(tmp_path), args=(kind,))

    ours = npudist_trace(tmp_path)
    assert "MISMATCH at seq 4:" in ours, ours
    rank1 = "rank 1: all_reduce" if kind == "size" else "rank 1: broadcast"
    assert "rank 0: all_reduce" in ours and rank1 in ours, ours
    if kind == "size":
        assert "in=[[9]] out=[[9]]" in ours, ours
    assert "no rank is behind (all issued up to seq 4)" in ours, ours

    theirs = fr_trace(tmp_path)
    assert "Collective sequence number: 4 has errors" in theirs, theirs
    assert _field(theirs, "collective") == "hccl:all_reduce", theirs
    assert _field(theirs, "error msg") == f"Culprit rank 1; {culprit_error}", theirs
    assert theirs.count("has errors") == 1, theirs  # seq 1..3 matched


def test_dump_has_pytorchs_keys_and_names(tmp_path):
    """Every op kind, two groups, p2p: fr_trace matches all of it and finds nothing wrong."""
    run_ranks("fr_dump_formats", 2, timeout=60, env={"TORCH_HCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "trace_")})
    theirs = fr_trace(tmp_path, "--verbose")  # also prints the collectives it matched
    for problem in ("has errors", "Not all ranks joining", "Error type", "cannot decide", "pass_check=False"):
        assert problem not in theirs, theirs
    # 4 + 8 collectives of the world group, the send/recv pair, the other group's all_reduce
    assert theirs.count("pass_check=True") == 14, theirs
    assert "no mismatched collective" in npudist_trace(tmp_path)


def _entry(seq, name, sizes, state="completed", **extra):
    return {"record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": name, "time_created_ns": seq, "input_sizes": sizes,
            "input_dtypes": ["Float"], "output_sizes": sizes, "output_dtypes": ["Float"], "state": state,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": True,
            "timeout_ms": 1000, "is_p2p": False, **extra}


def _write_dump(path, entries, **top):
    doc = {"version": "2.10", "comm_lib_version": "test", "entries": entries,
           "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
           "pg_status": {"0": {"last_enqueued_collective": len(entries), "last_started_collective": len(entries),
                               "last_completed_collective": 1}}, **top}
    path.write_bytes(pickle.dumps(doc))


def test_npudist_analyzer_reads_a_dump_without_hccl_keys(tmp_path):
    """A dump of another backend (no hccl_* keys; the rank from the file name) is read the same way."""
    _write_dump(tmp_path / "nccl_trace_0", [_entry(1, "nccl:all_reduce", [[4]]), _entry(2, "nccl:all_reduce", [[4]])])
    _write_dump(tmp_path / "nccl_trace_1", [_entry(1, "nccl:all_reduce", [[4]]), _entry(2, "nccl:all_reduce", [[5]])])
    sys.path.insert(0, REPO)
    from npudist.hccl.trace import analyze

    text = analyze([str(tmp_path)])
    assert "2 dump(s): global ranks [0, 1]" in text, text
    assert "MISMATCH at seq 2" in text and "in=[[5]]" in text, text
    assert "no rank is behind" in text and "rank 1: last completed seq 1" in text, text


def test_npudist_analyzer_refuses_code_in_a_dump(tmp_path):
    """Reading a directory never runs code from a file in it: a pickle naming a global is not a dump."""
    (tmp_path / "trace_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [], "pg_config": {},
                                                     "hccl_rank": os.getpid}))
    sys.path.insert(0, REPO)
    from npudist.hccl.trace import analyze

    with pytest.raises(ValueError, match="no flight-recorder dumps"):
        analyze([str(tmp_path)])
