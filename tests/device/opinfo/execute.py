"""Run one OpInfo op in one dtype on cpu and on npu (inside a worker process) and compare.

Samples are made on cpu (seeded), copied to npu before the CPU call (some ops mutate their input),
then the op runs on both devices; where the op supports autograd in that dtype, gradients of the
outputs with the same random grad_outputs are compared too. If CPU raises, npu must raise an
exception of the same type.
"""
import itertools
import time

import torch

from .compare import Mismatch, compare_results

SEED = 1234

# Sample outcome codes, ordered from best to worst; a phase reports its worst sample.
AGREE, MISMATCH, ERROR = "agree", "mismatch", "error"
_RANK = {AGREE: 0, MISMATCH: 1, ERROR: 2}


def op_id(op) -> str:
    """``name`` or ``name.variant`` (unique in op_db)."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _to_npu(obj):
    """Copy a sample's structure to npu: tensors (keeping requires_grad), and cpu devices, also
    spelled as strings (op_db passes the device under test as 'cpu', e.g. ``to('cpu', ...)``)."""
    if isinstance(obj, torch.Tensor):
        if (obj.requires_grad and obj.grad_fn is None and obj._base is not None and obj._base.requires_grad
                and _copies_storage(obj)):
            return _view_of_grad_base_on_npu(obj)
        with torch.no_grad():
            t = _same_layout_on_npu(obj.detach())
        return t.requires_grad_(obj.requires_grad) if obj.requires_grad else t
    if isinstance(obj, torch.device):
        return torch.device("npu") if obj.type == "cpu" else obj
    if isinstance(obj, str) and obj == "cpu":
        return "npu"
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_to_npu(x) for x in obj)
    if isinstance(obj, list):
        return [_to_npu(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_npu(v) for k, v in obj.items()}
    return obj


def _view_of_grad_base_on_npu(view: torch.Tensor) -> torch.Tensor:
    """A view taken under no_grad of a base that requires grad (istft's sample slices its window that
    way): it reports requires_grad but has no autograd edge, so CPU autograd gives it no gradient. A
    fresh npu leaf would get one; rebuild the same history instead so both devices see the same graph."""
    npu_storage = _storage_on_npu(view).requires_grad_(True)  # a leaf, as the sample's base is
    with torch.no_grad():
        return npu_storage.as_strided(view.size(), view.stride(), view.storage_offset())


def _same_layout_on_npu(t: torch.Tensor) -> torch.Tensor:
    """``t`` on npu with the same storage size, strides and offset: a partial, overlapping or
    expanded view stays one (``.to("npu")`` would compact it and change what the op sees)."""
    if not _copies_storage(t):
        return t.to("npu")
    return _storage_on_npu(t).as_strided(t.size(), t.stride(), t.storage_offset())


def _copies_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` can be rebuilt on npu from a raw copy of its storage (not for lazy conj/neg
    views, whose bit a raw copy would drop, nor for non-strided or quantized layouts)."""
    return not (t.layout != torch.strided or t.is_quantized or t.is_conj() or t.is_neg() or t.dtype.itemsize == 0)


def _storage_on_npu(t: torch.Tensor) -> torch.Tensor:
    """All of ``t``'s storage, as a 1-D npu tensor of its dtype."""
    n = t.untyped_storage().nbytes() // t.element_size()
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
    return whole.detach().to("npu")


def _mentions_npu(obj) -> bool:
    if isinstance(obj, torch.Tensor):
        return obj.device.type == "npu"
    if isinstance(obj, torch.device):
        return obj.type == "npu"
    if isinstance(obj, str):
        return obj == "npu"
    if isinstance(obj, (list, tuple)):
        return any(_mentions_npu(x) for x in obj)
    if isinstance(obj, dict):
        return any(_mentions_npu(x) for x in obj.values())
    return False


def _tensors(obj):
    """Tensors of a nested structure, in a deterministic order."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


def _seed(seed: int) -> None:
    """Seed the CPU generator and npu:0's (the devices samples use). ``torch.manual_seed`` would do
    too, but it also walks the cuda/xpu/mtia lazy-init queues, which was 65% of the suite's time."""
    torch.default_generator.manual_seed(seed)
    torch.npu.manual_seed(seed)


def _call(op, sample):
    _seed(SEED)
    return op(sample.input, *sample.args, **sample.kwargs)


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"


def _compare_calls(run_cpu, run_npu, where):
    """Run both sides; return (code, bitwise, message, cpu_result, npu_result)."""
    try:
        cpu_out = run_cpu()
        cpu_exc = None
    except Exception as e:  # noqa: BLE001 - any CPU exception is the reference behaviour
        cpu_out, cpu_exc = None, e
    try:
        npu_out = run_npu()
        npu_exc = None
    except Exception as e:  # noqa: BLE001
        npu_out, npu_exc = None, e
    if cpu_exc is not None:
        if npu_exc is None:
            return ERROR, False, f"{where}: CPU raised {_short(cpu_exc)} but npu returned a result", None, None
        if not isinstance(npu_exc, type(cpu_exc)):
            return ERROR, False, f"{where}: CPU raised {_short(cpu_exc)}, npu raised {_short(npu_exc)}", None, None
        return AGREE, True, "", None, None  # both raised: the error matches
    if npu_exc is not None:
        return ERROR, False, f"{where}: npu raised {_short(npu_exc)}", None, None
    try:
        bitwise = compare_results(cpu_out, npu_out, where)
    except Mismatch as m:
        return (ERROR if m.kind == "device" else MISMATCH), False, str(m), cpu_out, npu_out
    return AGREE, bitwise, "", cpu_out, npu_out


def _differentiable_outputs(out):
    return [t for t in _tensors(out) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def _backward(op, sample, out, make_grads):
    """Gradients of the sample's differentiable inputs for the given output ``out``."""
    out = sample.output_process_fn_grad(out)
    outs = _differentiable_outputs(out)
    inputs = [t for t in _tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
    if not outs or not inputs:
        return None
    return torch.autograd.grad(outs, inputs, make_grads(outs), allow_unused=True)


class PhaseTally:
    """Counts of one phase (forward or backward) of one op x dtype."""

    def __init__(self):
        self.samples = self.agree = self.bitwise = 0
        self.status = AGREE
        self.message = ""

    def add(self, code, bitwise, message, index):
        self.samples += 1
        if code == AGREE:
            self.agree += 1
            self.bitwise += bool(bitwise)
        if _RANK[code] > _RANK[self.status]:
            self.status, self.message = code, f"sample {index}: {message}"

    def as_dict(self):
        return {"samples": self.samples, "agree": self.agree, "bitwise": self.bitwise,
                "status": self.status, "message": self.message}


def run_op_dtype(op, dtype, max_samples, progress):
    """Compare ``op`` in ``dtype`` over at most ``max_samples`` samples (None = all).

    ``progress(i, phase)`` is called before each call that could crash the process.
    Returns a dict with 'forward' and (if the dtype is differentiable for the op) 'backward' tallies.
    """
    start, cpu_start = time.monotonic(), time.process_time()
    grad = op.supports_autograd and dtype in op.supported_backward_dtypes("cpu")
    _seed(SEED)
    result = {"forward": PhaseTally()}
    if grad:
        result["backward"] = PhaseTally()
    samples = None
    for i in itertools.count() if max_samples is None else range(max_samples):
        try:  # op_db's own sample code failing on CPU is not the device's fault: reported apart
            # sample_inputs_func directly: OpInfo.sample_inputs adds per-sample reseeding and test-name
            # lookups by stack inspection (unittest bookkeeping that cost a third of the run here)
            samples = samples or iter(op.sample_inputs_func(op, "cpu", dtype, grad))
            sample = next(samples)
        except StopIteration:
            break
        except Exception as e:  # noqa: BLE001
            return {"harness_error": _short(e), "seconds": time.monotonic() - start,
                    "cpu_seconds": time.process_time() - cpu_start}
        _run_sample(op, sample, i, result, progress)
        _seed(SEED + i + 1)  # the next sample does not depend on this one's draws
    out = {phase: t.as_dict() for phase, t in result.items()}
    out["seconds"] = time.monotonic() - start
    out["cpu_seconds"] = time.process_time() - cpu_start  # the load-independent cost, for CI budgeting
    return out


def _run_sample(op, sample, i, result, progress):
    npu_input, npu_args, npu_kwargs = _to_npu(sample.input), _to_npu(sample.args), _to_npu(sample.kwargs)
    npu_sample = type(sample)(npu_input, args=npu_args, kwargs=npu_kwargs,
                              output_process_fn_grad=sample.output_process_fn_grad,
                              broadcasts_input=sample.broadcasts_input, name=sample.name)
    if not _mentions_npu((npu_input, npu_args, npu_kwargs)):
        return  # e.g. arange(2): no tensor or device argument, so the op never meets npu
    progress(i, "forward")
    if op.has_nondeterministic_output:
        # Uninitialized memory (empty*): only metadata is meaningful, so compare shapes/dtypes/devices
        # of results whose values are replaced by zeros on both sides.
        def run(s):
            return _zero_values(_call(op, s))
    else:
        def run(s):
            return _call(op, s)
    code, bitwise, msg, cpu_out, npu_out = _compare_calls(lambda: run(sample), lambda: run(npu_sample), "output")
    result["forward"].add(code, bitwise, msg, i)
    if "backward" not in result or code != AGREE or cpu_out is None:
        return
    grads = []

    def make_grads(outs):
        if not grads:  # first call (CPU): draw; second call (npu): reuse the same values
            _seed(SEED)
            grads.extend(torch.randn_like(o.detach()) for o in outs)
            return grads
        return [g.to("npu") for g in grads]

    progress(i, "backward")
    code, bitwise, msg, cpu_g, _ = _compare_calls(lambda: _backward(op, sample, cpu_out, make_grads),
                                                  lambda: _backward(op, npu_sample, npu_out, make_grads),
                                                  "grad")
    if cpu_g is None and code == AGREE and not grads:
        return  # nothing differentiable in this sample
    result["backward"].add(code, bitwise, msg, i)


def _zero_values(out):
    if isinstance(out, torch.Tensor):
        with torch.no_grad():
            return torch.zeros_like(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_zero_values(x) for x in out) if not hasattr(out, "_fields") else out
    return out
