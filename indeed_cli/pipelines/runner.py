"""The per-image machinery of every folder pipeline: models, ordered writes, outcomes.

A pipeline computes one image after another and yields, per input, either a :class:`Product`
(its result, with the function that writes its files) or an :class:`Outcome` (a failure, or
an input left out).  :func:`run_ordered` writes the products on worker threads while the next
image is computed and turns every step into an :class:`Outcome`, in the order the steps came.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from ..inference import resolve_device
from ..io import ImageError, LoadedImage, is_stdio, read_image
from ..model import Checkpoint, CheckpointError, load_checkpoint, resolve_weights
from .inputs import UsageError


class Progress:
    """What a folder run tells about its progress; this base class shows nothing (the CLI's shows bars)."""

    def start(self, total: int) -> None:
        """The run will process ``total`` images (after those left out by ``skip_existing``)."""

    def tiles(self, name: str, total: int) -> AbstractContextManager[Callable[[int], object]]:
        """A context around one image's inference, giving a callback that advances by n tiles."""
        return nullcontext(lambda n: None)

    def note(self, message: str) -> None:
        """A line about a long step that has no tiles (an adaptation, a calibration)."""


LARGE_IMAGE = 50e6  # pixels: above this a run says what an image will cost before it starts


def note_large_image(progress: Progress, name: str, h: int, w: int, channels: int, tiles: int) -> None:
    """Tell, before it starts, what a very large image costs: its tiles and the memory it needs
    (about (20 C + 10) bytes a pixel: a 24-megapixel colour image peaked at 1.43 GB, a gray one at
    0.77 GB), and whether that is more than the memory now free."""
    if h * w < LARGE_IMAGE:
        return
    need = (20 * channels + 10) * h * w / 1e9
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (ValueError, OSError, AttributeError):  # not every system reports it
        free = None
    short = f", more than the {free:.1f} GB free now" if free is not None and need > free else ""
    progress.note(f"{name} is {h * w / 1e6:,.0f} megapixels: {tiles:,} tiles and about {need:.1f} GB of memory{short}")


@dataclass
class Outcome:
    """What happened to one input: its record (the facts of its JSON line), or why it failed, or
    that it was left out (``skipped``: its outputs existed)."""

    source: Path
    record: dict = field(default_factory=dict)
    error: Exception | None = None
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.skipped


@dataclass
class Product:
    """One computed image: ``write()`` writes its files (on a writer thread; may raise ImageError)
    and returns facts to add to ``record``; ``nbytes``: the memory its outputs hold."""

    source: Path
    write: Callable[[], dict | None]
    record: dict = field(default_factory=dict)
    nbytes: int = 0


def run_ordered(
    steps: Iterable[Product | Outcome],
    on_outcome: Callable[[Outcome], None] | None = None,
    skipped: Sequence[Path] = (),
    workers: int | None = None,
    shard: tuple[int, int] | None = None,
    inputs: Sequence[Path] = (),
) -> list[Outcome]:
    """Write each product while the next step is computed; one Outcome per step, in step order,
    each passed to ``on_outcome`` as soon as it is final.  The ``skipped`` inputs (left out because
    their outputs exist) come first, as skipped Outcomes.  With ``shard`` (K, N) every record also
    says its shard and its ``index`` in ``inputs`` (all inputs of the run, in order), so that the
    JSON lines of all shards can be put back in the order of one run.  ``workers``: writer threads
    (default :func:`writer_threads`)."""
    outcomes: list[Outcome] = []
    ready: deque[Outcome] = deque(Outcome(p, {"image": str(p), "skipped": True}, skipped=True) for p in skipped)
    position = {p: i for i, p in enumerate(inputs)}

    def flush() -> None:
        while ready:
            o = ready.popleft()
            if shard is not None:
                o.record.update(index=position.get(o.source), shard=f"{shard[0]}/{shard[1]}")
            outcomes.append(o)
            if on_outcome is not None:
                on_outcome(o)

    flush()
    try:
        with OrderedWriter(writer_threads() if workers is None else workers) as writer:
            for step in steps:
                if isinstance(step, Outcome):
                    writer.then(lambda o=step: ready.append(o))
                else:

                    def done(result, error, p=step) -> None:
                        ready.append(Outcome(p.source, {**p.record, **(result or {})}, error))

                    writer.submit(step.write, done, step.nbytes)
                flush()
    finally:  # also on an interrupt: what was written is reported
        flush()
    return outcomes


def read_ahead(
    paths: Sequence[Path], depth: int = 2, workers: int = 1
) -> Iterator[tuple[Path, LoadedImage | ImageError]]:
    """(path, image or its ImageError) for each path, in order, the next ``depth`` images read on
    ``workers`` threads while the current one is computed: decoding a PNG takes about as long as
    denoising it on a GPU, and Pillow releases the GIL while it decompresses."""

    def read(p: Path) -> LoadedImage | ImageError:
        try:
            return read_image(p)
        except ImageError as e:
            return e

    if any(is_stdio(p) for p in paths):  # standard input is read where it is used
        yield from ((p, read(p)) for p in paths)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="indeed-read") as pool:
        pending: deque[tuple[Path, Future]] = deque()
        for p in paths:
            pending.append((p, pool.submit(read, p)))
            if len(pending) > depth:
                q, fut = pending.popleft()
                yield q, fut.result()
        while pending:
            q, fut = pending.popleft()
            yield q, fut.result()


ACCELERATOR_READERS = 4  # input decoders ahead of read-outs made on a GPU (reader_threads)


def reader_threads(device) -> int:
    """Threads that decode a folder job's inputs ahead of its read-outs (``read_ahead``'s ``workers``, and
    as many images ahead) in `indeed denoise` and `indeed detect`: ACCELERATOR_READERS where the read-outs
    run on an accelerator, which makes a read-out about as fast as a PNG decodes (on 320 512x512 PNGs on
    H100 hosts, 3-15% less time under way with 4 readers than with 1 for denoise, 6-14% for detect;
    decompose, which writes an .npz and seven maps per image, showed no gain;
    docs/reports/2026-12-07-oag-cli-time.md, 8-9);
    1 on a CPU, whose cores the read-outs need, and where several decoded photographs held at once would
    cost memory for no gain."""
    return 1 if str(device).split(":")[0] == "cpu" else ACCELERATOR_READERS


def read_ahead_on(paths: Sequence[Path], device) -> Iterator[tuple[Path, LoadedImage | ImageError]]:
    """:func:`read_ahead` with :func:`reader_threads` threads for read-outs on ``device``, as many images
    ahead (at least two)."""
    readers = reader_threads(device)
    return read_ahead(paths, depth=max(2, readers), workers=readers)


def writer_threads() -> int:
    """Threads that write outputs: the process's share of the CPU cores (processes of one machine
    under torchrun share them), between 2 and 8.  On a GPU, encoding PNGs bounds a folder run: one
    H200 denoised 12.9 512x512 images a second with 2 threads (docs/results.md)."""
    cores = os.cpu_count() or 2
    return max(2, min(8, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))))


class OrderedWriter:
    """Writes each image's outputs on a worker thread while the next image is computed, and hands
    each result (or its ImageError) to the job's ``done`` on the main thread, in submission order,
    so JSON lines, failure reports and counts keep the input order.

    Why: on a GPU, encoding a 512x512 PNG (~50 ms) takes longer than denoising it (~8 ms);
    PNG and zlib encoding release the GIL, so the writes overlap the computation.  Memory stays
    bounded: jobs hold at most ``max_bytes`` of outputs together (a larger one waits for the
    others and runs alone), so one huge image is never held twice.  Every file is still written
    atomically; on an interrupt (or any error) waiting jobs are dropped, running ones finish, and
    the ``done`` of every job whose write completed is still called, so no written file goes
    unreported.
    """

    def __init__(self, workers: int = 2, max_bytes: int = 256 << 20):
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="indeed-write") if workers > 0 else None
        self.max_bytes = max_bytes
        self.pending: deque[tuple[Future, Callable, int]] = deque()
        self.held = 0

    def submit(
        self, write: Callable[[], object], done: Callable[[object, ImageError | None], None], nbytes: int = 0
    ) -> None:
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

    def __enter__(self) -> OrderedWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._finish_all()
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
            if exc_type is not None:
                self._report_completed()

    def _report_completed(self) -> None:
        """After an interruption: ``done`` for the jobs that ran to the end, in order; none for the
        jobs that were dropped or stopped by an error other than an ImageError."""
        for fut, done, _ in self.pending:
            if fut.cancelled() or (fut.exception() is not None and not isinstance(fut.exception(), ImageError)):
                continue
            error = fut.exception()
            done(None if error else fut.result(), error)
        self.pending.clear()


class ModelCache:
    """Loads each checkpoint once; picks the bundled model by channel count and ``job`` (denoise,
    decompose or adapt, :data:`~indeed_cli.model.registry.DEFAULTS`) when no weights are named.
    ``weights`` may also be a loaded :class:`Checkpoint`, used for every image."""

    def __init__(
        self, weights: str | Path | Checkpoint | None, device: str = "auto", task: str = "denoise", job: str = "denoise"
    ):
        try:
            self.device = resolve_device(device)
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.weights, self.task, self.job = weights, task, job
        self._loaded: dict[str, Checkpoint] = {}

    def get(self, channels: int, job: str | None = None) -> Checkpoint:
        """The checkpoint for an image of ``channels`` channels (``job``: another job's default, e.g.
        "adapt" for images a denoising run adapts; named weights serve every job); CheckpointError
        when it cannot be used.  Every job's checkpoints share the cache, so each file loads once."""
        if isinstance(self.weights, Checkpoint):
            ck, path = self.weights, self.weights.source
        else:
            spec = None if self.weights is None else str(self.weights)
            path = resolve_weights(spec, channels, self.task, job or self.job)
            key = str(path.resolve())
            if key not in self._loaded:
                self._loaded[key] = load_checkpoint(path, self.device)
            ck = self._loaded[key]
        if ck.config.task != self.task:
            raise CheckpointError(f"{path} is a {ck.config.task} checkpoint; this needs a {self.task} one")
        return ck
