"""docs/cli.md ends with the reference that the Typer app generates: it cannot fall behind."""

from pathlib import Path

from indeed_cli.cli.app import app
from indeed_cli.cli.reference import MARKER, cli_reference, render_into

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_reference_is_current():
    text = DOC.read_text()
    assert MARKER in text, "docs/cli.md lost its generated part"
    assert text == render_into(text, app), "docs/cli.md is stale: run python tools/cli_reference.py"


def test_reference_lists_every_command_and_option():
    ref = cli_reference(app)
    for cmd in ("decompose", "denoise", "detect", "adapt", "train", "evaluate", "calibrate", "models"):
        assert f"### `indeed {cmd}`" in ref
    assert "`--skip-existing`" in ref and "`--time-budget`" in ref and "indeed denoise INPUTS... [OPTIONS]" in ref
