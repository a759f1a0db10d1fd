"""Launch options that torchrun accepts but that cannot work, refused before anything starts (exit code 2).

torchrun takes them as they come: a node rank beyond the node count waits forever for a rendezvous store
nobody hosts, a port out of range or a log directory that is a file surfaces as a traceback from deep inside
the agent, and a rank filter naming ranks the job does not have shows nothing and exits 0.
"""
from __future__ import annotations

import argparse
import os

from torch.distributed.run import parse_min_max_nnodes

from .devices import LaunchError

MAX_PORT = 65535


def check_node_rank(args: argparse.Namespace) -> None:
    _, max_nodes = parse_min_max_nnodes(args.nnodes)
    if not 0 <= args.node_rank < max_nodes:
        raise LaunchError(
            f"--node-rank {args.node_rank} is not a node of this job: --nnodes {args.nnodes} has node ranks "
            f"0..{max_nodes - 1}; give each node's npurun a distinct --node-rank in that range")


def _check_port(port: int | str, option: str) -> None:
    if not (str(port).isdigit() and 1 <= int(port) <= MAX_PORT):
        raise LaunchError(f"{option}: port {port} is out of range; use a TCP port in 1..{MAX_PORT}")


def check_ports(args: argparse.Namespace) -> None:
    if args.master_port is not None:
        _check_port(args.master_port, f"--master-port {args.master_port}")
    endpoint = args.rdzv_endpoint or ""
    host, sep, port = endpoint.rpartition(":")
    if sep and not host.endswith(":") and port:   # "host:port" or "[::1]:port", not a bare IPv6 address
        _check_port(port, f"--rdzv-endpoint {endpoint}")


def check_log_dir(path: str | None) -> None:
    """A directory npurun can write (created if missing), checked before workers would fail on it."""
    if path is None:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise LaunchError(f"--log-dir {path} is a file; give a directory (it is created if missing)")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise LaunchError(f"--log-dir {path}: cannot create it ({e.strerror or e}); give a writable "
                          "directory") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise LaunchError(f"--log-dir {path} is not writable; give a writable directory")


def parse_local_ranks(value: str) -> set[int] | None:
    """torchrun's --local-ranks-filter: comma-separated local ranks ('' = no filter)."""
    if not value:
        return None
    try:
        return {int(r) for r in value.split(",")}
    except ValueError:
        raise LaunchError("--local-ranks-filter must be a comma-separated list of integers, e.g. 0,1") from None


def check_rank_filters(args: argparse.Namespace, nproc: int) -> None:
    """Console filters must name ranks the job can have: a filter of absent ranks would show nothing."""
    _, max_nodes = parse_min_max_nnodes(args.nnodes)
    world = nproc * max_nodes
    if args.ranks_filter:
        absent = sorted(r for r in args.ranks_filter if r >= world)
        if absent:
            raise LaunchError(
                f"--ranks-filter names rank(s) {','.join(map(str, absent))} but this job has ranks 0..{world - 1} "
                f"({nproc} per node x {max_nodes} node(s)); its console would show nothing")
    local = parse_local_ranks(args.local_ranks_filter)
    if local:
        absent = sorted(r for r in local if not 0 <= r < nproc)
        if absent:
            raise LaunchError(
                f"--local-ranks-filter names local rank(s) {','.join(map(str, absent))} but each node runs local "
                f"ranks 0..{nproc - 1}")
