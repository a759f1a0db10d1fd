"""The forms whose reference is the same npu call made synchronously (``forms.SYNC_CALLS``: inference, autocast).

The reference call runs at torch_npu's task-queue level 0 (``torch.npu.set_task_queue_enable(0)``: every kernel
on the calling thread, as under blocking launch); then the call runs ``calls`` times in the worker's launch mode,
each on fresh arguments (under asynchronous launch the first call of an argument signature runs synchronously,
later ones are queued; under blocking launch every call runs as the reference did, so one call is made), and each
is compared with the reference: an exception of the same type where the reference
raised, else no exception, results equal bit for bit (NaNs in the same places count as equal) on the same device,
the same warnings, and a draw from the random generators exactly where the reference drew. Both calls start from
the same seeded generators (``observe``), so the values of a call that draws are compared too: they must not
depend on how its kernels were launched. Under blocking launch both runs are synchronous, which still checks that
the form runs and is deterministic.
"""
import torch

from .compare import ERROR, MISMATCH, WARNING, Mismatch, compare_results
from .observe import compare_warnings, observe

_NAMES = ("the synchronous run", "this run")


def run_against_sync(tally, i, form, progress, make_call, post, calls):
    """One sample of ``form``: the synchronous reference, then ``calls`` compared calls, added to ``tally``.
    ``make_call()`` builds a call on fresh npu arguments; ``post`` maps a result before comparison."""
    if torch.npu.launch.is_blocking():
        calls = 1  # a second synchronous call would take the reference's path again: it adds CI time, not a check
    progress(i, form, 0)
    level = torch.npu.get_task_queue_enable()
    torch.npu.set_task_queue_enable(0)  # drains every device first: nothing queued earlier runs inside the reference
    try:
        ref_call = make_call()
        ref = observe(lambda: post(ref_call()), on_npu=True)
    finally:
        torch.npu.set_task_queue_enable(level)
    for k in range(1, calls + 1):
        progress(i, form, k)
        call = make_call()
        got = observe(lambda: post(call()), on_npu=True)
        tally.add(i, *compare_with_sync(ref, got, f"{form} call {k} vs the synchronous run"))


def _short(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


def compare_with_sync(ref, got, where):
    """(failures, bitwise, drew) of an observed call against the synchronous reference call, as
    ``execute.compare_calls`` returns them; agreeing means bitwise equal."""
    drew = ref.drew
    if ref.exc is None and got.exc is not None:
        return [(ERROR, f"{where}: raised {_short(got.exc)} where the synchronous run returned a result")], False, drew
    if ref.exc is not None and got.exc is None:
        return [(ERROR, f"{where}: the synchronous run raised {_short(ref.exc)} but this run returned a "
                        f"result")], False, drew
    if ref.exc is not None and type(got.exc) is not type(ref.exc):
        return [(ERROR, f"{where}: the synchronous run raised {_short(ref.exc)}, this run raised "
                        f"{_short(got.exc)}")], False, drew
    failures = []
    warned = compare_warnings(ref, got, _NAMES)
    if warned:
        failures.append((WARNING, f"{where}: {warned}"))
    if ref.drew != got.drew:
        failures.append((MISMATCH, f"{where}: the synchronous run drew {'' if ref.drew else 'no '}random numbers, "
                                   f"this run drew {'' if got.drew else 'no '}random numbers"))
    elif ref.exc is None:
        try:
            if not compare_results(ref.out, got.out, where):
                failures.append((MISMATCH, f"{where}: values are close but not bitwise equal"))
        except Mismatch as m:
            failures.append((ERROR if m.kind == "device" else MISMATCH, str(m)))
    return failures, not failures, drew
