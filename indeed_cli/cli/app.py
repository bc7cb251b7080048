"""The `indeed` command: one Typer app, one module per command, one error handler."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Annotated

import typer

from ..io import ImageError
from ..model import CheckpointError
from ..pipelines import UsageError
from ..version import __version__
from .adapt import adapt_cmd
from .calibrate import calibrate_cmd
from .decompose import decompose_cmd
from .denoise import denoise_cmd
from .detect import detect_cmd
from .evaluate import evaluate_cmd
from .export import export_cmd
from .models import models_cmd
from .runner import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, EXIT_WEIGHTS, CLIError
from .train import train_cmd

app = typer.Typer(
    name="indeed",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: readable at 80 columns, in logs and in pipes
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Interpretable deep image decomposition (InDeed): Y = L + S + N with Bayesian posteriors.\n\n"
    "Exit codes: 0 ok, 1 some inputs failed, 2 bad usage, 3 weights problem, 130 interrupted. "
    "Set INDEED_DEBUG=1 for tracebacks.",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"indeed {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", "-V", help="Print the version and exit.", is_eager=True, callback=_version)
    ] = False,
) -> None:
    """Interpretable deep image decomposition (InDeed): Y = L + S + N with Bayesian posteriors."""


app.command("decompose")(decompose_cmd)
app.command("denoise")(denoise_cmd)
app.command("detect")(detect_cmd)
app.command("adapt")(adapt_cmd)
app.command("train")(train_cmd)
app.command("evaluate")(evaluate_cmd)
app.command("calibrate")(calibrate_cmd)
app.command("export")(export_cmd)
app.command("models")(models_cmd)


def _kind(e: BaseException) -> str:
    """What a Typer or click exception is, by its class names: Typer 0.26 and later carry their own
    copy of click, whose exceptions are not click's, so isinstance against either misses the other."""
    names = {c.__name__ for c in type(e).__mro__}
    if "Exit" in names and hasattr(e, "exit_code"):
        return "exit"
    if "Abort" in names:
        return "abort"
    if "ClickException" in names:
        return "usage" if "UsageError" in names else "click"
    return ""


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; turn known errors into one line on stderr and an exit code."""
    debug = os.environ.get("INDEED_DEBUG", "") not in ("", "0")
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:  # nothing asked: the help, and the exit code of a usage error
        _run(["--help"])
        sys.exit(EXIT_USAGE)
    try:
        _run(args)
    except SystemExit:
        raise
    except CLIError as e:
        _fail(str(e), e.code, debug)
    except UsageError as e:
        _fail(str(e), EXIT_USAGE, debug)
    except CheckpointError as e:
        _fail(str(e), EXIT_WEIGHTS, debug)
    except ImageError as e:
        _fail(str(e), EXIT_FAILED, debug)
    except KeyboardInterrupt:
        _fail("interrupted", EXIT_INTERRUPTED, debug)
    except Exception as e:  # click usage errors and anything unexpected
        kind = _kind(e)
        if kind == "exit" and e.exit_code != EXIT_INTERRUPTED:
            sys.exit(e.exit_code)
        if kind in ("abort", "exit"):  # Ctrl-C: click raises Abort, Typer 0.26+ a silent Exit(130)
            _fail("interrupted", EXIT_INTERRUPTED, debug)
        if kind in ("usage", "click") and not debug:
            e.show()  # click's own message: the usage line, a hint and the error
            sys.exit(EXIT_USAGE if kind == "usage" else e.exit_code)
        _fail(f"{type(e).__name__}: {e}", EXIT_FAILED, debug)


def _run(args: list[str]) -> None:
    rc = app(args, prog_name="indeed", standalone_mode=False)  # the code of typer.Exit, in this mode
    if rc == EXIT_INTERRUPTED:  # Typer 0.26+ turns Ctrl-C into a silent Exit(130): say so
        raise KeyboardInterrupt
    if isinstance(rc, int) and rc:
        sys.exit(rc)


def _fail(msg: str, code: int, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    first = msg.strip().splitlines()[0] if msg.strip() else "error"
    sys.stderr.write(f"indeed: error: {first}\n")
    sys.exit(code)
