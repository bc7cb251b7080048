"""Detect anomalies in files and folders: a map, a score and a decision per image."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from ..inference import InferenceOptions, resolve_precision
from ..io import ImageError, LoadedImage, atomic_save, atomic_write_via
from ..model import Checkpoint
from ..tasks.detection import (
    detect,
    detect_tiles,
    readout_ensemble,
    readout_options,
    readout_scales,
    stored_pixel_threshold,
    stored_threshold,
)
from .inputs import UsageError, ensemble_setting, expand_inputs, input_names, require_folder, skip_done
from .runner import ModelCache, Outcome, Product, Progress, note_large_image, read_ahead_on, run_ordered


def heat(v: np.ndarray) -> np.ndarray:
    """[0,1] -> RGB uint8, black-red-yellow-white ramp."""
    v = np.clip(v, 0, 1)[..., None]
    stops = np.array([[0, 0, 0], [180, 20, 20], [250, 200, 30], [255, 255, 255]], np.float32)
    pos = v * 3
    i = np.minimum(pos.astype(int), 2)
    f = pos - i
    return (stops[i[..., 0]] * (1 - f) + stops[i[..., 0] + 1] * f).astype(np.uint8)


def map_files(folder: Path, name: str) -> dict[str, Path]:
    """The files one image's read-out is written to."""
    return {
        "anomaly": folder / f"{name}_anomaly.png",
        "overlay": folder / f"{name}_overlay.png",
        "mask": folder / f"{name}_mask.png",
        "npz": folder / f"{name}.npz",
    }


def write_maps(img: LoadedImage, amap: np.ndarray, threshold: float, files: dict[str, Path]) -> None:
    """Heat map (the threshold at mid-scale), overlay on the image, mask at the threshold, float npz;
    ``threshold`` is the pixel threshold."""
    view = amap / (2 * threshold) if threshold > 0 else amap / max(float(amap.max()), 1e-12)
    hm = heat(view)
    gray = np.repeat((np.clip(img.data.mean(0), 0, 1) * 255)[..., None], 3, -1)
    a = np.clip(view, 0, 1)[..., None] * 0.7
    overlay = (gray * (1 - a) + hm * a).astype(np.uint8)
    mask = ((amap > threshold) * 255).astype(np.uint8)
    atomic_save(Image.fromarray(hm, "RGB"), files["anomaly"])
    atomic_save(Image.fromarray(overlay, "RGB"), files["overlay"])
    atomic_save(Image.fromarray(mask, "L"), files["mask"])
    atomic_write_via(files["npz"], lambda p: np.savez_compressed(p, anomaly_map=amap.astype(np.float32)))


def detect_folder(
    inputs: Sequence[str | Path],
    maps: str | Path,
    *,
    threshold: float | None = None,
    scales: tuple[float, ...] | None = None,
    ensemble: int | str | None = None,
    weights: str | Path | Checkpoint | None = None,
    device: str = "auto",
    options: InferenceOptions | None = None,
    recursive: bool = False,
    force: bool = False,
    skip_existing: bool = False,
    on_outcome: Callable[[Outcome], None] | None = None,
    progress: Progress | None = None,
    shard: tuple[int, int] | None = None,
) -> list[Outcome]:
    """Map anomalies of ``inputs`` into the folder ``maps`` (:func:`map_files` names the files).

    ``threshold``, ``scales`` and ``ensemble`` (flips and rotations whose maps are averaged,
    :func:`~indeed_cli.tasks.detection.detect`) default to what the detector was calibrated with, and
    so does the precision where ``options`` ask for none (``precision=None``; ``options`` None).  Each Outcome's
    record holds the image score, whether it is anomalous (score above the threshold), the share of
    pixels above the pixel threshold (the detector's own, ``threshold`` where given) and the map files.
    Errors and ``shard`` as :func:`~indeed_cli.pipelines.denoise_folder`.
    """
    maps = Path(maps)
    if ensemble is not None:
        ensemble = ensemble_setting(ensemble)
    opts = options or InferenceOptions(precision=None)
    progress = progress or Progress()
    every = paths = expand_inputs(inputs, recursive)
    require_folder(maps, "--maps")
    plans = [map_files(maps, n) for n in input_names(inputs, paths, recursive)]
    paths, plans, skipped = skip_done(paths, plans, skip_existing, force, shard)
    models = ModelCache(weights, device, task="detect")
    progress.start(len(paths))

    def steps() -> Iterator[Product | Outcome]:
        # one reader on a CPU; on a GPU several (runner.reader_threads)
        for (src, img), files in zip(read_ahead_on(paths, models.device), plans):
            try:
                if isinstance(img, ImageError):
                    raise img
                ck = models.get(img.channels)
                t = threshold if threshold is not None else stored_threshold(ck)
                if t is None:
                    raise UsageError(f"{ck.source} stores no threshold; pass --threshold")
                # the map's pixels: at the pixel threshold where the image score is not the map's own
                tp = threshold if threshold is not None else stored_pixel_threshold(ck)
                use = scales or readout_scales(ck)
                n = ensemble or readout_ensemble(ck)
                own = readout_options(ck, opts)  # the detector's precision where none was asked for
                t0 = time.perf_counter()
                tiles = detect_tiles(ck, *img.size, own, use, n)
                note_large_image(progress, src.name, *img.size, img.channels, tiles)
                with progress.tiles(src.name, tiles) as advance:
                    det = detect(ck, img, own, progress=advance, scales=use, ensemble=n)
            except ImageError as e:
                yield Outcome(src, {"image": str(src)}, e)
                continue
            amap = det.anomaly_map
            record = {
                "image": str(src),
                "score": round(det.score, 6),
                "anomalous": bool(det.score > t),
                "threshold": t,
                "pixel_threshold": tp,
                "ensemble": n,
                "precision": resolve_precision(own.precision, models.device),
                "anomalous_fraction": round(float((amap > tp).mean()), 6),
                "maps": {k: str(v) for k, v in files.items()},
                "weights": ck.source,
                "seconds": round(time.perf_counter() - t0, 3),
            }
            yield Product(
                src, lambda a=(img, amap, tp, files): write_maps(*a), record, 20 * amap.nbytes
            )  # float64 overlay temporaries: ~80 bytes a pixel

    return run_ordered(steps(), on_outcome, skipped, shard=shard, inputs=every)
