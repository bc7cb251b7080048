#!/usr/bin/env python3
"""Average the weights of fine-tunes of one model ("model soup"): indeed_cli.model.surgery.average_checkpoints.

python tools/average_weights.py OUT.safetensors A.safetensors B.safetensors [...]
"""

import argparse

from indeed_cli.model import load_checkpoint, save_checkpoint
from indeed_cli.model.surgery import average_checkpoints


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the averaged checkpoint to write")
    ap.add_argument("checkpoints", nargs="+", help="fine-tunes of one model (same config)")
    a = ap.parse_args()
    avg = average_checkpoints([load_checkpoint(p) for p in a.checkpoints])
    save_checkpoint(a.out, avg.model, avg.training, avg.extra)
    print(f"{a.out}: mean of {len(a.checkpoints)} checkpoints")


if __name__ == "__main__":
    main()
