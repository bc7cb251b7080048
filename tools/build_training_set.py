#!/usr/bin/env python3
"""Build a training set from folders of photographs: leak check against the test sets, area
downscaling, crops, a held-out split and a manifest (indeed_cli.tasks.training.curation).

python tools/build_training_set.py SRC [SRC ...] --out DIR --tests DIR [--tests DIR ...]
    [--downscale 0.5] [--crop 256] [--max-crops 4] [--holdout 0.2] [--format png|webp|jpg]

Every image under the --tests folders (searched recursively) is a test image: a source image that
equals, contains or is contained in one of them (re-encoded, resized, flipped or gray) is left
out and listed in the manifest with the test image it matched.
"""

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from indeed_cli.tasks.training.curation import build_training_set, leak_index


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("sources", nargs="+", type=Path, help="folders of photographs")
    ap.add_argument("--out", required=True, type=Path, help="a new folder: train/, holdout/, manifest.json")
    ap.add_argument("--tests", action="append", type=Path, default=[], help="a folder of test images (repeatable)")
    ap.add_argument("--downscale", type=float, default=1.0, help="area-filter factor in (0, 1]")
    ap.add_argument("--crop", type=int, default=0, help="side of the square crops (0 = whole images)")
    ap.add_argument("--max-crops", type=int, default=0, help="at most this many crops a source image (0 = all)")
    ap.add_argument("--holdout", type=float, default=0.0, help="share of source images held out")
    ap.add_argument("--format", default="png", choices=["png", "webp", "jpg"])
    ap.add_argument("--min-side", type=int, default=0, help="leave out images smaller than this after downscaling")
    a = ap.parse_args()
    for d in [*a.sources, *a.tests]:
        if not d.is_dir():
            print(f"error: not a folder: {d}", file=sys.stderr)
            return 2
    if not a.tests:
        print("error: give the test sets to check against with --tests", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    tests = leak_index(a.tests)
    try:
        m = build_training_set(
            a.sources,
            a.out,
            tests,
            downscale=a.downscale,
            crop=a.crop,
            max_crops=a.max_crops,
            holdout=a.holdout,
            fmt=a.format,
            min_side=a.min_side,
        )
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    splits = Counter(r["file"].split("/")[0] for r in m["images"])
    size = sum(r["bytes"] for r in m["images"])
    print(
        f"{a.out}: {splits['train']} train and {splits['holdout']} held-out images from "
        f"{len({r['source'] for r in m['images']})} sources, {size / 2**20:.1f} MiB, "
        f"checked against {len(tests.names)} test images in {time.perf_counter() - t0:.0f} s"
    )
    for r in m["excluded"]:
        print(
            f"  left out {r['source']}: {r['reason']}"
            + (f" {r['of']}" if "of" in r else "")
            + (f" (correlation {r['score']})" if "score" in r else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
