"""The `indeed` command: one Typer app, one module per command, one error handler."""

from __future__ import annotations

import os
import sys

import click
import typer

from ..io import ImageError
from ..model import CheckpointError
from ..pipelines import UsageError
from .adapt import adapt_cmd
from .calibrate import calibrate_cmd
from .decompose import decompose_cmd
from .denoise import denoise_cmd
from .detect import detect_cmd
from .evaluate import evaluate_cmd
from .models import models_cmd
from .runner import EXIT_FAILED, EXIT_USAGE, EXIT_WEIGHTS, CLIError
from .train import train_cmd

app = typer.Typer(
    name="indeed",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Interpretable deep image decomposition (InDeed): Y = L + S + N with Bayesian posteriors.\n\n"
    "Exit codes: 0 ok, 1 some inputs failed, 2 bad usage, 3 weights problem. "
    "Set INDEED_DEBUG=1 for tracebacks.",
)
app.command("decompose")(decompose_cmd)
app.command("denoise")(denoise_cmd)
app.command("detect")(detect_cmd)
app.command("adapt")(adapt_cmd)
app.command("train")(train_cmd)
app.command("evaluate")(evaluate_cmd)
app.command("calibrate")(calibrate_cmd)
app.command("models")(models_cmd)


def main() -> None:
    """Entry point: run the app; turn known errors into one line on stderr and an exit code."""
    debug = os.environ.get("INDEED_DEBUG", "") not in ("", "0")
    try:
        rc = app(standalone_mode=False)  # click returns the code of typer.Exit in this mode
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except SystemExit:
        raise
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except CLIError as e:
        _fail(str(e), e.code, debug)
    except UsageError as e:
        _fail(str(e), EXIT_USAGE, debug)
    except CheckpointError as e:
        _fail(str(e), EXIT_WEIGHTS, debug)
    except ImageError as e:
        _fail(str(e), EXIT_FAILED, debug)
    except KeyboardInterrupt:
        _fail("interrupted", 130, debug)
    except Exception as e:  # click usage errors and anything unexpected
        if isinstance(e, click.exceptions.Abort):
            _fail("aborted", 130, debug)
        if isinstance(e, click.ClickException):
            if debug:
                raise
            e.show()
            sys.exit(EXIT_USAGE)
        _fail(f"{type(e).__name__}: {e}", EXIT_FAILED, debug)


def _fail(msg: str, code: int, debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()
    first = msg.strip().splitlines()[0] if msg.strip() else "error"
    sys.stderr.write(f"indeed: error: {first}\n")
    sys.exit(code)
