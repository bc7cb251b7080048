#!/usr/bin/env python3
"""Rewrite the generated command reference at the end of docs/cli.md from the Typer app.

python tools/cli_reference.py            # tests/cli/test_cli_reference.py fails until this is run
"""

from pathlib import Path

from indeed_cli.cli.app import app
from indeed_cli.cli.reference import render_into

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"

if __name__ == "__main__":
    DOC.write_text(render_into(DOC.read_text(), app))
    print(f"wrote {DOC}")
