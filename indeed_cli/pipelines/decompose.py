"""Decompose files and folders: L, S, N and the leaf posteriors of each image, as PNGs, npz and json."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from ..inference import Decomposed, InferenceOptions, decompose, n_tiles
from ..io import ImageError, LoadedImage, atomic_save, atomic_write_via, to_pil
from ..model import Checkpoint
from ..tasks.ood import ood_features, ood_report
from .inputs import UsageError, expand_inputs, input_names, require_folder, skip_done
from .runner import ModelCache, Outcome, Product, Progress, note_large_image, read_ahead, run_ordered
from .visualize import panel, views

PNG_MAPS = ("L", "S", "N", "mu_omega", "mu_lambda", "sigma_L", "sigma_S")
# tiles overlap by half a tile: L is low rank per tile, and a wider blend hides the tile grid in the
# maps (denoising keeps 32, where the grid does not show in L + S)
DECOMPOSE_OVERLAP = 64
PANEL_NOTE = (
    "L is low rank within each\ntile of the model (128 px by\ndefault), blended where tiles\n"
    "overlap. Values in image\nunits (0-255 for 8 bits)."
)


def outputs_for(out_dir: Path, name: str, with_panel: bool) -> dict[str, Path]:
    """The files one decomposed image is written to: ``<name>_<map>.png``, ``<name>.npz``, ``<name>.json``."""
    files = {k: out_dir / f"{name}_{k}.png" for k in PNG_MAPS}
    files["npz"] = out_dir / f"{name}.npz"
    files["json"] = out_dir / f"{name}.json"
    if with_panel:
        files["panel"] = out_dir / f"{name}_panel.png"
    return files


def write_decomposition(
    src: Path,
    img: LoadedImage,
    dec: Decomposed,
    files: dict[str, Path],
    with_panel: bool,
    source: str,
    ood: dict | None = None,
    npz_precision: str = "float32",
    npz_compress: bool = False,
) -> dict:
    """Write the PNG maps, npz and json of one decomposed image; returns the json record.

    ``ood`` is the checkpoint's OOD statistics (``extra["ood"]``), None when it has none;
    ``npz_precision`` "float32" or "float16", ``npz_compress`` zlib for the npz.
    """
    arrays = dec.in_scale(img.scale)
    shown = views({**dec.maps, "N": arrays["N"] / img.scale}, img.scale)
    for k in PNG_MAPS:
        atomic_save(to_pil(shown[k].image), files[k])
    # uncompressed by default: the float maps are noisy, zlib saved ~20% of the size for ~0.8 s per
    # 512x512 image; float16 halves the file (L + S + N == Y then holds to float16 rounding)
    if npz_precision == "float16":
        arrays = {k: v.astype(np.float16) for k, v in arrays.items()}
    save = np.savez_compressed if npz_compress else np.savez
    atomic_write_via(files["npz"], lambda t: save(t, **arrays))
    record = {
        "image": str(src),
        "height": img.size[0],
        "width": img.size[1],
        "channels": img.channels,
        "scale": img.scale,
        **dec.stats(),
        **ood_report(ood_features(dec), ood),
        "loss_units": "per pixel (per element of Y)",
        "weights": source,
        "outputs": {k: str(v) for k, v in files.items()},
    }
    if with_panel and "panel" in files:
        title = f"{src.name}  (rank index n = {record['rank_index']:.0f} of {dec.tiles['mu_gamma'].shape[-1]})"
        note = PANEL_NOTE
        gamma = (dec.tiles["mu_gamma"], dec.tiles["counted"]) if "counted" in dec.tiles else None
        figure = panel(dec.Y, dec.maps["L"] + dec.maps["S"], shown, title, note, img.scale, gamma)
        atomic_save(figure, files["panel"])
    atomic_write_via(files["json"], lambda t: Path(t).write_text(json.dumps(record, indent=2)))
    return record


def decompose_folder(
    inputs: Sequence[str | Path],
    output: str | Path,
    *,
    with_panel: bool = False,
    npz_precision: str = "float32",
    npz_compress: bool = False,
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
    """Decompose ``inputs`` into the folder ``output`` (:func:`outputs_for` names the files; with
    ``recursive`` the sub-folders of folder inputs are mirrored).

    One :class:`Outcome` per input; its record is the image's json file without the per-tile rank
    indices.  Errors and ``shard`` as :func:`~indeed_cli.pipelines.denoise_folder`.
    """
    if npz_precision not in ("float32", "float16"):
        raise UsageError(f"--npz-precision must be float32 or float16, got {npz_precision!r}")
    output = Path(output)
    opts = options or InferenceOptions(overlap=DECOMPOSE_OVERLAP)
    progress = progress or Progress()
    every = paths = expand_inputs(inputs, recursive)
    require_folder(output, "--output")
    plans = [outputs_for(output, n, with_panel) for n in input_names(inputs, paths, recursive)]
    paths, plans, skipped = skip_done(paths, plans, skip_existing, force, shard)
    models = ModelCache(weights, device, job="decompose")  # colour: color-rank, whose n follows the image
    progress.start(len(paths))

    def steps() -> Iterator[Product | Outcome]:
        for (src, img), files in zip(read_ahead(paths), plans):
            try:
                if isinstance(img, ImageError):
                    raise img
                ckpt = models.get(img.channels)
                note_large_image(progress, src.name, *img.size, img.channels, n_tiles(*img.size, opts))
                with progress.tiles(src.name, n_tiles(*img.size, opts)) as advance:
                    dec = decompose(ckpt, img, opts, progress=advance)
            except ImageError as e:
                yield Outcome(src, {"image": str(src)}, e)
                continue

            def write(src=src, img=img, dec=dec, files=files, ckpt=ckpt) -> dict:
                record = write_decomposition(
                    src, img, dec, files, with_panel, ckpt.source, ckpt.extra.get("ood"), npz_precision, npz_compress
                )
                return {k: v for k, v in record.items() if k != "rank_index_per_tile"}

            yield Product(src, write, {}, sum(v.nbytes for v in dec.maps.values()))

    return run_ordered(steps(), on_outcome, skipped, shard=shard, inputs=every)
