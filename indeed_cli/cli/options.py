"""Options that several commands share, and their checks."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import typer

from ..inference import InferenceOptions
from ..pipelines import parse_shard, shard_from_env
from ..tasks.detection import MEMORY_ENTRIES
from .runner import CLIError, Reporter

Weights = Annotated[
    str | None,
    typer.Option(
        "--weights",
        "-w",
        metavar="CHECKPOINT",
        help="Checkpoint: bundled name (color-fullchroma, color, gray, ...), a .safetensors path, or "
        "hf://owner/repo/file.safetensors@revision. Default: the bundled model for the image's channels "
        "(colour: color-fullchroma to denoise, color-rank to decompose, color to adapt).",
    ),
]
Device = Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N.")]
MemoryEntries = Annotated[
    int | None,
    typer.Option(
        "--memory-entries",
        metavar="N",
        min=1,
        help="detect: the most entries a detector's memory of normal features keeps (PatchCore's greedy "
        "coreset; calibrate: with --memory; train: filled from at most 2,000 training images after training). "
        f"More finds more and reads out slower. Default {MEMORY_ENTRIES:,}.",
    ),
]
MemoryBits = Annotated[
    int | None,
    typer.Option(
        "--memory-bits",
        metavar="8|4",
        help="detect: the bits per value the file stores its memory's bank in (calibrate: the memory --memory "
        "fills, else the one the detector has). 4 holds twice the entries in the same bytes, a little less "
        "exactly. Default 8.",
    ),
]
Tile = Annotated[int, typer.Option("--tile", metavar="PIXELS", min=16, help="Tile size in pixels (multiple of 8).")]
Overlap = Annotated[int, typer.Option("--overlap", metavar="PIXELS", min=0, help="Overlap between tiles in pixels.")]
Batch = Annotated[
    int | None, typer.Option("--batch", metavar="TILES", min=1, help="Tiles per device batch (default 8 CPU, 256 GPU).")
]
Precision = Annotated[
    str | None,
    typer.Option(
        "--precision",
        metavar="fp32|bf16|auto",
        help="fp32, bf16 (a bf16 copy of the network; fast on GPUs and CPUs with AMX or AVX512-BF16), "
        "or auto: bf16 where the hardware has it, fp32 elsewhere. Default: fp32; a detector's, the "
        "precision its threshold was learned at (`indeed calibrate --precision`).",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON line per image on stdout.")]
Force = Annotated[bool, typer.Option("--force", "-f", help="Overwrite existing outputs.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
Recursive = Annotated[bool, typer.Option("--recursive", "-r", help="Look into sub-folders of folder inputs.")]
SkipExisting = Annotated[
    bool,
    typer.Option(
        "--skip-existing",
        help="Leave out inputs whose outputs all exist (resumes an interrupted folder run); not with --force.",
    ),
]
Shard = Annotated[
    str | None,
    typer.Option(
        "--shard",
        metavar="K/N",
        help="Process every N-th input from the K-th (K from 0), one of N processes sharing a folder; "
        "default: the rank under torchrun or the task of a SLURM job array.",
    ),
]
Compile = Annotated[
    bool,
    typer.Option(
        "--compile", help="torch.compile the network (tens of seconds once; pays off on many images, docs/results.md)."
    ),
]

Tiled = Annotated[
    bool,
    typer.Option(
        "--tiled",
        help="Run the sparse (and support) module tile by tile, as the exported ONNX tile network does, "
        "instead of on the whole image (the default up to 1024x1024 pixels; slower, outputs differ slightly).",
    ),
]


def inference_options(
    tile: int, overlap: int, batch: int | None, precision: str | None, compile: bool = False, tiled: bool = False
) -> InferenceOptions:
    """The InferenceOptions of the shared options, checked before any work."""
    whole = False if tiled else None  # None: whole images up to WHOLE_IMAGE_PIXELS
    opts = InferenceOptions(
        tile=tile, overlap=overlap, batch=batch, precision=precision, compile=compile, whole_image=whole
    )
    try:
        opts.check()
    except ValueError as e:
        raise CLIError(str(e)) from None
    return opts


@dataclass
class RunOptions:
    """The options that image commands share, handed to a command as one ``run`` argument."""

    weights: str | None = None
    device: str = "auto"
    tile: int = 128
    overlap: int = 32
    batch: int | None = None
    precision: str | None = None  # None: fp32, and a detector's own precision (readout_precision)
    json_out: bool = False
    force: bool = False
    quiet: bool = False
    recursive: bool = False
    compile_net: bool = False
    tiled: bool = False
    skip_existing: bool = False
    shard: str | None = None

    def shard_of_run(self) -> tuple[int, int] | None:
        """--shard, else the shard a launcher (torchrun, a SLURM array) gave this process."""
        return parse_shard(self.shard) if self.shard else shard_from_env()

    def inference(self) -> InferenceOptions:
        return inference_options(self.tile, self.overlap, self.batch, self.precision, self.compile_net, self.tiled)

    def folder_run(self, report: Reporter, skip_existing: bool = True) -> dict:
        """Keyword arguments of a folder pipeline (indeed_cli.pipelines) that these options set;
        ``report`` hears of the progress and of every outcome."""
        shard = self.shard_of_run()
        report.shard = shard
        kw = {"weights": self.weights, "device": self.device, "options": self.inference(), "recursive": self.recursive,
              "force": self.force, "on_outcome": report, "progress": report, "shard": shard}  # fmt: skip
        if skip_existing:
            kw["skip_existing"] = self.skip_existing
        return kw


SHARED = {  # name -> (annotation, default), in the order --help lists them
    "weights": (Weights, None), "device": (Device, "auto"), "tile": (Tile, 128), "overlap": (Overlap, 32),
    "batch": (Batch, None), "precision": (Precision, None), "json_out": (Json, False), "force": (Force, False),
    "quiet": (Quiet, False), "recursive": (Recursive, False), "compile_net": (Compile, False), "tiled": (Tiled, False),
    "skip_existing": (SkipExisting, False),
    "shard": (Shard, None),
}  # fmt: skip
ALL_SHARED = tuple(SHARED)
INFERENCE = ("weights", "device", "tile", "overlap", "batch", "precision", "tiled")
FOLDER = ("json_out", "force", "quiet", "recursive", "shard")  # what adapt shares with the other folder commands


def shared_options(*names: str, **defaults) -> Callable:
    """Give a command the shared options ``names`` after its own (``defaults`` overrides some of their
    defaults): Typer sees them in the signature, the command gets them as one :class:`RunOptions`
    in its ``run`` parameter."""

    def decorate(fn: Callable) -> Callable:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "run"]
        extra = [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=defaults.get(n, SHARED[n][1]),
                              annotation=SHARED[n][0])
            for n in names
        ]  # fmt: skip

        @functools.wraps(fn)
        def command(**kwargs):
            return fn(run=RunOptions(**{n: kwargs.pop(n) for n in names}), **kwargs)

        command.__signature__ = inspect.Signature([*own, *extra])
        command.__annotations__ = {p.name: p.annotation for p in [*own, *extra]}
        return command

    return decorate
