"""`npurun`: torchrun (torch.distributed.run) for npu jobs.

The job is run by torchrun's own machinery -- its argument parser, ``config_from_args``,
``elastic_launch`` (LocalElasticAgent, rendezvous, restarts) -- with four additions:

* workers start through ``npudist.launch.worker``, which binds npu:LOCAL_RANK before the user's script runs;
* ``--nproc N|auto`` and a device-count check before anything starts;
* hccl settings and the simulated node identity (NPUDIST_NODE_ID) become worker environment variables;
* worker output is teed with a rank prefix (optionally one rank only), and npurun prints a summary line
  at every (re)start and at exit, naming failed ranks with exit code/signal and their error's last lines.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import uuid
from collections.abc import Callable

from torch.distributed import DistStoreError
from torch.distributed.elastic.multiprocessing import Std
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousError
from torch.distributed.launcher.api import elastic_launch
from torch.distributed.run import config_from_args, parse_min_max_nnodes

from . import worker
from .checks import check_log_dir, check_node_rank, check_ports, check_rank_filters, parse_local_ranks
from .devices import LaunchError, resolve_nproc
from .logs import NpurunLogsSpecs
from .options import HCCL_ENV_OPTIONS, NODE_ID_ENV, parse_args
from .plan_check import check_plan_args, format_plan_error
from .summary import JobFacts, Reporter

DEFAULT_PREFIX = "[rank${rank}]: "


def resolve_rendezvous(args: argparse.Namespace) -> bool:
    """torchrun's rule: --standalone, or one node without rendezvous options -> c10d on a free port.

    Returns True when the rendezvous is a private standalone one.
    """
    standalone = bool(args.standalone)
    if not standalone and args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None:
        _, max_nodes = parse_min_max_nnodes(args.nnodes)
        standalone = max_nodes == 1
    if standalone:
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500
    return standalone


def apply_worker_env(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """Export hccl options and the node identity; workers inherit the agent's environment."""
    applied = {}
    for opt, var in HCCL_ENV_OPTIONS.items():
        value = getattr(args, opt)
        if value is not None:
            os.environ[var] = str(value)
        if var in os.environ:
            applied[var] = os.environ[var]
    if args.node_id is not None:
        if not args.node_id.strip():
            raise LaunchError("--node-id must not be empty")
        os.environ[NODE_ID_ENV] = args.node_id
    node_id = os.environ.get(NODE_ID_ENV) or socket.gethostname()
    return node_id, applied


def build_entrypoint(args: argparse.Namespace) -> tuple[Callable | str, list[str]]:
    """The command each worker runs: the bootstrap in front of the user's script/module."""
    if args.run_path:
        return worker.run_bound_script_path, [args.device, args.training_script, *args.training_script_args]
    if args.no_python:
        if args.module:
            raise LaunchError("Don't use both the '--no-python' flag and the '--module' flag at the same time.")
        # Not a Python program: nothing can run inside it before its own code, so no binding here.
        return args.training_script, list(args.training_script_args)
    python = os.getenv("PYTHON_EXEC", sys.executable)
    cmd = ["-u", "-m", "npudist.launch.worker", "--device", args.device]
    if args.module:
        cmd.append("-m")
    return python, cmd + [args.training_script, *args.training_script_args]


def make_logs_specs(args: argparse.Namespace, reporter: Reporter) -> NpurunLogsSpecs:
    """torchrun's log files and tee, plus the global-rank filter and the start hook."""
    # Default: tee both streams of every rank (files + prefixed console). An explicit --tee/--redirects
    # gives torchrun's exact behaviour (e.g. --tee 0 = workers write straight to the console).
    if args.tee is None and args.redirects is None:
        args.tee, args.redirects = "3", "0"
    args.tee = "0" if args.tee is None else args.tee
    args.redirects = "0" if args.redirects is None else args.redirects
    return NpurunLogsSpecs(log_dir=args.log_dir, redirects=Std.from_str(args.redirects),
                           tee=Std.from_str(args.tee), local_ranks_filter=parse_local_ranks(args.local_ranks_filter),
                           global_ranks_filter=args.ranks_filter, on_start=reporter.on_start)


def validate(args: argparse.Namespace) -> None:
    if args.logs_specs is not None:
        raise LaunchError("--logs-specs is not supported by npurun: its rank prefixes and summaries need "
                          "npurun's own LogsSpecs (use torchrun for a custom one)")
    if getattr(args, "numa_binding", None):
        raise LaunchError("--numa-binding is not supported by npurun: torch's NUMA binding locates each worker's "
                          "CUDA device (torch.cuda); bind workers with numactl or taskset instead")
    if args.virtual_local_rank and args.device == "npu":
        raise LaunchError("--virtual-local-rank is not supported with --device npu: every worker sees all "
                          "visible npu devices and is bound to npu:LOCAL_RANK")
    if not args.module and not args.no_python and not os.path.isfile(args.training_script):
        raise LaunchError(f"training script not found: {args.training_script!r} (relative to {os.getcwd()}); "
                          "use -m for a module")
    if args.run_path and not os.path.isabs(args.training_script):
        args.training_script = os.path.abspath(args.training_script)
    check_node_rank(args)
    check_ports(args)
    check_log_dir(args.log_dir)


def planned_world_size(args: argparse.Namespace, nproc: int) -> int | None:
    """nproc x nodes when the node count is fixed; None for an elastic range (known only at rendezvous)."""
    min_nodes, max_nodes = parse_min_max_nnodes(args.nnodes)
    return nproc * min_nodes if min_nodes == max_nodes else None


def run(argv: list[str] | None = None) -> int:
    """Launch the job; return the launcher's exit code (0 ok, 1 a worker or the rendezvous failed, 2 bad usage
    or an invalid npudist plan, found before any worker starts)."""
    parser, args = parse_args(argv)
    own_log_dir = args.log_dir is None
    reporter = Reporter(quiet=args.quiet)
    try:
        validate(args)
        nproc, visible = resolve_nproc(args.nproc_per_node, args.device)
        args.nproc_per_node = str(nproc)
        check_rank_filters(args, nproc)
        node_id, worker_env = apply_worker_env(args)
        if nproc > 1 and "OMP_NUM_THREADS" not in os.environ:
            # torchrun's default (one OpenMP thread per worker), without its multi-line banner.
            os.environ["OMP_NUM_THREADS"] = "1"
            worker_env["OMP_NUM_THREADS"] = "1"
        standalone = resolve_rendezvous(args)
        if "NPUDIST_JOB_ID" not in os.environ and args.rdzv_id != "none":
            # hccl prefixes its /dev/shm segment names with this, so a job's segments are recognisable.
            os.environ["NPUDIST_JOB_ID"] = args.rdzv_id
        entrypoint, cmd_args = build_entrypoint(args)
        logs_specs = make_logs_specs(args, reporter)
        args.log_dir = logs_specs.root_log_dir  # so torchrun's own LogsSpecs does not mkdtemp another dir
        config, _, _ = config_from_args(args)
    except (LaunchError, ValueError, RuntimeError, AssertionError) as e:
        parser.error(str(e))  # exits 2
    if not args.no_plan_check and not args.no_python:
        world = planned_world_size(args, nproc)
        warnings: list[str] = []
        plan_error = check_plan_args(list(args.training_script_args), world, warnings)
        if plan_error is not None:
            print(f"npurun: {format_plan_error(plan_error, world)}", file=sys.stderr, flush=True)
            return 2
        for line in warnings:
            print(f"npurun: {line}", file=sys.stderr, flush=True)
    config.logs_specs = logs_specs
    config.log_line_prefix_template = (
        args.log_prefix or os.getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") or DEFAULT_PREFIX)
    if standalone:
        rdzv = f"{config.rdzv_backend} (standalone)"
    elif config.rdzv_backend == "static":
        rdzv = f"static {config.rdzv_endpoint}"
    else:
        rdzv = f"{config.rdzv_backend} {config.rdzv_endpoint} id {config.run_id}"
    reporter.facts = JobFacts(device=args.device, visible=visible, node_id=node_id, rdzv=rdzv,
                              max_restarts=config.max_restarts, worker_env=worker_env,
                              binds=not args.no_python)
    import torch.multiprocessing

    torch.multiprocessing._set_thread_name("pt_elastic")
    try:
        elastic_launch(config=config, entrypoint=entrypoint)(*cmd_args)
    except ChildFailedError as e:
        reporter.on_failure(e)
        return 1
    except (RendezvousError, DistStoreError, OSError) as e:
        # The workers never started or their group fell apart outside them: the store or the rendezvous.
        reporter.on_launch_error(e, verbose=args.verbose)
        return 1
    except SignalException as e:
        reporter.on_signal(e.sigval.name)
        return 128 + int(e.sigval)
    reporter.on_success()
    if own_log_dir:
        # Nothing failed and the user asked for no log directory: do not leave temp dirs behind.
        shutil.rmtree(logs_specs.root_log_dir, ignore_errors=True)
    return 0
