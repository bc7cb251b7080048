"""Usage errors, help and version through a real process, under whatever Typer is installed:
one clear message and exit 2, never a Python exception name."""

import subprocess
import sys

import pytest

from indeed_cli import __version__

pytestmark = pytest.mark.slow  # a Python process per case


def indeed(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "indeed_cli", *map(str, args)], capture_output=True, text=True)


def test_unknown_option_is_a_usage_error():
    r = indeed("denoise", "--bogus", "x.png")
    assert r.returncode == 2 and "No such option" in r.stderr and "--bogus" in r.stderr
    assert "NoSuchOption" not in r.stderr and "Traceback" not in r.stderr


def test_missing_output_names_the_option():
    r = indeed("denoise", "photo.png")
    assert r.returncode == 2 and "'--output' / '-o'" in r.stderr and "MissingParameter" not in r.stderr


def test_bad_value_and_unknown_command():
    r = indeed("denoise", "x.png", "-o", "y.png", "--tile", "abc")
    assert r.returncode == 2 and "--tile" in r.stderr and "Traceback" not in r.stderr
    r = indeed("denoize", "x.png")
    assert r.returncode == 2 and "denoize" in r.stderr


def test_bare_command_prints_help_and_exits_2():
    r = indeed()
    assert r.returncode == 2 and "Usage: indeed" in r.stdout and "denoise" in r.stdout
    assert "Error" not in r.stderr and "NoArgsIsHelp" not in r.stdout + r.stderr


def test_version_and_short_help():
    r = indeed("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"indeed {__version__}"
    r = indeed("denoise", "-h")
    assert r.returncode == 0 and r.stdout.startswith("Usage: indeed denoise")
    for junk in ("<bool>", "{inputs}", "<str>", "<int>"):
        assert junk not in r.stdout, junk
    assert "--weights CHECKPOINT" in r.stdout and "--tile PIXELS" in r.stdout
