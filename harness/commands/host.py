"""`harness host`, which an engine starts on every host of a cell: its options; the work is harness.engines.host's."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", type=int, metavar="I", help="this host's index (default $SLURM_NODEID)")
    parser.add_argument("--count", type=int, metavar="H", help="hosts of the cell (default $SLURM_NNODES)")
    parser.add_argument("--host0", metavar="NAME", help="host 0's name (default: the first of the Slurm job's nodes)")
    parser.add_argument("--hub-port", type=int, required=True, metavar="PORT", help="host 0's hub listens here")
    parser.add_argument("--credentials", metavar="FILE",
                        help="the cell's TLS key and certificate (PEM), written by the engine for this cell alone")
    parser.add_argument("--ranks-per-host", type=int, required=True, metavar="G")
    parser.add_argument("--cpu-ranks", action="store_true", help="CPU ranks (gloo): host 0 sets HARNESS_CPU_RANKS")
    parser.add_argument("--cause-file", metavar="FILE", help="host 0 writes the first lost host here")
    parser.add_argument("--pytest-log", metavar="FILE", help="host 0 copies pytest's output here")
    parser.add_argument("--cwd", metavar="DIR", help="host 0 runs pytest here")
    parser.add_argument("--memory-file", metavar="FILE",
                        help="sample this host's GPUs (NVML) into this memory.json ({index}: the host's index)")
    parser.add_argument("host_command", nargs=argparse.REMAINDER, metavar="-- PYTEST_COMMAND")


def command(args: argparse.Namespace) -> int:
    from harness.engines import host

    return host.command(args)
