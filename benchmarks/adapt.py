#!/usr/bin/env python3
"""Paper Table 3 (B)/(C): active generalization on real camera noise (PolyU100), side by side
with no adaptation, FFDNet and CBM3D given an estimated sigma; plus the OOD score's separation
between real-noise inputs and in-distribution synthetic inputs (CBSD68 + AWGN sigma=15).

    python benchmarks/adapt.py --data ../shared/data/denoise-real/PolyU100 \\
        --ood-clean ../shared/data/denoise-test/CBSD68 [--methods none,ag-S,ag-L,ag-LS,oag,ffdnet,cbm3d]

Methods: ``none`` (shipped weights), ``METHOD@WEIGHTS`` (any method but the peers from other
weights: a bundled name or a path, e.g. ``none@color-camera``, ``oag@color-fullchroma``), any of
them ending in ``+psN`` or ``+psauto`` (the read-out of ``indeed denoise --pixel-shuffle
N|auto``), ``ag-S|L|LS`` (InDeedAG: one adaptation on all inputs of the folder, then inference),
``oag`` (InDeedOAG: a fresh adaptation per image; its time per image is reported), an adaptation
ending in ``~signal`` or ``~stationary`` (the level of the recorrupted objective's noise, ``indeed
adapt --recorruption-noise``) or in ``^bound`` / ``^eval`` (``indeed adapt --stop-at-bound`` /
``--stop-at-evaluation``; after any other suffix) or in ``%TILExBATCH`` (the recorrupted adaptation's tile side and
tiles per step), ``ffdnet`` / ``cbm3d`` (peers, `bench` extra) with sigma estimated from the noisy
input by scikit-image's wavelet estimator.  ``--rows-out`` / ``--from-rows`` merge rows measured on
different machines (e.g. peers on the CPU, adaptation on a GPU) into one table.  Prints Markdown
tables and the command that made them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import cbm3d_method, ffdnet_method  # noqa: E402

import indeed_cli.tasks.adaptation.runner as runner  # noqa: E402
from indeed_cli import InferenceOptions, denoise, load_model  # noqa: E402
from indeed_cli.inference import denoise_each  # noqa: E402
from indeed_cli.io import read_image  # noqa: E402
from indeed_cli.metrics import (  # noqa: E402
    add_awgn,
    auroc,  # noqa: E402
    image_seed,
    psnr,
    ssim,
)
from indeed_cli.tasks.adaptation import (  # noqa: E402
    AdaptConfig,
    adapt,
    adapt_each,
    ag_image_result,
    default_group,
    noise_map_blend,
    oag_blend_weights,
    oag_readout,
)
from indeed_cli.tasks.adaptation.config import AG_DEFAULTS, with_defaults  # noqa: E402
from indeed_cli.tasks.camera_noise import camera_pair, parse_noise  # noqa: E402
from indeed_cli.tasks.ood import image_ood_score  # noqa: E402

# the recorrupted adaptation's tiles per step (overridden per method by %TILExBATCH)
R2R_BATCH_DEFAULT = runner.R2R_BATCH


def estimate_sigma255(y: np.ndarray) -> float:
    """Noise sigma (8-bit units) of a noisy (C, h, w) image: scikit-image's wavelet MAD estimator."""
    from skimage.restoration import estimate_sigma

    if y.shape[0] == 1:
        return float(estimate_sigma(y[0])) * 255
    return float(estimate_sigma(y.transpose(1, 2, 0), channel_axis=-1, average_sigmas=True)) * 255


CAMERAS = {"canon600d": "canon600", "nikond800": "nikon800", "nikon": "nikon800", "sonya7ii": "sony"}
OBJECTS = {"plaso": "plan"}


def scene_of(name: str) -> str:
    """The PolyU scene of a file: camera and object, the same key for a PolyU100 crop
    (``Canon5D2_5_160_3200_chair_11_real.JPG``) and a full-resolution pair of the
    PolyU-Real-World-Noisy-Images-Dataset repository (``Canon5D2_chair_Real.JPG``).  Objects are
    matched by their first four letters (the full-resolution names are abbreviated; "plaso" is
    planandsofa), which puts NikonD800's plant and planandsofa into one scene: both land in the
    same half."""
    parts = [x for x in re.sub(r"_(real|mean)$", "", Path(name).stem, flags=re.I).split("_") if x]
    camera = parts[0].lower() + ("800" if parts[0].lower() == "nikon" and parts[1] == "800" else "")
    obj = parts[-2] if parts[-1].isdigit() else parts[-1]
    return f"{CAMERAS.get(camera, camera)}/{OBJECTS.get(obj.lower(), obj.lower()[:4])}"


def scene_half(name: str) -> str:
    """ "dev" or "test": a hash of the scene, so that no scene is in both halves."""
    return "dev" if int(hashlib.sha1(scene_of(name).encode()).hexdigest(), 16) % 2 == 0 else "test"


def pairs(folder: Path, limit: int | None, split: str = "all") -> list[tuple[Path, Path]]:
    """Noisy/clean pairs (``*_real.*`` / ``*_mean.*``, any case) sorted by name; ``split`` even/odd
    keeps every other pair, scene-dev/scene-test the pairs of one half of the scenes."""
    found = sorted(p for p in folder.iterdir() if re.search(r"_real$", p.stem, re.I))
    out = [(p, p.with_name(re.sub(r"_real$", "_mean", p.stem, flags=re.I) + p.suffix)) for p in found]
    if split in ("even", "odd"):
        out = out[{"even": 0, "odd": 1}[split] :: 2]
    elif split != "all":
        out = [(n, c) for n, c in out if scene_half(n.name) == split.removeprefix("scene-")]
    return out[:limit] if limit else out


def centre_crop(a: np.ndarray, size: int | None) -> np.ndarray:
    if not size:
        return a
    h, w = a.shape[1:]
    y, x = max(0, (h - size) // 2), max(0, (w - size) // 2)
    return np.ascontiguousarray(a[:, y : y + size, x : x + size])


def as_gray(x: np.ndarray, gray: bool) -> np.ndarray:
    """With ``gray``, a (C, h, w) image as one channel, the mean of its channels (as benchmarks/denoise.py
    reads a colour set as gray); otherwise the image itself."""
    return x.mean(0, keepdims=True).astype(np.float32) if gray and x.shape[0] == 3 else x


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def ck_device(ck):
    return next(ck.model.parameters()).device


def warm_up(ck, data, opts, acfg: AdaptConfig, device: str, oag: bool = False) -> None:
    """One untimed denoise and adaptation: CUDA's lazy start-up (seconds) is not a per-image cost.
    With ``oag``, also one short OAG group of the size the runs use, through both objectives: with the
    single-image warm-up alone the first OAG method of a run took 0.005-0.026 s per image more than the
    same work as the second (one H100, PolyU100, docs/reports/2026-12-06-oag-stop-at-the-bound.md),
    the cost of a GPU's first group of a new size."""
    denoise(ck, data[0][1], opts)
    adapt(ck, [data[0][1]], AdaptConfig(**{**acfg.__dict__, "steps": 2}))
    if oag:
        group = acfg.group or default_group(ck_device(ck))
        short = replace(acfg, steps=2, recorrupted_steps=2, decide="always", objective="auto")
        adapt_each(ck, [[y] for _, y, _ in data[:group]], short)
    sync(device)


def run_indeed(method: str, ck, data, opts, acfg: AdaptConfig, device: str, pixel_shuffle: int | str = 1) -> list[dict]:
    """``method``: none, ag-S|L|LS or oag, optionally ``:ood`` / ``:change`` / ``:always``
    (AdaptConfig.decide; without it the default); ``pixel_shuffle``: the read-out of the result
    (``+psN`` after a method, docs/guide/denoise.md)."""
    rows = []
    base, _, decide = method.partition(":")
    acfg = AdaptConfig(**{**acfg.__dict__, "decide": decide or None})
    shared, adapt_s, ag_info, used = None, None, {}, [True] * len(data)
    if base.startswith("ag-"):
        sync(device)
        t = time.perf_counter()
        res = adapt(ck, [y for _, y, _ in data], AdaptConfig(**{**acfg.__dict__, "modules": base[3:]}))
        sync(device)
        adapt_s = time.perf_counter() - t
        shared, used = res, res.adapted_images
        fallback_used = res.fallback.adapted_images if res.fallback else [False] * len(data)
        ag_info = {"best_step": res.best_step, "stop": res.stop, "objective": res.objective}
        print(f"{method}: best step {res.best_step}, stop {res.stop}, {sum(used)} images", file=sys.stderr)
    if base == "oag":  # a fresh adaptation per image, acfg.group images at a time (one batched network)
        group = acfg.group or default_group(ck_device(ck))
        for c in range(0, len(data), group):
            chunk = data[c : c + group]
            sync(device)
            t = time.perf_counter()
            results = adapt_each(ck, [[y] for _, y, _ in chunk], acfg)
            sync(device)
            t_adapt = time.perf_counter() - t
            readout = oag_readout(opts, ck_device(ck))
            if pixel_shuffle == 1:  # the group's results read out together (grouped f_thetaS on a GPU)
                outs = denoise_each([res.checkpoint for res in results], [y for _, y, _ in chunk], readout)
                for k, ((_, y, _), res) in enumerate(zip(chunk, results)):  # Eq. (noise-map blend), as the product
                    w = oag_blend_weights(res, y)
                    if w is not None:
                        outs[k] = noise_map_blend(denoise(ck, y, readout), outs[k], w)
            else:
                outs = [
                    denoise(res.checkpoint, y, readout, pixel_shuffle=pixel_shuffle)
                    for (_, y, _), res in zip(chunk, results)
                ]
            sync(device)
            per_image = (time.perf_counter() - t) / len(chunk)  # amortised over the chunk
            for (name, _, x), res, out in zip(chunk, results, outs):
                rows.append(
                    {
                        "method": method,
                        "image": name,
                        "psnr": psnr(out, x),
                        "ssim": ssim(out, x),
                        "seconds": per_image,
                        "adapt_seconds": t_adapt / len(chunk),
                        "group": len(chunk),
                        "adapt_seconds_total": None,
                        "best_step": res.best_step,
                        "stop": res.stop,
                        "adapted": res.best_step > 0,
                        "objective": res.objective if res.best_step > 0 else None,
                        "recorrupted": res.recorrupted,
                        # what decide="change" reads: the ELBO's first change over the start's RMS of N
                        "first_change_ratio": res.first_change_ratio,
                        # Eq. (noise presence): the detector's score (None: not asked)
                        "noise_score": (res.noise_scores or [None])[0],
                    }
                )
        return rows
    rules = with_defaults(acfg, AG_DEFAULTS)  # the per-image choice after AG
    for i, ((name, y, x), adapted) in enumerate(zip(data, used)):
        sync(device)
        t = time.perf_counter()
        choice, res = None, None
        # the library's per-image result after AG: the choice after the ELBO (the recorrupted
        # objective's gate chose already), the fallback of objective auto
        if shared and pixel_shuffle == 1:
            noise_score = shared.noise_scores[i] if shared.noise_scores else None  # --noise-check
            res, choice = ag_image_result(
                ck, shared, y, adapted, None, rules.min_change_ratio, rules.image_noise_bound, opts, fallback_used[i],
                noise_score,
            )  # fmt: skip
            adapted = res.best_step > 0
            out = np.clip(choice.output, 0, 1) if choice else denoise(res.checkpoint, y, opts)
        else:
            out = denoise(shared.checkpoint if shared and adapted else ck, y, opts, pixel_shuffle=pixel_shuffle)
        sync(device)
        seconds = time.perf_counter() - t  # before the metrics: SSIM of a 512x512 image takes ~0.07 s
        rows.append(
            {
                "method": method,
                "image": name,
                "psnr": psnr(out, x),
                "ssim": ssim(out, x),
                "seconds": seconds,
                "adapt_seconds_total": adapt_s,
                **ag_info,
                **({"objective": res.objective} if res is not None and res.best_step > 0 else {}),
                **({"adapted": adapted and (res is not None or ag_info["best_step"] > 0)} if shared else {}),
                **({"change_ratio": choice.ratio, "removed_over_noise": choice.removed} if choice is not None else {}),
            }
        )
    return rows


def run_peer(method: str, data, device: str) -> list[dict]:
    channels = data[0][1].shape[0]
    fn = ffdnet_method(channels, device) if method == "ffdnet" else cbm3d_method(channels)
    rows = []
    for name, y, x in data:
        s = estimate_sigma255(y)
        t = time.perf_counter()
        out = fn(y, s)
        seconds = time.perf_counter() - t
        rows.append(
            {
                "method": method,
                "image": name,
                "psnr": psnr(out, x),
                "ssim": ssim(out, x),
                "seconds": seconds,
                "sigma_est": s,
            }
        )
    return rows


def ood_rows(ck, data, clean_dir: Path, sigma: float, limit: int | None, opts) -> list[dict]:
    ood = ck.extra.get("ood")
    if not ood:
        raise SystemExit("the checkpoint has no OOD statistics (indeed calibrate)")
    rows = [{"method": "ood", "set": "real", "image": n, "ood_score": image_ood_score(ck, y, opts)} for n, y, _ in data]
    clean = sorted(p for p in clean_dir.iterdir() if p.suffix.lower() in (".png", ".jpg", ".bmp", ".tif"))
    for p in clean[:limit] if limit else clean:
        y = add_awgn(read_image(p).data, sigma, image_seed(p.name, sigma))
        rows.append(
            {
                "method": "ood",
                "set": f"awgn{sigma:g}",
                "image": p.name,
                "ood_score": image_ood_score(ck, y, opts),
            }
        )
    for r in rows:
        r["threshold"] = ood["threshold"]
    return rows


def render(rows: list[dict]) -> None:
    den = [r for r in rows if r["method"] != "ood"]
    order = ["noisy input", "none", "ag-S", "ag-L", "ag-LS", "oag", "ffdnet", "cbm3d"]

    def rank(m: str) -> tuple:
        b = m.partition(":")[0]
        return (order.index(b) if b in order else 99, m)

    for data in dict.fromkeys(r.get("data", "") for r in den):
        here = [r for r in den if r.get("data", "") == data]
        plain = {r["image"]: r["psnr"] for r in here if r["method"] == "none"}
        print(f"\n{data}\n" if data else "")
        print("| method | n | PSNR | vs none | worst image vs none | adapted | SSIM | s / image | adaptation s (AG) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for m in sorted({r["method"] for r in here}, key=rank):
            q = [r for r in here if r["method"] == m]
            ss = [r["ssim"] for r in q if r.get("ssim") is not None]
            ad = q[0].get("adapt_seconds_total")
            d = [r["psnr"] - plain[r["image"]] for r in q if r["image"] in plain]
            used = [r["adapted"] for r in q if "adapted" in r]
            print(
                f"| {m} | {len(q)} | {np.mean([r['psnr'] for r in q]):.2f} | "
                + (f"{np.mean(d):+.2f} | {min(d):+.2f}" if d and m != "none" else "- | -")
                + (f" | {sum(used)} of {len(used)}" if used else " | -")
                + " | "
                + (f"{np.mean(ss):.4f}" if ss else "-")
                + f" | {np.mean([r['seconds'] for r in q]):.3f} | "
                + (f"{ad:.1f}" if ad else "-")
                + " |"
            )
    print()
    for m in sorted({r["method"] for r in den if "stop" in r}, key=rank):
        q = [r for r in den if r["method"] == m]
        if q:
            stops = {}
            for r in q if m.startswith("oag") else q[:1]:
                stops[r["stop"]] = stops.get(r["stop"], 0) + 1
            objectives = {}
            for r in q:
                if r.get("objective") and r.get("adapted"):
                    objectives[r["objective"]] = objectives.get(r["objective"], 0) + 1
            print(
                f"{m} stop reasons: {stops}; mean best step {np.mean([r['best_step'] for r in q]):.1f}"
                + (f"; adapted by objective: {objectives}" if objectives else "")
                + "  "
            )
    q = [r for r in den if r["method"].startswith("oag") and r.get("adapt_seconds") is not None]
    if q:
        a_s, t_s = np.mean([r["adapt_seconds"] for r in q]), np.mean([r["seconds"] for r in q])
        print(
            f"oag: up to {max(r['group'] for r in q)} images adapted at once; s / image, amortised: "
            f"adaptation {a_s:.3f} + inference {t_s - a_s:.3f} = {t_s:.3f}  "
        )
    ood = [r for r in rows if r["method"] == "ood"]
    if ood:
        real = np.array([r["ood_score"] for r in ood if r["set"] == "real"])
        sets = sorted({r["set"] for r in ood if r["set"] != "real"})
        print("\n| OOD score | n | median score | flagged (> threshold) |")
        print("|---|---|---|---|")
        thr = ood[0]["threshold"]
        for s in ["real", *sets]:
            v = np.array([r["ood_score"] for r in ood if r["set"] == s])
            print(f"| {s} | {len(v)} | {np.median(v):.2f} | {np.mean(v > thr):.0%} |")
        for s in sets:
            syn = np.array([r["ood_score"] for r in ood if r["set"] == s])
            lab = np.r_[np.ones(len(real)), np.zeros(len(syn))]
            print(f"\nOOD AUROC real vs {s}: {auroc(np.r_[real, syn], lab):.3f} (threshold {thr:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data", type=Path, help="folder of *_real / *_mean pairs (PolyU100), or of clean images with --camera"
    )
    ap.add_argument(
        "--camera",
        default=None,
        help="camera:LEVEL[+mhc][+jpeg][,...]: make the noisy/reference pairs from the clean images of --data with the "
        "camera noise model (indeed_cli.tasks.camera_noise), seeded per image; one table per level; also "
        "gauss:SIGMA (white Gaussian noise, 8-bit) and clean (no noise)",
    )
    ap.add_argument("--crop", type=int, default=512, help="with --camera: the top-left crop of each clean image")
    ap.add_argument(
        "--gray",
        action="store_true",
        help="the images as gray (the mean of their channels, before any noise) and the bundled gray model",
    )
    ap.add_argument(
        "--pair-crop", type=int, default=None, help="noisy/clean pairs: their centre crop of this size (full-res PolyU)"
    )
    ap.add_argument("--ood-clean", type=Path, help="clean in-distribution images for the OOD AUROC (CBSD68)")
    ap.add_argument("--ood-sigma", type=float, default=15.0)
    ap.add_argument(
        "--methods",
        default="none,ag-S,ag-L,ag-LS,oag,ffdnet,cbm3d",
        help="adaptations may end in :always, :change or :ood (AdaptConfig.decide), e.g. oag,oag:always; "
        "any indeed method in +psN (pixel-shuffle read-out), e.g. none+ps2,none@color-fullchroma+ps2; "
        "an adaptation in ~stationary or ~signal (--recorruption-noise), e.g. oag,oag~stationary; "
        "and last in ^bound or ^eval (--stop-at-bound / --stop-at-evaluation), e.g. oag^eval,oag",
    )
    ap.add_argument("--weights", default=None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--limit", type=int, default=None, help="first N pairs only")
    ap.add_argument(
        "--split",
        default="all",
        choices=["all", "even", "odd", "scene-dev", "scene-test"],
        help="every other pair by name (even = the set the adaptation settings were tuned on), or one half of "
        "the PolyU scenes (scene_half: PolyU100 crops and full-resolution pairs split alike)",
    )
    ap.add_argument("--steps", type=int, default=None, help="default: 20 for ag-*, 12 for oag (the CLI defaults)")
    ap.add_argument("--lr", type=float, default=None, help="default: 1e-5 for ag-*, 3e-5 for oag (the CLI defaults)")
    ap.add_argument("--max-change", type=float, default=AdaptConfig.max_change, help="trust region; 0: none")
    ap.add_argument(
        "--first-change-ratio",
        type=float,
        default=AdaptConfig.first_change_ratio,
        help="oag (decide change): the first evaluation's least move over the starting residual",
    )
    ap.add_argument(
        "--noise-check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ask the noise-presence detector first (indeed adapt --noise-check, the default; ag-*: for outputs only)",
    )
    ap.add_argument(
        "--image-noise-bound",
        type=float,
        default=None,
        help="ag-*: per image, keep the adapted output only where it removed at most this many times the "
        "image's noise level; 0: no bound (default 1.25)",
    )
    ap.add_argument(
        "--min-change-ratio",
        type=float,
        default=None,
        help="ag-*: per image, keep the adapted output only at this change ratio or more; 0: always (default 2.5)",
    )
    ap.add_argument(
        "--objective",
        default=None,
        choices=["auto", "elbo", "recorrupted"],
        help="the adaptation objective (default: oag auto, the recorrupted one where the elbo kept the start; "
        "ag-* elbo)",
    )
    ap.add_argument(
        "--recorruption-level",
        choices=["rms", "robust", "quiet"],
        default="rms",
        help="the recorrupted objective's noise level (AdaptConfig.recorruption_level; default rms)",
    )
    ap.add_argument(
        "--recorrupted-steps",
        type=int,
        default=None,
        help="the recorrupted adaptation's steps, its learning rate scaled by 20/N (AdaptConfig.recorrupted_steps; "
        "default 20)",
    )
    ap.add_argument(
        "--noise-bound", type=float, default=None, help="discrepancy bound; 0: none (default: ag-* none, oag 1.25)"
    )
    ap.add_argument("--patience", type=int, default=None, help="default: 0 (never) for ag-*, 6 for oag")
    ap.add_argument("--keep", default=None, choices=["best", "latest", "last"], help="kept (AG: latest, OAG: last)")
    ap.add_argument("--eval-every", type=int, default=AdaptConfig.eval_every)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--infer-precision", default=None, help="inference precision (default: --precision)")
    ap.add_argument("--adapt-batch", type=int, default=AdaptConfig.batch, help="tiles per adaptation step")
    ap.add_argument(
        "--group",
        type=int,
        default=None,
        help="oag: images adapted at once as one batched network (default 16 on a GPU, 1 on a CPU)",
    )
    ap.add_argument(
        "--train-stride",
        type=int,
        default=AdaptConfig.train_stride,
        help="step between training tiles; 0: non-overlapping (the tile size)",
    )
    ap.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms per shape")
    ap.add_argument("--rows-out", type=Path)
    ap.add_argument("--from-rows", type=Path, nargs="*", default=[])
    a = ap.parse_args()
    if a.cudnn_benchmark:
        import torch

        torch.backends.cudnn.benchmark = True
    rows = [json.loads(line) for f in a.from_rows for line in f.read_text().splitlines() if line.strip()]
    methods = [m for m in a.methods.split(",") if m]
    channels = 1 if a.gray else 3
    if a.data:
        sets = []  # (name, [(image, noisy, reference)])
        if a.camera:
            clean = sorted(p for p in a.data.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
            crops = [
                (p.name, as_gray(read_image(p).data[:, : a.crop, : a.crop], a.gray)) for p in clean[: a.limit or None]
            ]
            for spec in a.camera.split(","):
                if spec == "clean":  # no noise: what adaptation does to an image it should leave alone
                    sets.append((spec, [(n, c, c) for n, c in crops]))
                elif spec.startswith("gauss:"):  # white Gaussian noise, 8-bit clipped, seeded per image
                    sigma = float(spec[6:])
                    sets.append((spec, [(n, add_awgn(c, sigma, image_seed(n, 0), clipped8=True), c) for n, c in crops]))
                else:
                    level, jpeg, demosaic = parse_noise(spec)
                    sets.append(
                        (spec, [(n, *camera_pair(c, level, image_seed(n, 0), jpeg, demosaic)) for n, c in crops])
                    )
        else:
            sets.append((f"{a.data.name} {a.split}", [
                (n.name, as_gray(centre_crop(read_image(n).data, a.pair_crop), a.gray),
                 as_gray(centre_crop(read_image(c).data, a.pair_crop), a.gray))
                for n, c in pairs(a.data, a.limit, a.split)
            ]))  # fmt: skip
        ck = load_model(a.weights, channels, a.device, job="adapt")
        dev = str(next(ck.model.parameters()).device)
        opts = InferenceOptions(precision=a.infer_precision or a.precision)
        acfg = AdaptConfig(
            steps=a.steps,
            lr=a.lr,
            max_change=a.max_change,
            first_change_ratio=a.first_change_ratio,
            noise_check=a.noise_check,
            noise_bound=a.noise_bound,
            min_change_ratio=a.min_change_ratio,
            image_noise_bound=a.image_noise_bound,
            objective=a.objective,
            recorruption_level=a.recorruption_level,
            recorrupted_steps=a.recorrupted_steps,
            patience=a.patience,
            keep=a.keep,
            precision=a.precision,
            eval_every=a.eval_every,
            group=a.group,
            train_stride=a.train_stride or None,
            batch=a.adapt_batch,
        )
        if any(m not in ("ffdnet", "cbm3d") for m in methods):
            warm_up(ck, sets[0][1], opts, acfg, dev, oag=any(m.split("@")[0].startswith("oag") for m in methods))
        for name, data in sets:
            new = [
                {"method": "noisy input", "image": n, "psnr": psnr(y, x), "ssim": ssim(y, x), "seconds": 0.0}
                for n, y, x in data
            ]
            for m in methods:
                t = time.perf_counter()
                core, _, stop = m.partition("^")  # ^bound / ^eval: AdaptConfig.stop_at_bound on / off
                core, _, noise = core.partition("~")  # ~stationary / ~signal: AdaptConfig.recorruption_noise
                core, _, r2r_shape = core.partition("%")  # %TILExBATCH: the recorrupted adaptation's tiles
                r2r_tile, runner.R2R_BATCH = (
                    map(int, r2r_shape.split("x")) if r2r_shape else (acfg.recorrupted_tile, R2R_BATCH_DEFAULT)
                )
                base, _, ps = core.partition("+ps")  # +psN / +psauto: indeed denoise --pixel-shuffle N|auto
                ps = ps or 1
                mcfg = replace(acfg, recorruption_noise=noise or acfg.recorruption_noise, recorrupted_tile=r2r_tile,
                               stop_at_bound={"bound": True, "eval": False}.get(stop, acfg.stop_at_bound))  # fmt: skip
                if m in ("ffdnet", "cbm3d"):
                    got = run_peer(m, data, dev)
                elif "@" in base:  # inference or adaptation from other weights, beside the shipped ones
                    how, _, weights = base.partition("@")
                    got = run_indeed(
                        how, load_model(weights, channels, a.device, job="adapt"), data, opts, mcfg, dev, ps
                    )
                else:
                    got = run_indeed(base, ck, data, opts, mcfg, dev, ps)
                got = [{**r, "method": m} for r in got]
                print(
                    f"{name} {m}: {time.perf_counter() - t:.1f} s, mean PSNR {np.mean([r['psnr'] for r in got]):.2f}",
                    file=sys.stderr,
                    flush=True,
                )
                new += got
            rows += [{**r, "data": name} for r in new]
        data = sets[0][1]
        if a.ood_clean:
            rows += ood_rows(ck, data, a.ood_clean, a.ood_sigma, a.limit, opts)
    seen: set = set()  # merged row files each carry the noisy-input rows: keep one per image
    rows = [
        r for r in rows if not ((k := (r["method"], r.get("set"), r.get("data"), r["image"])) in seen or seen.add(k))
    ]
    if a.rows_out:
        a.rows_out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    render(rows)
    print("\nCommand: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
