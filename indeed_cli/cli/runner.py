"""What the user sees of a folder run: progress, one JSON line per input, one line per error,
and the exit code.  Every image command hands its pipeline's Outcomes to one :class:`Reporter`."""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager

import typer
from tqdm import tqdm

from ..pipelines import Outcome, Progress

# Exit codes (docs/cli.md)
EXIT_OK = 0
EXIT_FAILED = 1  # one or more inputs could not be processed (the others were)
EXIT_USAGE = 2  # bad arguments, nothing to do, refused overwrite
EXIT_WEIGHTS = 3  # checkpoint missing, unreadable or not matching
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it


class CLIError(Exception):
    """A one-line error for the user, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


def warn(msg: str) -> None:
    sys.stderr.write(f"indeed: {msg}\n")


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


class Reporter(Progress):
    """What the user sees of a folder run: a bar over the images and one over the tiles of each
    (on a terminal), one JSON line per input (``--json``), one stderr line per failure, a summary
    line at the end (unless ``-q``), and the exit code (:meth:`finish`)."""

    def __init__(self, json_out: bool, quiet: bool):
        self.json_out, self.quiet = json_out, quiet
        self.ok, self.failed, self.skipped = 0, 0, 0
        self.outcomes: list[Outcome] = []
        self.bar: tqdm | None = None
        self.t0 = time.perf_counter()
        self.shard: tuple[int, int] | None = None  # set when the run is one shard of several

    # Progress: the pipeline's hooks
    def start(self, total: int) -> None:
        if self.shard is not None and os.environ.get("WORLD_SIZE"):  # ranks share a terminal: lines only
            return
        if not self.quiet and total > 1:  # disable=None: only on a terminal
            self.bar = tqdm(total=total, desc="images", unit="image", file=sys.stderr, disable=None, dynamic_ncols=True)

    @contextmanager
    def tiles(self, name: str, total: int):
        hidden = self.quiet or (self.shard is not None and bool(os.environ.get("WORLD_SIZE")))
        with tqdm(total=total, desc=name, unit="tile", disable=True if hidden else None, leave=False,
                  position=1 if self.bar is not None else 0, file=sys.stderr, dynamic_ncols=True) as t:  # fmt: skip
            yield t.update

    def note(self, message: str) -> None:
        if not self.quiet:
            self.say(message)

    def say(self, message: str) -> None:
        """One line on stderr, above the bars when there are some."""
        where = f"shard {self.shard[0]}/{self.shard[1]}: " if self.shard is not None else ""
        line = f"indeed: {where}{message}"
        if self.bar is not None and not self.bar.disable:
            self.bar.write(line, file=sys.stderr)
        else:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def __call__(self, o: Outcome) -> None:
        self.outcomes.append(o)
        if o.skipped:
            self.skipped += 1
            if self.json_out:
                emit_json(o.record)
            return
        if o.error is not None:
            self.failed += 1
            self.say(f"error: {o.error}")
            if self.json_out:
                emit_json({"image": str(o.source), "error": str(o.error)})
        else:
            self.ok += 1
            if self.json_out:
                emit_json(o.record)
        if self.bar is not None:
            self.bar.update(1)

    def finish(self, *notes: str) -> None:
        """Close the bars, print the summary and ``notes`` (unless quiet); exit 1 if any input failed."""
        if self.bar is not None:
            self.bar.close()
        if not self.quiet:
            self.say_summary()
            for note in notes:
                if note:
                    self.say(note)
        if self.failed:
            raise typer.Exit(EXIT_FAILED)

    def say_summary(self) -> None:
        """What was done and how long it took; nothing when the only input failed (its error line
        is the one line a bad input gets)."""
        seconds = f"{time.perf_counter() - self.t0:.1f} s"
        done = self.processed()
        if len(self.outcomes) == 1 and len(done) == 1 and "output" in done[0].record:
            self.say(f"wrote {done[0].record['output']} in {seconds}")
        elif len(self.outcomes) > 1 or done:
            parts = [f"{self.ok} of {len(self.outcomes)} images done"]
            if self.failed:
                parts.append(f"{self.failed} failed")
            if self.skipped:
                parts.append(f"{self.skipped} skipped (outputs existed)")
            self.say(", ".join(parts) + f" in {seconds}")

    def processed(self) -> list[Outcome]:
        """The outcomes of the inputs that were processed without error."""
        return [o for o in self.outcomes if o.ok]
