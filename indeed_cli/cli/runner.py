"""What the user sees of a folder run: progress, one JSON line per input, one line per error,
and the exit code.  Every image command hands its pipeline's Outcomes to one :class:`Reporter`."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

import typer
from tqdm import tqdm

from ..pipelines import Outcome

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


def tile_progress(quiet: bool):
    """A per-image tile bar on stderr, shown only on a terminal (a pipeline's ``progress``)."""

    @contextmanager
    def bar(name: str, total: int):
        with tqdm(
            total=total,
            desc=name,
            unit="tile",
            disable=True if quiet else None,
            leave=False,
            file=sys.stderr,
            dynamic_ncols=True,
        ) as t:
            yield t.update

    return bar


class Reporter:
    """Reports each Outcome as it comes: its JSON line (``--json``), or one stderr line for a failure;
    :meth:`finish` says what was left out and exits 1 when any input failed."""

    def __init__(self, json_out: bool, quiet: bool):
        self.json_out, self.quiet = json_out, quiet
        self.ok, self.failed, self.skipped = 0, 0, 0

    def __call__(self, o: Outcome) -> None:
        if o.skipped:
            self.skipped += 1
            if self.json_out:
                emit_json(o.record)
        elif o.error is not None:
            self.failed += 1
            warn(f"error: {o.error}")
            if self.json_out:
                emit_json({"image": str(o.source), "error": str(o.error)})
        else:
            self.ok += 1
            if self.json_out:
                emit_json(o.record)

    def finish(self) -> None:
        if self.skipped and not self.json_out and not self.quiet:
            warn(f"skipped {self.skipped} input(s) whose outputs exist (--skip-existing)")
        if self.failed:
            raise typer.Exit(EXIT_FAILED)
