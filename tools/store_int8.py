#!/usr/bin/env python3
"""Rewrite a checkpoint with its largest convolutions stored in int8 (one float16 scale per output
channel; indeed_cli.model.checkpoint.quantize_int8), the rest in float16. Config, training facts and
deployment facts (OOD statistics, thresholds) and a detector's members (stored so too) are kept; every
indeed since format version 2 reads it (3 where the detector has members).

    python tools/store_int8.py IN.safetensors OUT.safetensors [--min-weights 524288]
"""

import argparse
from pathlib import Path

from indeed_cli.model import load_checkpoint, save_checkpoint
from indeed_cli.model.checkpoint import INT8_MIN_WEIGHTS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="the checkpoint to read")
    ap.add_argument("out", type=Path, help="the checkpoint to write (may be src)")
    ap.add_argument(
        "--min-weights",
        type=int,
        default=INT8_MIN_WEIGHTS,
        help=f"store convolutions with at least this many weights in int8 (default {INT8_MIN_WEIGHTS})",
    )
    a = ap.parse_args()
    ck = load_checkpoint(a.src)
    save_checkpoint(
        a.out, ck.model, ck.training, ck.extra, int8_min_weights=a.min_weights, members=ck.members, memory=ck.memory
    )
    print(f"{a.out}: {a.src.stat().st_size / 1e6:.2f} MB -> {a.out.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
