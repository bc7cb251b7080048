"""The documents point at files that exist, and user documents do not talk about development
machines or sessions (those belong in docs/reports/)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = [
    ROOT / "README.md",
    ROOT / "weights" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "guide").glob("*.md")),
]
ALL_DOCS = USER_DOCS + sorted((ROOT / "docs" / "reports").glob("*.md")) + [ROOT / "CHANGELOG.md"]


@pytest.mark.parametrize("doc", ALL_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_named_files_exist(doc):
    text = doc.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)", text):  # [text](relative/path)
        if "://" not in target:
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"
    if "reports" in doc.parts:  # notes cite files of their own release
        return
    for named in set(
        re.findall(r"\b((?:docs|tools|benchmarks|examples|weights)/[\w./-]+\.(?:md|py|png|safetensors))", text)
    ):
        assert (ROOT / named).exists(), f"{doc.name} names missing {named}"


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_do_not_talk_about_development_sessions(doc):
    text = doc.read_text().lower()
    for phrase in ("session", "this cpu", "device tool", "benchmarks/explore"):
        assert phrase not in text, f"{doc.name} says {phrase!r}; such notes go to docs/reports/"
