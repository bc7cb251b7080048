"""Denoise files and folders: L + S of each image, same size, mode, alpha and bit depth.

Every image is also scored for being out of distribution (:mod:`indeed_cli.tasks.ood`) when the
checkpoint carries OOD statistics; the score comes from per-tile terms that the network computes
anyway.  With ``auto_adapt=True`` the images flagged so are adapted one by one (InDeedOAG, in groups
on a GPU) before they are denoised again and written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from ..inference import (
    InferenceOptions,
    ShuffledReadout,
    denoise,
    denoise_with_stats,
    ensemble_mean,
    n_tiles,
    pixel_shuffle_denoise,
    pixel_shuffle_fits,
)
from ..io import JPEG_QUALITY, PNG_LEVEL, ImageError, check_output_format, write_image
from ..model import Checkpoint, CheckpointError
from ..tasks.adaptation import AdaptConfig, adapt_images, default_group, oag_readout
from ..tasks.adaptation.config import FLAT_BLOCK, FLAT_SHARE
from ..tasks.adaptation.recorrupted import flat_block_covariances
from ..tasks.ood import ood_features, ood_report
from .inputs import UsageError, ensemble_setting, expand_inputs, input_names, pixel_shuffle_setting, plan_outputs
from .runner import (
    ModelCache,
    Outcome,
    Product,
    Progress,
    note_large_image,
    read_ahead_on,
    run_ordered,
)


def denoise_folder(
    inputs: Sequence[str | Path],
    output: str | Path,
    *,
    weights: str | Path | Checkpoint | None = None,
    device: str = "auto",
    options: InferenceOptions | None = None,
    auto_adapt: bool = False,
    ood_threshold: float | None = None,
    quality: int = JPEG_QUALITY,
    png_level: int = PNG_LEVEL,
    recursive: bool = False,
    force: bool = False,
    skip_existing: bool = False,
    on_outcome: Callable[[Outcome], None] | None = None,
    progress: Progress | None = None,
    shard: tuple[int, int] | None = None,
    pixel_shuffle: int | str = 1,
    ensemble: int = 1,
) -> list[Outcome]:
    """Denoise ``inputs`` (files, folders, globs, ``-``) into ``output``: a file for one input (its
    suffix says the format; ``quality`` for JPEG and WebP, ``png_level`` the zlib level 0-9 of PNGs),
    else a folder of ``<name>.png`` (with ``recursive``, the sub-folders of folder inputs are
    mirrored); ``-``: a PNG on standard output.
    Returns one :class:`Outcome` per input: those left out by ``skip_existing`` first, then the
    others as they finish.  Each record holds the OOD score of the image (``ood`` true when it lies
    outside the training data) and, when it was adapted, how.

    Raises :class:`~indeed_cli.pipelines.UsageError` (bad inputs or outputs, before any work) and
    :class:`~indeed_cli.model.CheckpointError`; an image that cannot be read or written is a failed
    Outcome and the others go on.  ``shard`` (K, N): only every N-th input from the K-th, for one of
    N processes that share the work (their outputs together are those of one run).
    ``pixel_shuffle`` s > 1 reads each image out on its s x s pixel-shuffled sub-images, "auto" where
    the noise looks correlated (:func:`~indeed_cli.inference.pixel_shuffle_denoise`): for real camera
    noise; s > 1 costs fine detail on other images.  The records say which read-out each image got.
    ``ensemble`` 2, 4 or 8: each output is the mean of the read-outs of that many flips and rotations
    of the image (:func:`~indeed_cli.inference.ensemble_mean`), at that many times the time.
    """
    if not 0 <= png_level <= 9:  # refused before any work, not when the first image is written
        raise UsageError(f"png_level must be a zlib level 0-9, got {png_level}")
    pixel_shuffle = pixel_shuffle_setting(pixel_shuffle)
    ensemble = ensemble_setting(ensemble)
    opts = options or InferenceOptions()
    progress = progress or Progress()
    every = expand_inputs(inputs, recursive)
    names = input_names(inputs, every, recursive)
    paths, targets, skipped = plan_outputs(every, Path(output), ".png", force, skip_existing, names, shard)
    models = ModelCache(weights, device)
    progress.start(len(paths))
    encoding = {"quality": quality, "png_level": png_level}
    steps = _steps(paths, targets, models, opts, auto_adapt, ood_threshold, encoding, progress, pixel_shuffle, ensemble)
    return run_ordered(steps, on_outcome, skipped, shard=shard, inputs=every)


def change_rms(noisy, out) -> float | None:
    """RMS difference between an input and its output in 8-bit grey levels: about σ for Gaussian noise
    of σ ≥ 5 (the model removes it), under 1 for a clean image, and under 1 too for a photograph
    whose real noise the model reads as signal (PolyU, RNI6: 0.09–0.63)."""
    a, b = np.asarray(noisy, dtype=np.float32), np.clip(np.asarray(out, dtype=np.float32), 0.0, 1.0)  # as written
    if a.shape != b.shape:
        return None
    return round(float(np.sqrt(np.mean(np.square(a - b)))) * 255.0, 3)


def flat_region_kept(noisy, out) -> tuple[float, float] | None:
    """How much of the variation of the image's flattest regions the output kept: in the FLAT_SHARE
    of its FLAT_BLOCK x FLAT_BLOCK blocks where the output varies least, the output's variance over
    the input's (Eq. flat-block channel covariance, its activity, with R = Y - X), and the input's
    RMS variation there in 8-bit grey levels.  About 0 for Gaussian noise of σ ≥ 15, which the model
    removes; 0.5-0.9 for camera noise it reads as texture (a SIDD phone image: 0.88, 29 grey levels);
    about 1 for a clean image, where there was nothing to remove (docs/guide/denoise.md); the share
    is None where the input varies by less than STILL_RMS there.  None for an image smaller than a
    block, or output and input of different shapes."""
    a, b = np.asarray(noisy, dtype=np.float32), np.clip(np.asarray(out, dtype=np.float32), 0.0, 1.0)  # as written
    if a.shape != b.shape:
        return None
    Y = torch.from_numpy(a if a.ndim == 3 else a[None])
    stats = flat_block_covariances(Y, Y - torch.from_numpy(b if b.ndim == 3 else b[None]), FLAT_BLOCK, FLAT_SHARE)
    if stats is None:
        return None
    C_y, _, kept, _ = stats
    rms = float(C_y.trace() / C_y.shape[0]) ** 0.5 * 255.0
    # regions that do not vary (saturated, synthetic) have no share to speak of: nothing to remove there
    return (round(kept, 3) if rms >= STILL_RMS else None), round(rms, 2)


STILL_RMS = 0.25  # grey levels: flattest regions varying less than this (below 8-bit rounding's 0.29) are still


def _steps(
    paths: list[Path],
    targets: list[Path],
    models: ModelCache,
    opts: InferenceOptions,
    auto_adapt: bool,
    ood_threshold: float | None,
    encoding: dict[str, int],  # write_image's quality and png_level
    progress: Progress,
    pixel_shuffle: int | str = 1,
    ensemble: int = 1,
) -> Iterator[Product | Outcome]:
    pending: list[dict] = []  # flagged images waiting for one batched OAG

    def product(item: dict, out, adapted=None) -> Product:
        img = item["img"]
        record = {
            "image": str(item["src"]),
            "output": str(item["dst"]),
            "height": img.size[0],
            "width": img.size[1],
            "channels": img.channels,
            "bit_depth": img.bit_depth,
            "seconds": round(item["seconds"], 3),
            "weights": item["ckpt"].source,
            # filled in by write(), on a writer thread: on a GPU these host-side statistics took longer than
            # the read-out beside the PNG writers (docs/reports/2026-12-07-oag-cli-time.md)
            "change_rms": None,
            "flat_kept": None,
            "flat_rms": None,
            "pixel_shuffle": item["stride"],
            "ensemble": ensemble,
            **({"noise_correlation": item["correlation"]} if pixel_shuffle == "auto" else {}),
            **item["ood"],
            "adapted": None if adapted is None else {"best_step": adapted.best_step, "stop": adapted.stop},
        }

        def write() -> dict:
            write_image(item["dst"], out, like=img, **encoding)
            kept = flat_region_kept(img.data, out) or (None, None)
            return {"change_rms": change_rms(img.data, out), "flat_kept": kept[0], "flat_rms": kept[1]}

        return Product(item["src"], write, record, out.nbytes)

    def adapt_pending() -> Iterator[Product]:
        """OAG on the flagged images, those sharing a checkpoint adapted together."""
        if not pending:
            return
        progress.note(f"adapting to {len(pending)} image(s) flagged as out of distribution")
        t0 = time.perf_counter()
        for item in pending:  # adapted from the adapt default unless weights were named; the record says which
            item["ckpt"] = models.get(item["img"].channels, job="adapt")
        results, _ = adapt_images(
            [(it["ckpt"], it["img"].data) for it in pending], AdaptConfig(precision=opts.precision or "fp32"), opts.tile
        )
        share = (time.perf_counter() - t0) / len(pending)
        readout = oag_readout(opts, models.device)
        for item, res in zip(pending, results):
            t1 = time.perf_counter()
            out = denoise(
                res.checkpoint, item["img"], readout, clip=False, pixel_shuffle=item["stride"], ensemble=ensemble
            )
            item["seconds"] += share + time.perf_counter() - t1
            yield product(item, out, res)
        pending.clear()

    # one reader on a CPU; on a GPU several, as decoding bounds a folder run (runner.reader_threads)
    for (src, img), dst in zip(read_ahead_on(paths, models.device), targets):
        try:
            if isinstance(img, ImageError):
                raise img
            check_output_format(dst, img)
            # checked before any read-out, so that such an image costs nothing and gets this line
            if not pixel_shuffle_fits(img.size[1], img.size[0], pixel_shuffle):
                raise ImageError(f"{src}: {img.size[0]}x{img.size[1]} is too small for --pixel-shuffle {pixel_shuffle}")
        except ImageError as e:
            yield Outcome(src, {"image": str(src)}, e)
            continue
        ckpt = models.get(img.channels)
        stats = ckpt.extra.get("ood")
        if auto_adapt and not stats:
            raise CheckpointError(
                f"automatic adaptation needs OOD statistics, and {ckpt.source} has none "
                "(add them with `indeed calibrate`)"
            )
        if stats and ood_threshold is not None:
            stats = {**stats, "threshold": ood_threshold}
        t0 = time.perf_counter()
        tiles = n_tiles(*img.size, opts, pixel_shuffle, ensemble)
        note_large_image(progress, src.name, *img.size, img.channels, tiles)
        with progress.tiles(src.name, tiles) as advance:
            out, tile_stats = denoise_with_stats(ckpt, img, opts, progress=advance)
            shuffled = None
            if pixel_shuffle != 1:
                shuffled = pixel_shuffle_denoise(ckpt, img, pixel_shuffle, opts, advance, plain=out)
                out = shuffled.image
            out = ensemble_mean(ckpt, img.data, shuffled or ShuffledReadout(out, 1, None), ensemble, opts, advance)
        item = {
            "src": src,
            "dst": dst,
            "img": img,
            "ckpt": ckpt,
            "ood": ood_report(ood_features(tile_stats), stats),
            "stride": shuffled.stride if shuffled else 1,
            "correlation": None
            if shuffled is None or shuffled.noise_correlation is None
            else round(shuffled.noise_correlation, 4),
            "seconds": time.perf_counter() - t0,
        }
        if auto_adapt and item["ood"]["ood"]:
            pending.append(item)  # written once adapted, in groups on a GPU
            if len(pending) >= default_group(models.device):
                yield from adapt_pending()
        else:
            yield product(item, out)
    yield from adapt_pending()
