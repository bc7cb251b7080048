"""`indeed denoise`: L + S of each image, same size, mode, alpha and bit depth."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..io import JPEG_QUALITY, PNG_LEVEL, is_stdio, read_image
from ..model.registry import BUNDLED_CAMERA
from ..pipelines import Outcome, denoise_folder
from ..tasks.noise_presence import load_noise_detector, noise_found, noise_presence_score
from .options import ALL_SHARED, RunOptions, shared_options
from .runner import CLIError, Reporter


@shared_options(*ALL_SHARED)
def denoise_cmd(
    inputs: Annotated[
        list[str],
        typer.Argument(metavar="IMAGE", help="Image files, folders or glob patterns; - reads standard input."),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            metavar="PATH",
            help="Output file (one input) or folder; - writes a PNG to standard output.",
        ),
    ],
    auto_adapt: Annotated[
        bool,
        typer.Option(
            "--auto-adapt",
            help="Run InDeedOAG (indeed adapt --mode oag) on images the OOD score flags as out of distribution.",
        ),
    ] = False,
    ood_threshold: Annotated[
        float | None, typer.Option("--ood-threshold", metavar="SCORE", help="Override the checkpoint's OOD threshold.")
    ] = None,
    quality: Annotated[
        int, typer.Option("--quality", metavar="1-100", min=1, max=100, help="JPEG and WebP quality of -o FILE.jpg.")
    ] = JPEG_QUALITY,
    png_level: Annotated[
        int,
        typer.Option(
            "--png-level",
            metavar="0-9",
            min=0,
            max=9,
            help="zlib level of PNG outputs: 1 (default) encodes fast, 9 makes the smallest files; the pixels are "
            "the same at every level.",
        ),
    ] = PNG_LEVEL,
    pixel_shuffle: Annotated[
        str,
        typer.Option(
            "--pixel-shuffle",
            metavar="N|auto",
            help="Denoise the N x N pixel-shuffled sub-images one by one (N = 2: every second pixel), keeping "
            "the plain result where the two disagree strongly: for real camera noise, which is correlated "
            "between neighbouring pixels and left in place otherwise. auto: N = 2 on images whose removed "
            "noise is correlated, plain elsewhere. 1 (default): plain. N > 1 loses fine detail on clean or "
            "Gaussian-noise images (docs/guide/denoise.md).",
        ),
    ] = "1",
    ensemble: Annotated[
        str,
        typer.Option(
            "--ensemble",
            metavar="N",
            help="Average the read-outs of N flips and rotations of each image (self-ensemble: 2, 4 or 8): "
            "a little more quality at N times the time (docs/guide/denoise.md).",
        ),
    ] = "1",
    run: RunOptions = RunOptions(),
) -> None:
    """Denoise images with the InDeed posterior mean L + S (--json adds the OOD score)."""
    if is_stdio(output) and run.json_out:
        raise CLIError("--json and -o - both need standard output; write the image to a file")
    if is_stdio(output) and sys.stdout.isatty():
        raise CLIError("-o - writes a PNG to standard output, which is a terminal here; redirect or pipe it")
    report = Reporter(run.json_out, run.quiet)
    denoise_folder(
        inputs,
        output,
        auto_adapt=auto_adapt,
        ood_threshold=ood_threshold,
        quality=quality,
        png_level=png_level,
        pixel_shuffle=pixel_shuffle,
        ensemble=ensemble,
        **run.folder_run(report),
    )
    done = report.processed()
    report.finish(ood_warning(done), little_change_note(done), flat_kept_note(done))


# RMS change (8-bit grey levels) below which an output is "nearly the input": Gaussian noise of
# σ = 5 already changes an image by about 4; clean images change by 0.3-0.9, and so do real noisy
# photographs the OOD score does not flag (PolyU, RNI6: 0.09-0.63; docs/guide/denoise.md)
LITTLE_CHANGE = 1.0


def nearly_unchanged(done: list[Outcome]) -> list[Outcome]:
    """The images not adapted whose output is less than LITTLE_CHANGE grey levels (RMS) from the input."""
    return [
        o
        for o in done
        if o.record.get("change_rms") is not None  # None: output and input of different shapes
        and o.record["change_rms"] < LITTLE_CHANGE
        and not o.record.get("adapted")
    ]


def unchanged_phrase(quiet: list[Outcome], done: list[Outcome], one: str = "", many: str = "") -> tuple[str, ...]:
    """What a note says of the nearly unchanged images ``quiet`` of ``done``, and its words for them:
    (what, "it is" / "they are", "it looks" / "they look", "its" / "their"); ``one`` / ``many`` go
    before "changed" for a single image / several."""
    if len(quiet) == 1:
        rms = quiet[0].record["change_rms"]
        return f"{quiet[0].source.name} {one}changed by only {rms:.2g} grey levels (RMS)", "it is", "it looks", "its"
    what = f"{len(quiet)} of {len(done)} images {many}changed by less than {LITTLE_CHANGE:g} grey level (RMS)"
    return what, "they are", "they look", "their"


# nearly unchanged images little_change_note shows to the noise-presence detector, at most (each read again
# from its file: about 0.13 s for 512 x 512 on a 2-core CPU)
NOISE_CHECKED = 8


def noise_found_in(quiet: list[Outcome]) -> tuple[int, int]:
    """Of up to NOISE_CHECKED colour images of ``quiet`` that can be read again from their files, how many
    the noise-presence detector finds noise in (Eq. noise presence), and how many it checked."""
    found = checked = 0
    detector = load_noise_detector("cpu")
    for o in quiet:
        if detector is None or checked >= NOISE_CHECKED:
            break
        if o.record.get("channels") != 3 or is_stdio(str(o.source)) or not Path(o.source).is_file():
            continue
        try:
            score = noise_presence_score(read_image(o.source).data)  # the bundled score: both detectors
        except Exception:  # unreadable now: this note is advice, not a result
            continue
        if score is not None:
            checked += 1
            found += noise_found(score)
    return found, checked


def little_change_note(done: list[Outcome]) -> str:
    """One line when images that were not flagged came out nearly unchanged: nothing to do if they are
    clean, but real camera noise that the model reads as signal looks the same from here; so the colour
    ones are shown to the noise-presence detector, and the line says what it found."""
    quiet = [o for o in nearly_unchanged(done) if not o.record.get("ood")]
    if not quiet:
        return ""
    what, it, looks, its = unchanged_phrase(quiet, done)
    options = _alternatives(quiet)
    said = _detector_says(quiet)
    if said:
        where, share = said
        if not share:
            return f"{what}, and the noise-presence detector finds no noise in {where}: nothing to remove"
        signal = "which the model reads as signal"
        return f"{what}, but the noise-presence detector finds noise in {share}, {signal}: try {options}"
    return f"{what}: fine if {it} clean; if {looks} noisy, {its} noise is unlike Gaussian noise: try {options}"


def _detector_says(images: list[Outcome]) -> tuple[str, str] | None:
    """What the noise-presence detector found in ``images`` (:func:`noise_found_in`), as the notes word it:
    None where it checked none, else (the images it checked, those it found noise in; "" for none): ("it",
    "it") for one image, ("the 3 it checked", "1 of 3 it checked") or ("8 it checked", "") for several."""
    found, checked = noise_found_in(images)
    if not checked:
        return None
    if len(images) == 1:
        return "it", "it" if found else ""
    where = f"the {checked} it checked" if checked == len(images) else f"{checked} it checked"
    return where, f"{found} of {checked} it checked" if found else ""


def _alternatives(images: list[Outcome], first: tuple[str, ...] = ()) -> str:
    """What to run on these images instead, as one phrase: ``first``, the `indeed adapt` command
    (OAG for one image, AG for several; on real phone noise it gained 5.6-7.2 dB, docs/results.md),
    the pixel-shuffle read-out (unless it was used; named first for gray images, whose camera noise
    adaptation hardly removes: docs/guide/adapt.md), and the camera-noise model for a colour image
    denoised with another model (weights/README.md)."""
    options = list(first)
    if len(images) == 1:
        adapt = f"`indeed adapt {images[0].source} --mode oag -o DIR`"
    else:
        adapt = "`indeed adapt FOLDER --mode ag -o DIR` (one camera)"
    shuffle = [pixel_shuffle_option(images)] if all(o.record.get("pixel_shuffle", 1) == 1 for o in images) else []
    gray = all(o.record.get("channels") == 1 for o in images)
    options += shuffle + [adapt] if gray else [adapt] + shuffle
    if any(o.record.get("channels") == 3 and Path(str(o.record.get("weights"))).name != BUNDLED_CAMERA for o in images):
        options.append("--weights color-camera (trained on camera noise)")
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]


# The share of the flattest regions' variance an output may keep before `indeed denoise` says so
# (flat_region_kept): on development crops Gaussian noise of σ = 15-50 left at most 5% of the crops
# at 0.5 or more, synthetic camera noise 88-100% (light to heavy), a SIDD phone image 0.88, clean crops
# 0.79-1.0 (docs/reports/2026-12-04-noise-left-in-flat-regions.md)
FLAT_KEPT_NOTE = 0.5


def flat_kept_note(done: list[Outcome]) -> str:
    """One line for the images neither flagged, adapted nor nearly unchanged whose output kept at
    least FLAT_KEPT_NOTE of the variance of their flattest regions (``flat_kept``): clean or
    textured there, or noise the model read as texture, as real phone noise often is (a SIDD image
    changed by 7.6 grey levels and kept 88% there: OAG then gained 8 dB)."""
    quiet = set(map(id, nearly_unchanged(done)))
    kept = [
        o
        for o in done
        if id(o) not in quiet
        and not o.record.get("ood")
        and not o.record.get("adapted")
        and (o.record.get("flat_kept") or 0.0) >= FLAT_KEPT_NOTE
    ]
    if not kept:
        return ""
    if len(kept) == 1:
        r = kept[0].record
        what = (
            f"{kept[0].source.name} kept {r['flat_kept']:.0%} of the variance of its flattest regions "
            f"({r['flat_rms']:.2g} grey levels RMS there)"
        )
        it, looks = "it is", "it looks"
    else:
        share = f"{FLAT_KEPT_NOTE:.0%}"
        what = f"{len(kept)} of {len(done)} images kept at least {share} of the variance of their flattest regions"
        it, looks = "they are", "they look"
    hint = f"if {looks} noisy, the model read the noise as texture: try {_alternatives(kept)}"
    return f"{what}: fine if {it} clean or textured there; {hint}"


# The stride to name, by the images' channels.  Camera noise averaged to gray is correlated over two
# pixels (lag-1 correlation 0.65, lag 2 0.17, lag 3 0.01 for the camera-noise model's gray images), so
# stride 2's sub-images still hold some of it: on gray development crops under heavy camera noise
# stride 3 gained +1.39 / +7.16 dB over plain (Urban100/Set14 / wallpaper) against +0.76 / +1.96 for 2,
# and held it on held-out crops (+1.47 / +5.73 against +0.81 / +1.71; docs/reports/2026-12-02-gray-camera-noise.md).
# In colour the model separates the channels' noise and 2 is the measured stride (docs/guide/denoise.md).
SUGGESTED_PIXEL_SHUFFLE = {1: 3, 3: 2}


def pixel_shuffle_option(images: list[Outcome]) -> str:
    """``--pixel-shuffle N`` for these images: 3 for gray ones, 2 for colour ones, both named for a mix."""
    strides = {SUGGESTED_PIXEL_SHUFFLE.get(o.record.get("channels"), 2) for o in images}
    if len(strides) == 1:
        return f"--pixel-shuffle {strides.pop()}"
    return f"--pixel-shuffle {SUGGESTED_PIXEL_SHUFFLE[3]} ({SUGGESTED_PIXEL_SHUFFLE[1]} for the gray ones)"


def ood_warning(done: list[Outcome]) -> str:
    """One line when images were flagged as out of distribution and left unadapted: their noise
    (real camera noise, say) is unlike the training noise and may be left largely in place; unless the
    noise-presence detector finds no noise in the colour ones it checked (photographs without noise can
    look unlike the training images too)."""
    flagged = [o for o in done if o.record.get("ood") and not o.record.get("adapted")]
    if not flagged:
        return ""
    threshold = flagged[0].record["ood_threshold"]
    if len(flagged) == 1:
        o = flagged[0]
        score = o.record["ood_score"]
        what = f"{o.source.name} looks unlike the training images (OOD score {score:.3g} > {threshold:.3g})"
    else:
        what = f"{len(flagged)} of {len(done)} images look unlike the training images (OOD score > {threshold:.3g})"
    options = _alternatives(flagged, ("--auto-adapt",))
    said = _detector_says(flagged)  # the colour ones, as little_change_note does
    if said:
        where, share = said
        if not share:
            return f"{what}, but the noise-presence detector finds no noise in {where}: nothing to remove"
        left = "it may be left in place"
        return f"{what}, and the noise-presence detector finds noise in {share}: {left}; rerun with {options}"
    return f"{what}: real camera noise, say, may be left in place; rerun with {options}"
