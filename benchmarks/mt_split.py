#!/usr/bin/env python3
"""Deterministic split of the magnetic-tile normal images (MT_Free).

Sorted by name: index % 10 == 0 -> calib (threshold learning), index % 10 == 5 -> eval (normal
images for evaluation), the rest -> train.  Writes train.txt, calib.txt, eval.txt (paths
relative to OUT, with the images copied under OUT/MT_Free when --copy is given).

    python benchmarks/mt_split.py ../shared/data/anomaly/magnetic-tile/MT_Free OUT [--copy]
"""

import shutil
import sys
from pathlib import Path


def split(folder: Path) -> dict[str, list[Path]]:
    files = sorted(folder.glob("*.jpg"))
    parts: dict[str, list[Path]] = {"train": [], "calib": [], "eval": []}
    for i, f in enumerate(files):
        parts["calib" if i % 10 == 0 else "eval" if i % 10 == 5 else "train"].append(f)
    return parts


if __name__ == "__main__":
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    copy = "--copy" in sys.argv
    out.mkdir(parents=True, exist_ok=True)
    for name, files in split(src).items():
        lines = []
        for f in files:
            if copy and name != "eval":
                (out / "MT_Free").mkdir(exist_ok=True)
                shutil.copyfile(f, out / "MT_Free" / f.name)
                lines.append(f"MT_Free/{f.name}")
            else:
                lines.append(str(f.resolve()))
        (out / f"{name}.txt").write_text("\n".join(lines) + "\n")
        print(name, len(files))
