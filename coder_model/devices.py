"""The one `--device` choice of every command (no torch: argparse checks it before a model loads)."""

from __future__ import annotations

import argparse
import re

DEVICE_HELP = "where the model runs: auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N"
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def device_choice(value: str) -> str:
    """argparse type of --device: auto, cpu, cuda or cuda:N (any case)."""
    v = value.strip().lower()
    if not _DEVICE.fullmatch(v):
        raise argparse.ArgumentTypeError(f"{value!r} is not a device; use auto, cpu, cuda or cuda:N")
    return v


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", type=device_choice, default="auto", metavar="{auto,cpu,cuda,cuda:N}",
                        help=DEVICE_HELP)
