"""`indeed evaluate`: PSNR/SSIM of `indeed denoise` on clean images with synthetic AWGN,
or on noisy/clean pairs (real-noise sets)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from ..imageio import ImageError, read_image
from ..inference import denoise
from ..metrics import add_awgn, image_seed, psnr, ssim
from .common import (Batch, Device, Json, ModelCache, Overlap, Precision, Tile, Weights, CLIError, emit_json,
                     expand_inputs, inference_options)


def _pairs(noisy: list[Path], clean_dir: Path, pattern: str) -> list[tuple[Path, Path]]:
    src, dst = (pattern.split(":", 1) + [""])[:2]
    out = []
    for p in noisy:
        stem = p.stem.replace(src, dst) if src else p.stem
        cands = [q for q in clean_dir.iterdir() if q.stem == stem]
        if not cands:
            raise CLIError(f"no clean reference for {p.name} in {clean_dir} (looked for stem {stem!r})")
        out.append((p, cands[0]))
    return out


def _evaluate_detect(inputs: list[str], mask_suffix: str, models, opts, json_out: bool, recursive: bool) -> None:
    """Pixel AUROC/AP and image AUROC of `indeed detect` over images whose masks lie beside them,
    and the operating point of the checkpoint's stored threshold (anomalous and normal images flagged)."""
    from ..detection import detect, detection_metrics, load_mask, stored_threshold
    paths = expand_inputs(inputs, recursive)
    # a mask file is not an input: drop X.png when X.<other> is also an input
    stems = {(p.parent, p.stem) for p in paths if p.suffix.lower() != mask_suffix}
    images = [p for p in paths if not (p.suffix.lower() == mask_suffix and (p.parent, p.stem) in stems)]
    maps, masks, scores, labels, groups, flagged = [], [], [], [], [], []
    for p in images:
        try:
            img = read_image(p)
        except ImageError as e:
            raise CLIError(str(e), 1) from None
        ck = models.get(img.channels)
        det = detect(ck, img, opts)
        t = stored_threshold(ck)
        try:
            mask = load_mask(p, det.anomaly_map.shape, mask_suffix)
        except ValueError as e:
            raise CLIError(str(e), 1) from None
        maps.append(det.anomaly_map)
        masks.append(mask)
        scores.append(det.score)
        labels.append(bool(mask.any()))
        groups.append(p.parent.name)
        flagged.append(None if t is None else bool(det.score > t))
        if json_out:
            emit_json({"image": str(p), "score": round(det.score, 6), "anomalous": flagged[-1],
                       "anomalous_gt": bool(mask.any())})
    summary = []
    for g in ["all"] + sorted(set(groups)):
        sel = [i for i, x in enumerate(groups) if g == "all" or x == g]
        m = detection_metrics(maps, masks, scores, labels, sel)
        row = {"summary": True, "group": g, "n": m.pop("n_images"), **m}
        if all(flagged[i] is not None for i in sel):  # at the stored threshold: how many flagged
            for name, truth in (("anomalous", True), ("normal", False)):
                members = [i for i in sel if labels[i] == truth]
                row[f"flagged_{name}"] = [sum(flagged[i] for i in members), len(members)]
        summary.append(row)
    if json_out:
        for r in summary:
            emit_json(r)
        return
    from rich.console import Console
    from rich.table import Table
    t = Table("group", "images", "pixel AUROC", "pixel AP", "image AUROC", "flagged anomalous", "flagged normal",
              title="indeed evaluate --task detect (flagged: at the checkpoint's threshold)")
    for r in summary:
        counts = [f"{r[k][0]} of {r[k][1]}" if r.get(k, [0, 0])[1] else "-" for k in ("flagged_anomalous", "flagged_normal")]
        t.add_row(r["group"], str(r["n"]), *(f"{r[k]:.4f}" for k in ("pixel_auroc", "pixel_ap", "image_auroc")), *counts)
    Console().print(t)


def evaluate_cmd(
    clean: Annotated[list[str], typer.Argument(help="Clean images (files, folders, globs); with --task detect, images whose masks lie beside them.")],
    task: Annotated[str, typer.Option("--task", help="denoise, or detect (pixel/image AUROC and AP against masks).")] = "denoise",
    mask_suffix: Annotated[str, typer.Option("--mask-suffix", help="detect: the mask of X.jpg is X<suffix>; no mask = normal.")] = ".png",
    sigma: Annotated[list[float], typer.Option("--sigma", "-s", help="AWGN sigma in 8-bit units (repeatable).")] = [25.0],
    clipped: Annotated[bool, typer.Option("--clipped8", help="Clip and quantise the noisy input to 8 bits.")] = False,
    noisy: Annotated[Optional[Path], typer.Option("--noisy", help="Paired mode: folder of real noisy images.")] = None,
    pair: Annotated[str, typer.Option("--pair", help="Paired mode: stem substitution noisy:clean, e.g. _real:_mean.")] = "",
    limit: Annotated[int, typer.Option("--limit", help="Use only the first N images (0 = all).")] = 0,
    weights: Weights = None, device: Device = "auto", tile: Tile = 128, overlap: Overlap = 32,
    batch: Batch = None, precision: Precision = "fp32", json_out: Json = False,
) -> None:
    """Score denoising (PSNR/SSIM) or anomaly detection (AUROC/AP), as a table or JSON lines."""
    opts = inference_options(tile, overlap, batch, precision)
    if task == "detect":
        return _evaluate_detect(clean, mask_suffix.lower(), ModelCache(weights, device, task="detect"), opts,
                                json_out, False)
    if task != "denoise":
        raise CLIError(f"--task must be denoise or detect, got {task!r}")
    models = ModelCache(weights, device)
    rows: list[dict] = []
    if noisy is not None:
        if len(clean) != 1 or not Path(clean[0]).is_dir():
            raise CLIError("paired mode takes one clean folder as the argument and --noisy FOLDER")
        noisy_paths = expand_inputs([str(noisy)])
        if pair:
            noisy_paths = [p for p in noisy_paths if pair.split(":")[0] in p.stem]
        jobs = [(n, c, None) for n, c in _pairs(noisy_paths, Path(clean[0]), pair)]
    else:
        jobs = [(None, c, s) for s in sigma for c in expand_inputs(clean)]
    if limit:
        jobs = jobs[:limit] if noisy is not None else [j for s in sigma for j in [x for x in jobs if x[2] == s][:limit]]
    for noisy_path, clean_path, s in jobs:
        try:
            ref = read_image(clean_path)
            if noisy_path is None:
                y = add_awgn(ref.data, s, image_seed(clean_path.name, s), clipped)
            else:
                y = read_image(noisy_path).data
                if y.shape != ref.data.shape:
                    raise ImageError(f"{noisy_path}: size {y.shape} differs from its reference {ref.data.shape}")
        except ImageError as e:
            raise CLIError(str(e), 1) from None
        ckpt = models.get(ref.channels)
        t0 = time.perf_counter()
        out = denoise(ckpt, y, opts)
        row = {"image": str(noisy_path or clean_path), "sigma": s, "clipped8": clipped if s is not None else None,
               "psnr_in": round(psnr(y, ref.data), 3), "psnr": round(psnr(out, ref.data), 3),
               "ssim": (lambda v: None if v is None else round(v, 4))(ssim(out, ref.data)),
               "seconds": round(time.perf_counter() - t0, 3)}
        rows.append(row)
        if json_out:
            emit_json(row)
    summary = []
    for s in sorted({r["sigma"] for r in rows}, key=lambda v: (v is None, v)):
        rs = [r for r in rows if r["sigma"] == s]
        ss = [r["ssim"] for r in rs if r["ssim"] is not None]
        summary.append({"summary": True, "sigma": s, "n": len(rs), "psnr": round(float(np.mean([r["psnr"] for r in rs])), 3),
                        "ssim": round(float(np.mean(ss)), 4) if ss else None,
                        "psnr_in": round(float(np.mean([r["psnr_in"] for r in rs])), 3)})
    if json_out:
        for s in summary:
            emit_json(s)
        return
    from rich.console import Console
    from rich.table import Table
    t = Table("sigma", "images", "input PSNR", "PSNR", "SSIM", title="indeed evaluate" + (" (clipped 8-bit)" if clipped else ""))
    for s in summary:
        t.add_row("real" if s["sigma"] is None else f"{s['sigma']:g}", str(s["n"]), f"{s['psnr_in']:.2f}",
                  f"{s['psnr']:.2f}", "n/a (pip install scikit-image)" if s["ssim"] is None else f"{s['ssim']:.4f}")
    Console().print(t)
