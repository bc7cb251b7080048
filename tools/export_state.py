#!/usr/bin/env python3
"""Export the checkpoint of a training run's resumable state, for a run that was cut off before it
wrote model.safetensors (indeed_cli.tasks.training.export_state); then calibrate it as `indeed train`
would, with `indeed calibrate`.

    python tools/export_state.py runs/my-model OUT.safetensors
"""

import argparse
from pathlib import Path

from indeed_cli.tasks.training import export_state, read_state_metadata


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the run folder (--out of indeed train)")
    ap.add_argument("out", type=Path, help="the checkpoint to write")
    a = ap.parse_args()
    meta = read_state_metadata(a.run)
    export_state(a.run, a.out)
    print(f"{a.out}: step {meta['step']}, {meta['elapsed']:.0f} s of training")


if __name__ == "__main__":
    main()
