"""Score the model: denoising PSNR/SSIM (synthetic AWGN or real noisy/clean pairs) and anomaly
detection AUROC/AP against masks, per image and summarised."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..inference import InferenceOptions, ensemble_mean, pixel_shuffle_denoise
from ..io import ImageError, load_mask, read_image
from ..metrics import add_awgn, detection_metrics, image_seed, psnr, ssim
from ..model import Checkpoint
from ..tasks.camera_noise import LEVELS, camera_pair, parse_noise
from ..tasks.detection import detect, stored_threshold
from .inputs import UsageError, ensemble_setting, expand_inputs, pixel_shuffle_setting
from .runner import ModelCache

Row = Callable[[dict], None]


def noisy_clean_pairs(noisy: list[Path], clean_dir: Path, pattern: str) -> list[tuple[Path, Path]]:
    """Each noisy image with its clean reference in ``clean_dir``: the file whose stem is the noisy
    stem with ``pattern`` ("noisy:clean", e.g. "_real:_mean") substituted."""
    src, dst = (pattern.split(":", 1) + [""])[:2]
    out = []
    for p in noisy:
        name = p.stem.replace(src, dst) if src else p.stem
        cands = [q for q in clean_dir.iterdir() if q.stem == name]
        if not cands:
            raise UsageError(f"no clean reference for {p.name} in {clean_dir} (looked for stem {name!r})")
        out.append((p, cands[0]))
    return out


def noise_usage(spec: str) -> str:
    """The one line for an unknown ``--noise``: both forms it takes, and ``--sigma`` where the spec looks
    like Gaussian noise with a level (``gauss:15``, ``awgn:15``)."""
    kind, _, level = spec.partition(":")
    hint = (
        f"; for AWGN of sigma {level} use --noise awgn --sigma {level}"
        if kind in ("awgn", "gauss", "gaussian") and level
        else ""
    )
    forms = f"awgn (sigma from --sigma) or camera:LEVEL[+mhc][+jpeg] with LEVEL one of {sorted(LEVELS)}"
    return f"--noise must be {forms}, got {spec!r}{hint}"


def evaluate_denoise(
    clean: Sequence[str | Path],
    *,
    sigmas: Sequence[float] = (25.0,),
    clipped8: bool = False,
    noisy: str | Path | None = None,
    pair: str = "",
    limit: int = 0,
    noise: str = "awgn",
    weights: str | Path | Checkpoint | None = None,
    device: str = "auto",
    options: InferenceOptions | None = None,
    on_row: Row | None = None,
    pixel_shuffle: int | str = 1,
    ensemble: int = 1,
) -> list[dict]:
    """PSNR/SSIM of :func:`~indeed_cli.denoise` per image, then one summary row per sigma.

    Synthetic mode: ``clean`` images with seeded AWGN of each sigma (8-bit units; ``clipped8``:
    the noisy image clipped and quantised like an 8-bit file), or with ``noise="camera:LEVEL"``
    (:mod:`indeed_cli.tasks.camera_noise`) seeded camera noise, scored against the same camera's
    image without noise; ``sigma`` is then the level's name.  Paired mode (``noisy`` a folder):
    ``clean`` is one folder of references, matched by ``pair`` (:func:`noisy_clean_pairs`).
    An unreadable image raises ImageError: a score over fewer images would mislead.
    ``pixel_shuffle``, ``ensemble``: the read-out of :func:`~indeed_cli.denoise` (``indeed denoise
    --pixel-shuffle``, ``--ensemble``).
    """
    pixel_shuffle = pixel_shuffle_setting(pixel_shuffle)
    ensemble = ensemble_setting(ensemble)
    opts = options or InferenceOptions()
    models = ModelCache(weights, device)
    if noisy is not None:
        if len(clean) != 1 or not Path(clean[0]).is_dir():
            raise UsageError("paired mode takes one clean folder as the argument and --noisy FOLDER")
        noisy_paths = expand_inputs([noisy])
        if pair:
            noisy_paths = [p for p in noisy_paths if pair.split(":")[0] in p.stem]
        jobs = [(n, c, None) for n, c in noisy_clean_pairs(noisy_paths, Path(clean[0]), pair)]
    elif noise != "awgn":
        try:
            level, jpeg, demosaic = parse_noise(noise)
        except ValueError:
            raise UsageError(noise_usage(noise)) from None
        jobs = [(None, c, noise) for c in expand_inputs(clean)]
    else:
        jobs = [(None, c, s) for s in sigmas for c in expand_inputs(clean)]
    if limit:
        levels = sorted({j[2] for j in jobs}, key=str) if noisy is None else [None]
        jobs = [j for lv in levels for j in [x for x in jobs if x[2] == lv][:limit]]
    rows: list[dict] = []
    for noisy_path, clean_path, s in jobs:
        ref = read_image(clean_path)
        target = ref.data
        if isinstance(s, str):  # camera noise: scored against the camera's noiseless image
            y, target = camera_pair(
                ref.data, level, image_seed(clean_path.name, 0, zlib.crc32(s.encode())), jpeg, demosaic
            )
        elif noisy_path is None:
            y = add_awgn(ref.data, s, image_seed(clean_path.name, s), clipped8)
        else:
            y = read_image(noisy_path).data
            if y.shape != ref.data.shape:
                raise ImageError(f"{noisy_path}: size {y.shape} differs from its reference {ref.data.shape}")
        ckpt = models.get(ref.channels)
        t0 = time.perf_counter()
        read = pixel_shuffle_denoise(ckpt, y, pixel_shuffle, opts)  # stride 1: the plain read-out
        out = np.clip(ensemble_mean(ckpt, y, read, ensemble, opts), 0.0, 1.0)
        score = ssim(out, target)
        row = {
            "image": str(noisy_path or clean_path),
            "sigma": s,
            "clipped8": clipped8 if s is not None and not isinstance(s, str) else None,
            "psnr_in": round(psnr(y, target), 3),
            "psnr": round(psnr(out, target), 3),
            "ssim": None if score is None else round(score, 4),
            "seconds": round(time.perf_counter() - t0, 3),
            **({"pixel_shuffle": read.stride} if pixel_shuffle != 1 else {}),
            **({"ensemble": ensemble} if ensemble != 1 else {}),
        }
        rows.append(row)
        if on_row:
            on_row(row)
    summary = []
    for s in sorted({r["sigma"] for r in rows}, key=lambda v: (v is None, str(v) if isinstance(v, str) else v)):
        rs = [r for r in rows if r["sigma"] == s]
        ss = [r["ssim"] for r in rs if r["ssim"] is not None]
        summary.append(
            {
                "summary": True,
                "sigma": s,
                "n": len(rs),
                "psnr": round(float(np.mean([r["psnr"] for r in rs])), 3),
                "ssim": round(float(np.mean(ss)), 4) if ss else None,
                "psnr_in": round(float(np.mean([r["psnr_in"] for r in rs])), 3),
            }
        )
    return summary


def evaluate_detect(
    inputs: Sequence[str | Path],
    *,
    mask_suffix: str = ".png",
    weights: str | Path | Checkpoint | None = None,
    device: str = "auto",
    options: InferenceOptions | None = None,
    recursive: bool = False,
    on_row: Row | None = None,
    ensemble: int | str | None = None,
) -> list[dict]:
    """Pixel AUROC/AP and image AUROC of :func:`~indeed_cli.tasks.detection.detect` over images whose
    masks lie beside them (no mask: a normal image), for all images and per folder, with how many
    anomalous and normal images the checkpoint's stored threshold flags.  ``ensemble``: the read-out
    of ``indeed detect --ensemble N`` (default: the detector's calibrated one), and the precision where
    ``options`` ask for none (as :func:`~indeed_cli.pipelines.detect_folder`).  Returns the summary rows."""
    if ensemble is not None:
        ensemble = ensemble_setting(ensemble)
    opts = options or InferenceOptions(precision=None)
    models = ModelCache(weights, device, task="detect")
    mask_suffix = mask_suffix.lower()
    paths = expand_inputs(inputs, recursive)
    # a mask file is not an input: drop X.png when X.<other> is also an input
    stems = {(p.parent, p.stem) for p in paths if p.suffix.lower() != mask_suffix}
    images = [p for p in paths if not (p.suffix.lower() == mask_suffix and (p.parent, p.stem) in stems)]
    maps, masks, scores, labels, groups, flagged = [], [], [], [], [], []
    for p in images:
        img = read_image(p)
        ck = models.get(img.channels)
        det = detect(ck, img, opts, ensemble=ensemble)
        t = stored_threshold(ck)
        try:
            mask = load_mask(p, det.anomaly_map.shape, mask_suffix)
        except ValueError as e:
            raise ImageError(str(e)) from None
        maps.append(det.anomaly_map)
        masks.append(mask)
        scores.append(det.score)
        labels.append(bool(mask.any()))
        groups.append(p.parent.name)
        flagged.append(None if t is None else bool(det.score > t))
        if on_row:
            on_row(
                {
                    "image": str(p),
                    "score": round(det.score, 6),
                    "anomalous": flagged[-1],
                    "anomalous_gt": bool(mask.any()),
                }
            )
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
    return summary
