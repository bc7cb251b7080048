"""Shared CLI pieces: option aliases, input expansion, output planning, errors, progress."""
from __future__ import annotations

import glob
import json
import sys
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from ..imageio import STDIO, ImageError, is_image_path, is_stdio

# Exit codes (docs/cli.md)
EXIT_OK = 0
EXIT_FAILED = 1  # one or more inputs could not be processed (the others were)
EXIT_USAGE = 2  # bad arguments, nothing to do, refused overwrite
EXIT_WEIGHTS = 3  # checkpoint missing, unreadable or not matching


class CLIError(Exception):
    """A one-line error for the user, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- option aliases
Weights = Annotated[Optional[str], typer.Option(
    "--weights", "-w", help="Checkpoint: bundled name (color, gray), a .safetensors path, or "
    "hf://owner/repo/file.safetensors@revision. Default: the bundled model for the image's channels.")]
Device = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
Tile = Annotated[int, typer.Option("--tile", min=16, help="Tile size in pixels (multiple of 8).")]
Overlap = Annotated[int, typer.Option("--overlap", min=0, help="Overlap between tiles in pixels.")]
Batch = Annotated[Optional[int], typer.Option("--batch", min=1, help="Tiles per device batch (default 8 CPU, 256 GPU).")]
Precision = Annotated[str, typer.Option("--precision", help="fp32, or bf16 (GPUs; CPUs with AMX or AVX512-BF16): a bf16 copy of the network.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON line per image on stdout.")]
Force = Annotated[bool, typer.Option("--force", "-f", help="Overwrite existing outputs.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
Recursive = Annotated[bool, typer.Option("--recursive", "-r", help="Look into sub-folders of folder inputs.")]
SkipExisting = Annotated[bool, typer.Option("--skip-existing", help="Leave out inputs whose outputs all exist "
                                            "(resumes an interrupted folder run); not with --force.")]
Compile = Annotated[bool, typer.Option("--compile", help="torch.compile the network (tens of seconds once; "
                                       "pays off on many images, docs/benchmarks.md).")]


def stem(path: Path) -> str:
    """The name outputs are made from: the file's stem, ``stdin`` for standard input."""
    return "stdin" if is_stdio(path) else path.stem


def expand_inputs(inputs: list[str], recursive: bool = False) -> list[Path]:
    """Files, folders (their images, sorted), glob patterns and ``-`` (standard input) ->
    unique image paths."""
    out: list[Path] = []
    for spec in inputs:
        p = Path(spec).expanduser()
        if spec == STDIO:
            out.append(Path(STDIO))
        elif p.is_dir():
            it = p.rglob("*") if recursive else p.iterdir()
            found = sorted(q for q in it if q.is_file() and is_image_path(q) and not q.name.startswith("."))
            if not found:
                raise CLIError(f"no images found in folder {spec}")
            out.extend(found)
        elif p.exists():
            out.append(p)
        elif any(c in spec for c in "*?["):
            found = sorted(Path(q) for q in glob.glob(spec, recursive=True) if Path(q).is_file())
            if not found:
                raise CLIError(f"no files match {spec!r}")
            out.extend(found)
        else:
            raise CLIError(f"no such file or folder: {spec}")
    seen, unique = set(), []
    for p in out:
        key = STDIO if is_stdio(p) else p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def plan_outputs(inputs: list[Path], output: Path, suffix: str = ".png", force: bool = False,
                 skip_existing: bool = False) -> tuple[list[Path], list[Path], list[Path]]:
    """Where each input's result goes: ``output`` itself for one input with an image suffix,
    else ``output/<stem><suffix>``.  Refuses input overwrites, stem clashes and (without
    --force) existing files, before any work is done.  Returns the inputs to process, their
    targets, and the inputs left out by ``skip_existing``.  ``-o -`` (one input) is standard output."""
    if is_stdio(output):
        if len(inputs) != 1:
            raise CLIError(f"-o - (standard output) takes one input, not {len(inputs)}")
        if skip_existing:
            raise CLIError("--skip-existing cannot check standard output")
        return inputs, [output], []
    as_file = len(inputs) == 1 and output.suffix.lower() in (".png", ".tif", ".tiff") and not output.is_dir()
    if not as_file and output.suffix.lower() in (".png", ".tif", ".tiff") and not output.is_dir():
        raise CLIError(f"{len(inputs)} inputs need an output folder, not the file name {output}")
    targets = [output] if as_file else [output / f"{stem(p)}{suffix}" for p in inputs]
    inputs, plans, skipped = skip_done(inputs, [{"output": t} for t in targets], skip_existing, force)
    return inputs, [plan["output"] for plan in plans], skipped


def skip_done(inputs: list[Path], plans: list[dict[str, Path]], skip_existing: bool,
              force: bool) -> tuple[list[Path], list[dict[str, Path]], list[Path]]:
    """The inputs still to do with their planned files, and (with --skip-existing) the inputs left
    out because all their planned files exist.  What remains is checked by check_targets, so an
    input with only some of its outputs is refused without --force: never overwritten silently."""
    if skip_existing and force:
        raise CLIError("--skip-existing and --force contradict each other; choose one")
    done = [skip_existing and bool(plan) and all(f.exists() for f in plan.values()) for plan in plans]
    skipped = [p for p, d in zip(inputs, done) if d]
    todo = [i for i, d in enumerate(done) if not d]
    inputs, plans = [inputs[i] for i in todo], [plans[i] for i in todo]
    check_targets(inputs, [f for plan in plans for f in plan.values()], force)
    return inputs, plans, skipped


def report_skipped(skipped: list[Path], json_out: bool, quiet: bool) -> None:
    """One JSON line per skipped input (``"skipped": true``), or one line on stderr."""
    if json_out:
        for p in skipped:
            emit_json({"image": str(p), "skipped": True})
    elif skipped and not quiet:
        warn(f"skipped {len(skipped)} input(s) whose outputs exist (--skip-existing)")


def require_folder(path: Path, option: str) -> None:
    """An output folder option must not name an existing file."""
    if path.exists() and not path.is_dir():
        raise CLIError(f"{option} must be a folder, and {path} is a file")


def check_targets(inputs: list[Path], targets: list[Path], force: bool) -> None:
    ins = {p.resolve() for p in inputs if not is_stdio(p)}
    seen: dict[Path, int] = {}
    for t in targets:
        r = t.resolve()
        if r in ins:
            raise CLIError(f"refusing to overwrite the input {t}; choose another output")
        if r in seen:
            raise CLIError(f"two inputs would write the same output {t} (same file stem); run them separately")
        seen[r] = 1
        if t.exists() and not force:
            raise CLIError(f"output exists: {t} (use --force to overwrite)")


def _finite(v):
    """NaN/Inf are not JSON (jq and strict parsers reject them): emit null instead."""
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def emit_json(record: dict) -> None:
    sys.stdout.write(json.dumps(_finite(record), allow_nan=False) + "\n")
    sys.stdout.flush()


def progress_bar(total: int, desc: str, quiet: bool):
    """One tqdm bar on stderr, shown only on a terminal and when there is more than a little work."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="tile", disable=True if quiet else None, leave=False,
                file=sys.stderr, dynamic_ncols=True)


def parse_scales(text: str) -> tuple[float, ...]:
    """'1,0.5,0.25' -> (1.0, 0.5, 0.25); each in (0, 1], no repeats."""
    try:
        scales = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise CLIError(f"--scales must be comma-separated numbers, got {text!r}", 2) from None
    if not scales or any(not 0 < v <= 1 for v in scales) or len(set(scales)) != len(scales):
        raise CLIError(f"--scales must be distinct numbers in (0, 1], got {text!r}", 2)
    return scales


def warn(msg: str) -> None:
    sys.stderr.write(f"indeed: {msg}\n")


def report_failure(src, error: Exception, json_out: bool) -> None:
    """One line on stderr (and a JSON line with --json) for an input that could not be processed."""
    warn(f"error: {error}")
    if json_out:
        emit_json({"image": str(src), "error": str(error)})


class OrderedWriter:
    """Writes each image's outputs on a worker thread while the next image is computed, and hands
    each result (or its ImageError) to the job's ``done`` on the main thread, in submission order,
    so JSON lines, failure reports and counts keep the input order.

    Why: on a GPU, encoding a 512x512 PNG (~50 ms) takes longer than denoising it (~8 ms);
    PNG and zlib encoding release the GIL, so the writes overlap the computation.  Memory stays
    bounded: jobs hold at most ``max_bytes`` of outputs together (a larger one waits for the
    others and runs alone), so one huge image is never held twice.  Every file is still written
    atomically; on an interrupt, waiting jobs are dropped and running ones finish.
    """

    def __init__(self, workers: int = 2, max_bytes: int = 256 << 20):
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="indeed-write") if workers > 0 else None
        self.max_bytes = max_bytes
        self.pending: deque[tuple[Future, Callable, int]] = deque()
        self.held = 0

    def submit(self, write: Callable[[], object], done: Callable[[object, ImageError | None], None],
               nbytes: int = 0) -> None:
        """Run ``write()`` (which may raise ImageError), then ``done(result, error)`` in order."""
        while self.pending and (self.held + nbytes > self.max_bytes or self.pending[0][0].done()):
            self._finish_oldest()
        if self.pool is None or nbytes > self.max_bytes:
            self._finish_all()
            try:
                done(write(), None)
            except ImageError as e:
                done(None, e)
            return
        self.pending.append((self.pool.submit(write), done, nbytes))
        self.held += nbytes

    def then(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` in order after the jobs submitted so far (e.g. a read failure's report)."""
        self.submit(lambda: None, lambda *_: callback())

    def _finish_oldest(self) -> None:
        fut, done, nbytes = self.pending.popleft()
        self.held -= nbytes
        try:
            result, error = fut.result(), None
        except ImageError as e:
            result, error = None, e
        done(result, error)

    def _finish_all(self) -> None:
        while self.pending:
            self._finish_oldest()

    def __enter__(self) -> "OrderedWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._finish_all()
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)


class ModelCache:
    """Loads each checkpoint once; picks the bundled model by channel count when --weights is unset."""

    def __init__(self, weights: str | None, device: str, task: str = "denoise", compile: bool = False):
        from ..inference import resolve_device
        try:
            self.device = resolve_device(device)
        except RuntimeError as e:
            raise CLIError(str(e)) from None
        self.weights, self.task, self.compile = weights, task, compile
        self._loaded: dict = {}

    def get(self, channels: int):
        from ..checkpoint import CheckpointError, load_checkpoint, resolve_weights
        try:
            path = resolve_weights(self.weights, channels, self.task)
            key = str(path.resolve())
            if key not in self._loaded:
                ck = load_checkpoint(path, self.device)
                if ck.config.task != self.task:
                    raise CLIError(f"{path} is a {ck.config.task} checkpoint; this command needs a {self.task} one",
                                   EXIT_WEIGHTS)
                if self.compile:  # fixed tile shapes: one compilation per batch size
                    import torch
                    ck.model.forward = torch.compile(ck.model.forward, dynamic=False)
                self._loaded[key] = ck
            return self._loaded[key]
        except CheckpointError as e:
            raise CLIError(str(e), EXIT_WEIGHTS) from None


def inference_options(tile: int, overlap: int, batch, precision: str):
    from ..inference import InferenceOptions
    if tile % 8:
        raise CLIError(f"--tile must be a multiple of 8, got {tile}")
    if overlap >= tile:
        raise CLIError(f"--overlap ({overlap}) must be smaller than --tile ({tile})")
    if precision not in ("fp32", "bf16"):
        raise CLIError(f"--precision must be fp32 or bf16, got {precision!r}")
    return InferenceOptions(tile=tile, overlap=overlap, batch=batch, precision=precision)
