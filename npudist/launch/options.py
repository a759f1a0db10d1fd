"""npurun's command line: torchrun's own parser plus the options NPU jobs need.

Every torchrun option keeps its name, spelling variants, ``PET_*`` environment defaults and meaning,
because the parser *is* torchrun's (``torch.distributed.run.get_args_parser``); npurun only adds options.
"""
from __future__ import annotations

import argparse
import os

from torch.distributed.run import get_args_parser

from .worker import DEVICE_KINDS

# Options that become environment variables of every worker (torch_npu's names; the hccl backend
# reads them). Values are validated here so a typo fails before any process starts.
HCCL_ENV_OPTIONS = {
    "hccl_timeout": "HCCL_EXEC_TIMEOUT",
    "hccl_connect_timeout": "HCCL_CONNECT_TIMEOUT",
    "hccl_buffsize": "HCCL_BUFFSIZE",
}
NODE_ID_ENV = "NPUDIST_NODE_ID"


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return n


def _rank_list(value: str) -> set[int]:
    try:
        ranks = {int(v) for v in value.split(",") if v.strip() != ""}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of ranks such as 0,2, got {value!r}") from None
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of ranks >= 0 such as 0,2, got {value!r}")
    return ranks


# torchrun's help for these speaks of GPUs and CUDA; npurun's own words (what the options do here).
_HELP = {
    "training_script": "Path of the training program to launch once per rank (each rank bound to its own npu "
                       "device), followed by the program's own arguments.",
    "nproc_per_node": "Number of workers (ranks) per node: an integer, 'auto' or 'npu' (= the visible npu "
                      "devices; with --device cpu 'auto' = the CPU cores), or 'cpu' (= the CPU cores).",
    "numa_binding": "Not supported by npurun (torch finds a worker's NUMA node from its CUDA device); "
                    "refused before anything starts.",
    "virtual_local_rank": "torchrun's virtual local rank (LOCAL_RANK 0 for every worker); only with "
                          "--device cpu, since npurun binds each worker to npu:LOCAL_RANK.",
}


def build_parser() -> argparse.ArgumentParser:
    """torchrun's parser with npurun's additions (`--nproc`, device binding, HCCL env, output)."""
    parser = get_args_parser()
    parser.prog = "npurun"
    parser.description = (
        "Launch a distributed PyTorch job on npu devices: torchrun (torch.distributed.run) with each "
        "worker bound to npu:LOCAL_RANK, hccl settings, rank-prefixed output and run summaries.")
    # A same-dest option: `--nproc 4` == `--nproc-per-node 4`. SUPPRESS keeps torchrun's default.
    parser.add_argument(
        "--nproc", dest="nproc_per_node", default=argparse.SUPPRESS, metavar="N|auto",
        help="Short for --nproc-per-node. 'auto' (or 'npu') = the number of visible npu devices.")
    # None = "not given": npurun then tees every rank's output with a rank prefix (see --tee).
    parser.set_defaults(tee=os.environ.get("PET_TEE"), redirects=os.environ.get("PET_REDIRECTS"))
    for action in parser._actions:  # argparse has no public way to amend an existing option's help
        if action.dest in _HELP:
            action.help = _HELP[action.dest]
        elif action.dest == "tee":
            action.help += (" npurun: if neither --tee nor --redirects is given, every rank is teed (3) "
                            "with a rank prefix; --tee 0 lets workers write straight to the console.")

    npu = parser.add_argument_group("npu options (npurun)")
    npu.add_argument(
        "--device", choices=DEVICE_KINDS, default="npu",
        help="npu (default): bind each worker to npu:LOCAL_RANK before the script runs and refuse to "
        "start more ranks per node than visible npu devices (ASCEND_RT_VISIBLE_DEVICES). "
        "cpu: no binding and no device check (e.g. gloo jobs).")
    npu.add_argument(
        "--node-id", "--node_id", default=None,
        help=f"Identity of this node for the hccl backend (sets {NODE_ID_ENV}; default: that variable "
        "if set, else the host name). Give two agents on one machine different ids to simulate two "
        "nodes: collectives between them then take the inter-node path.")
    npu.add_argument(
        "--hccl-timeout", "--hccl_timeout", type=_positive_int, default=None, metavar="SECONDS",
        help="Timeout of hccl collectives in seconds (sets HCCL_EXEC_TIMEOUT for every worker).")
    npu.add_argument(
        "--hccl-connect-timeout", "--hccl_connect_timeout", type=_positive_int, default=None,
        metavar="SECONDS",
        help="Timeout for hccl communicators to connect, in seconds (sets HCCL_CONNECT_TIMEOUT).")
    npu.add_argument(
        "--hccl-buffsize", "--hccl_buffsize", type=_positive_int, default=None, metavar="MB",
        help="hccl communicator buffer in MB; each group holds 2 x it of device memory (sets HCCL_BUFFSIZE; "
             "default 200).")

    npu.add_argument(
        "--no-plan-check", "--no_plan_check", action="store_true",
        help="Do not validate an npudist plan before starting the ranks. By default, when the program's "
        "arguments hold --config PLAN.yaml and the file is an npudist plan, npurun validates it (with the "
        "program's --section.key overrides) for the job's world size and, if it is invalid, prints its "
        "errors once and exits 2 without starting any rank.")

    out = parser.add_argument_group("output options (npurun)")
    out.add_argument(
        "--ranks-filter", "--ranks_filter", type=_rank_list, default=None, metavar="R1,R2,...",
        help="Show console output only of these GLOBAL ranks (all output is still written to the log "
        "files). --local-ranks-filter filters by local rank, as in torchrun.")
    out.add_argument(
        "--rank0-only", "--rank0_only", action="store_true",
        help="Show console output of global rank 0 only (same as --ranks-filter 0).")
    out.add_argument(
        "--log-prefix", "--log_prefix", default=None, metavar="TEMPLATE",
        help="Prefix of each line of worker output; ${rank}, ${local_rank} and ${role_name} are "
        "substituted (default: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE if set, else '[rank${rank}]: ').")
    out.add_argument(
        "--quiet", action="store_true",
        help="Do not print npurun's start and exit summary lines.")
    out.add_argument(
        "--verbose", action="store_true",
        help="Print the traceback of npurun's own failures (rendezvous, store) too; a worker's full traceback "
        "is always in its log file.")
    return parser


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rank0_only:
        if args.ranks_filter is not None and args.ranks_filter != {0}:
            parser.error("--rank0-only contradicts --ranks-filter; use one of them")
        args.ranks_filter = {0}
    return parser, args
