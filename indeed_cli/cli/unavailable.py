"""Commands whose capability is not built yet: they say so and exit non-zero."""
from __future__ import annotations

from typing import Annotated

import typer

from .common import CLIError


def _unavailable(what: str, issue: str) -> None:
    raise CLIError(f"`indeed {what}` is not available yet (tracked in issue {issue})")


def adapt_cmd(args: Annotated[list[str] | None, typer.Argument(help="Images (not available yet).")] = None,
              mode: Annotated[str | None, typer.Option("--mode")] = None,
              output: Annotated[str | None, typer.Option("--output", "-o")] = None) -> None:
    """Active generalization InDeedAG / InDeedOAG (not available yet)."""
    _unavailable("adapt", "#5")
