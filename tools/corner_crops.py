#!/usr/bin/env python3
"""Corner crops of photographs, as the held-out `h32` set of issue 19's reports was cut.

The names are those of docs/results.md's rows with "plain 27.11 dB" (heavy camera noise; `benchmarks/adapt.py`
seeds each crop's noise by its name): on 2026-12-08 these crops gave plain 27.11 and OAG 30.03 dB on an NVIDIA
H100, that table's machine-4 row to the digit. Some later reports cut the same corners under other names, so
their noise, and their PSNR, differ.

From each photograph of SRC (PNG) whose name holds --match (default: Urban100's, in the held-out split of
tools/build_training_set.py), the top-left and top-right SIZE x SIZE corners, and the bottom ones where the
photograph is at least 2 x SIZE high; named `<photograph>_<tl|tr|bl|br>.png` (the photograph's name after the
builder's last `__`), sorted by name, the first --count of them written to OUT.  OUT must not exist yet.

    python tools/corner_crops.py /tmp/hqwhole/holdout .carry/h32      # h32: 32 crops of 512 x 512

(/tmp/hqwhole from `tools/build_training_set.py ../shared/data/denoise-train/hq --tests ../shared/data/denoise-test
--crop 0 --holdout 0.2 --format png --out /tmp/hqwhole`.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image


def corner_boxes(width: int, height: int, size: int) -> dict[str, tuple[int, int, int, int]]:
    """The (left, top, right, bottom) boxes of the corners taken from a photograph of this size."""
    if width < size or height < size:
        return {}
    boxes = {"tl": (0, 0), "tr": (width - size, 0)}
    if height >= 2 * size:
        boxes.update(bl=(0, height - size), br=(width - size, height - size))
    return {k: (x, y, x + size, y + size) for k, (x, y) in boxes.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--count", type=int, default=32)
    ap.add_argument("--match", default="Urban100__img_")
    a = ap.parse_args()
    if a.out.exists():
        sys.exit(f"corner_crops: {a.out} exists already")
    crops = []
    for p in sorted(a.src.glob("*.png")):
        if a.match not in p.name:
            continue
        with Image.open(p) as im:
            w, h = im.size
        for corner, box in corner_boxes(w, h, a.size).items():
            crops.append((f"{p.stem.split('__')[-1]}_{corner}.png", p, box))
    crops.sort(key=lambda c: c[0])
    a.out.mkdir(parents=True)
    for name, p, box in crops[: a.count]:
        with Image.open(p) as im:
            im.convert("RGB").crop(box).save(a.out / name)
    print(f"{min(a.count, len(crops))} of {len(crops)} corner crops written to {a.out}")


if __name__ == "__main__":
    main()
