"""`indeed adapt`: InDeedAG (one adaptation per folder) and InDeedOAG (one per image), then inference."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..pipelines import Outcome, adapt_folder
from ..tasks.adaptation import AdaptConfig
from .denoise import nearly_unchanged, pixel_shuffle_option, unchanged_phrase
from .options import FOLDER, INFERENCE, RunOptions, shared_options
from .runner import Reporter


@shared_options(*INFERENCE, *FOLDER, precision="auto")
def adapt_cmd(
    inputs: Annotated[
        list[str], typer.Argument(metavar="IMAGE", help="Out-of-distribution images: files, folders or globs.")
    ],
    output: Annotated[
        Path,
        typer.Option("--output", "-o", metavar="PATH", help="Output folder: <stem>.png and the decomposition files."),
    ],
    mode: Annotated[
        str,
        typer.Option("--mode", metavar="ag|oag", help="ag: adapt once on all inputs; oag: adapt on each image alone."),
    ] = "ag",
    modules: Annotated[
        str, typer.Option("--modules", metavar="S|L|LS", help="Module(s) to fine-tune: S, L or LS.")
    ] = "S",
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps",
            metavar="N",
            min=1,
            help="Most optimisation steps, early stopping may end sooner (default 20 for ag, 12 for oag).",
        ),
    ] = None,
    lr: Annotated[
        float | None, typer.Option("--lr", metavar="LR", help="Adam learning rate (default 1e-5 for ag, 3e-5 for oag).")
    ] = None,
    patience: Annotated[
        int | None,
        typer.Option(
            "--patience",
            metavar="N",
            min=0,
            help="Evaluations without improvement before stopping; 0: never (default 0 for ag, 6 for oag).",
        ),
    ] = None,
    max_change: Annotated[
        float,
        typer.Option(
            "--max-change",
            metavar="RMS",
            min=0.0,
            help="Trust region: stop when L + S has moved this much (RMS, 8-bit units); 0: none.",
        ),
    ] = AdaptConfig.max_change,
    first_change_ratio: Annotated[
        float,
        typer.Option(
            "--first-change-ratio",
            metavar="K",
            min=0.0,
            help="--decide change: an image keeps the plain result (or goes to the recorrupted objective) when the "
            "first evaluation moved its output by less than K times its starting residual.",
        ),
    ] = AdaptConfig.first_change_ratio,
    noise_bound: Annotated[
        float | None,
        typer.Option(
            "--noise-bound",
            metavar="K",
            min=0.0,
            help="Stop when the removed noise N exceeds K times the noise level estimated from the image "
            "(the discrepancy principle); 0: no bound (default 1.25 for oag, none for ag).",
        ),
    ] = None,
    min_change_ratio: Annotated[
        float | None,
        typer.Option(
            "--min-change-ratio",
            metavar="K",
            min=0.0,
            help="ag: an image keeps the adapted output only where it changed the image at least K times as much "
            "as the plain model's removal did, else its plain output; 0: every image adapted (default 2.5).",
        ),
    ] = None,
    image_noise_bound: Annotated[
        float | None,
        typer.Option(
            "--image-noise-bound",
            metavar="K",
            min=0.0,
            help="ag: ... and only where the adapted output removed at most K times the image's estimated noise "
            "level; 0: no such bound (default 1.25).",
        ),
    ] = None,
    stop_at_bound: Annotated[
        bool | None,
        typer.Option(
            "--stop-at-bound/--stop-at-evaluation",
            show_default=False,
            help="oag: where the trust region or the noise bound stops the adaptation between two evaluations, "
            "keep the weights interpolated to where the bound is met (default; the result does not jump with "
            "the evaluation grid) or the last evaluation inside it.",
        ),
    ] = None,
    noise_check: Annotated[
        bool | None,
        typer.Option(
            "--noise-check/--no-noise-check",
            show_default=False,
            help="Ask the bundled noise-presence detector first (default): an image in which it finds no noise "
            "keeps the plain result (oag: unadapted; ag: the folder is adapted on all its images, and not at all "
            "where none holds noise).",
        ),
    ] = None,
    objective: Annotated[
        str | None,
        typer.Option(
            "--objective",
            metavar="auto|elbo|recorrupted",
            help="elbo: the paper's objective; recorrupted: a self-supervised loss with noise drawn like the "
            "image's own (for correlated camera noise); auto (default): elbo, then recorrupted on images elbo "
            "left alone (oag: per image; ag: one adaptation on the images its gate admits, whose output an image "
            "takes where the per-image choice does not keep the elbo's).",
        ),
    ] = None,
    recorruption_noise: Annotated[
        str | None,
        typer.Option(
            "--recorruption-noise",
            metavar="signal|stationary",
            help="recorrupted objective: the level of the noise it draws follows the image's intensity "
            "(signal; oag default) or is one level per image (stationary; ag default).",
        ),
    ] = None,
    recorruption_level: Annotated[
        str,
        typer.Option(
            "--recorruption-level",
            metavar="rms|robust|quiet",
            help="recorrupted objective: the level of the noise it draws, the RMS of the noise estimate (rms, "
            "default), that of its quieter blocks (quiet: OAG loses less on textured photographs under light "
            "noise, a little on heavy smartphone noise) or a robust level read off its medians (robust).",
        ),
    ] = "rms",
    recorrupted_tile: Annotated[
        int | None,
        typer.Option(
            "--recorrupted-tile",
            metavar="N",
            min=0,
            help="recorrupted objective: the side of the tiles it adapts on (default: 64 for oag on a CPU, about "
            "2.5x faster there; otherwise and 0: the elbo's tiles, as on a GPU).",
        ),
    ] = None,
    recorrupted_steps: Annotated[
        int | None,
        typer.Option(
            "--recorrupted-steps",
            metavar="N",
            min=1,
            help="recorrupted objective: its steps, each with the learning rate scaled by 20/N (default: oag 18 "
            "on a GPU, else 20; 10: about a quarter less time per image on a GPU, 0.1-0.2 dB less gain).",
        ),
    ] = None,
    noise_precision: Annotated[
        str,
        typer.Option(
            "--noise-precision",
            metavar="image|pixel",
            help="image: one noise precision per image; pixel: the paper's pixel-wise Lambda.",
        ),
    ] = "image",
    decide: Annotated[
        str | None,
        typer.Option(
            "--decide",
            metavar="change|ood|always",
            help="Which images may change. change: an image keeps the plain result when the first steps move it "
            "less than --first-change-ratio times its residual noise (oag default); ood: adapt only images the "
            "OOD score flags; always (ag default).",
        ),
    ] = None,
    save_weights: Annotated[
        Path | None,
        typer.Option(
            "--save-weights",
            metavar="PATH",
            help="ag: write the adapted checkpoint here (auto: the elbo's; the recorrupted fallback is not written).",
        ),
    ] = None,
    group: Annotated[
        int | None,
        typer.Option(
            "--group",
            metavar="N",
            min=1,
            help="oag: images adapted at once, each with its own weights (default 32 on a GPU, 1 on a CPU).",
        ),
    ] = None,
    denoised_only: Annotated[
        bool,
        typer.Option(
            "--denoised-only",
            help="Write only <stem>.png, not the decomposition files (writing those takes longer than OAG on a GPU).",
        ),
    ] = False,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report",
            metavar="FILE.png",
            help="Plot each image's (l_rank, l_sparse) before and after "
            "adaptation over the training images' (the paper's Fig. 7).",
        ),
    ] = None,
    run: RunOptions = RunOptions(),
) -> None:
    """Active generalization: fine-tune one module on the inputs (l_fid + l_sparse), then denoise and decompose."""
    cfg = AdaptConfig(
        modules=modules,
        steps=steps,
        lr=lr,
        patience=patience,
        max_change=max_change,
        first_change_ratio=first_change_ratio,
        noise_bound=noise_bound,
        stop_at_bound=stop_at_bound,
        noise_check=noise_check,
        min_change_ratio=min_change_ratio,
        image_noise_bound=image_noise_bound,
        objective=objective,
        recorruption_noise=recorruption_noise,
        recorruption_level=recorruption_level,
        recorrupted_tile=recorrupted_tile,
        recorrupted_steps=recorrupted_steps,
        noise_precision=noise_precision,
        precision=run.precision,
        group=group,
        decide=decide,
    )
    reporter = Reporter(run.json_out, run.quiet)
    adapt_folder(
        inputs,
        output,
        mode=mode,
        config=cfg,
        save_weights=save_weights,
        denoised_only=denoised_only,
        report=report,
        **run.folder_run(reporter, skip_existing=False),
    )
    reporter.finish(no_noise_note(reporter.processed()), unadapted_note(reporter.processed()))


def no_noise_note(done: list[Outcome]) -> str:
    """One line for the images in which the noise-presence detector found no noise (Eq. noise presence): they
    kept the plain result, and --no-noise-check adapts them anyway."""
    clean = [o for o in done if o.record.get("stop") == "no noise found"]
    if not clean:
        return ""
    what = f"{clean[0].source.name}: " if len(clean) == 1 else f"{len(clean)} of {len(done)} images: "
    return what + "no noise found, plain result kept (--no-noise-check adapts anyway)"


def unadapted_note(done: list[Outcome]) -> str:
    """One line for the images adaptation left alone whose output is nearly the input
    (:func:`nearly_unchanged`): the plain model read their noise as signal and neither objective
    changed that, as on gray camera noise (docs/reports/2026-12-02-gray-camera-noise.md), so name the
    pixel-shuffle read-out of `indeed denoise`, the stride by the images' channels, and for colour
    images the camera-noise model."""
    quiet = [o for o in nearly_unchanged(done) if o.record.get("stop") != "no noise found"]  # no_noise_note's
    if not quiet:
        return ""
    what, it, looks, _ = unchanged_phrase(quiet, done, "was not adapted and ", "were not adapted and ")
    where = quiet[0].source if len(quiet) == 1 else "FOLDER"
    options = [f"`indeed denoise {where} -o DIR {pixel_shuffle_option(quiet)}`"]
    if any(o.record.get("channels") == 3 for o in quiet):  # the model trained on camera noise is colour
        options.append("--weights color-camera (trained on camera noise) instead of the pixel shuffle")
    return f"{what}: fine if {it} clean; if {looks} noisy, try {' or '.join(options)}"
