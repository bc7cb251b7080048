"""`indeed detect`: pixel-wise anomaly maps from the posterior of S, a score and a decision per image."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer
from PIL import Image

from ..detection import detect, detect_tiles, readout_scales, stored_threshold
from ..imageio import ImageError, atomic_save, atomic_write_via, read_image
from .common import (OrderedWriter, Compile, EXIT_FAILED, Batch, Device, Force, Json, ModelCache, Overlap, Precision, Quiet, Recursive,
                     Tile, Weights, CLIError, skip_done, report_skipped, SkipExisting, parse_scales, require_folder, emit_json, expand_inputs, inference_options,
                     progress_bar, report_failure, stem, warn)


def heat(v: np.ndarray) -> np.ndarray:
    """[0,1] -> RGB uint8, black-red-yellow-white ramp."""
    v = np.clip(v, 0, 1)[..., None]
    stops = np.array([[0, 0, 0], [180, 20, 20], [250, 200, 30], [255, 255, 255]], np.float32)
    pos = v * 3
    i = np.minimum(pos.astype(int), 2)
    f = pos - i
    return (stops[i[..., 0]] * (1 - f) + stops[i[..., 0] + 1] * f).astype(np.uint8)


def detect_cmd(
    inputs: Annotated[list[str], typer.Argument(help="Image files, folders or glob patterns.")],
    maps: Annotated[Path, typer.Option("--maps", help="Folder for <stem>_anomaly/_overlay/_mask.png and <stem>.npz.")],
    threshold: Annotated[Optional[float], typer.Option("--threshold", help="Override the checkpoint's learned threshold.")] = None,
    scales: Annotated[Optional[str], typer.Option("--scales", help="Read-out scales, e.g. 1,0.5,0.25 (maps averaged); "
                                                  "default: those stored with the threshold.")] = None,
    weights: Weights = None, device: Device = "auto", tile: Tile = 128, overlap: Overlap = 32,
    batch: Batch = None, precision: Precision = "fp32", json_out: Json = False, force: Force = False,
    quiet: Quiet = False, recursive: Recursive = False, compile_net: Compile = False,
    skip_existing: SkipExisting = False,
) -> None:
    """Detect anomalies (defects) pixel by pixel; one JSON line per image with --json."""
    read_scales = parse_scales(scales) if scales else None
    paths = expand_inputs(inputs, recursive)
    require_folder(maps, "--maps")
    plans = [{"anomaly": maps / f"{stem(p)}_anomaly.png", "overlay": maps / f"{stem(p)}_overlay.png",
              "mask": maps / f"{stem(p)}_mask.png", "npz": maps / f"{stem(p)}.npz"} for p in paths]
    paths, plans, skipped = skip_done(paths, plans, skip_existing, force)
    report_skipped(skipped, json_out, quiet)
    opts = inference_options(tile, overlap, batch, precision)
    models = ModelCache(weights, device, task="detect", compile=compile_net)
    failed = flagged = 0

    def write_maps(img, amap, t, files) -> None:
        """Heat map, overlay, mask and npz of one image (on a writer thread)."""
        view = amap / (2 * t) if t > 0 else amap / max(float(amap.max()), 1e-12)
        hm = heat(view)
        gray = np.repeat((np.clip(img.data.mean(0), 0, 1) * 255)[..., None], 3, -1)
        a = np.clip(view, 0, 1)[..., None] * 0.7
        overlay = (gray * (1 - a) + hm * a).astype(np.uint8)
        mask = ((amap > t) * 255).astype(np.uint8)
        atomic_save(Image.fromarray(hm, "RGB"), files["anomaly"])
        atomic_save(Image.fromarray(overlay, "RGB"), files["overlay"])
        atomic_save(Image.fromarray(mask, "L"), files["mask"])
        atomic_write_via(files["npz"], lambda p: np.savez_compressed(p, anomaly_map=amap.astype(np.float32)))

    def done(error, src, score, t, amap, files) -> None:
        nonlocal failed, flagged
        if error:
            failed += 1
            report_failure(src, error, json_out)
            return
        anomalous = score > t
        flagged += anomalous
        if json_out:
            emit_json({"image": str(src), "score": round(score, 6), "anomalous": bool(anomalous),
                       "threshold": t, "anomalous_fraction": round(float((amap > t).mean()), 6),
                       "maps": {k: str(v) for k, v in files.items()}})

    with OrderedWriter() as writer:  # maps written while the next image is read out
        for src, files in zip(paths, plans):
            try:
                img = read_image(src)
                ck = models.get(img.channels)
                t = threshold if threshold is not None else stored_threshold(ck)
                if t is None:
                    raise CLIError(f"{ck.source} stores no threshold; pass --threshold", 2)
                use = read_scales or readout_scales(ck)
                with progress_bar(detect_tiles(ck, *img.size, opts, use), src.name, quiet) as bar:
                    det = detect(ck, img, opts, progress=bar.update, scales=use)
            except ImageError as e:
                writer.then(lambda e=e, src=src, files=files: done(e, src, 0.0, 0.0, None, files))
                continue
            amap = det.anomaly_map
            writer.submit(lambda a=(img, amap, t, files): write_maps(*a),
                          lambda _, e, a=(src, det.score, t, amap, files): done(e, *a),
                          20 * amap.nbytes)  # float64 overlay temporaries: ~80 bytes a pixel
    if not quiet:
        warn(f"{flagged} of {len(paths) - failed} images flagged as anomalous")
    if failed:
        raise typer.Exit(EXIT_FAILED)
