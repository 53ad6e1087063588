"""The repository carries everything it needs: a license, a changelog and a contributors' guide,
and no tracked text that cites what someone who clones it cannot see (documents or folders
outside it, tracker issue numbers). Tests cite docs/design.md and docs/api.md instead."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What a clone cannot follow. A "#" and digits is an issue where it stands alone, not a colour
# in a style sheet.
OUTSIDE = {
    "a folder beside the repository": re.compile(r"\.\.[/]shared\b"),
    "a path of the machine it was written on": re.compile(r"/wor[k]/"),
    "a design or contract document outside the repository": re.compile(r"\b(?:DESIGN|API)\.md\b"),
    "a tracker issue number": re.compile(
        r"\b[Ii]ssues?[ -]#?\d+|(?:^|(?<![:=])[\s(\[])#\d{1,5}(?=[\s).,:\]]|$)", re.M
    ),
}
# The changelog may say which issue a change closed.
EXEMPT = {"CHANGELOG.md"}


def tracked_text_files() -> dict[str, str]:
    """Every file git tracks that reads as UTF-8 text, by its path in the repository."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    texts = {}
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            texts[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def outside_references(text: str) -> list[str]:
    """Each reference in ``text`` to what a clone cannot see: ``"line N: what (the text)"``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in OUTSIDE.items():
            for match in pattern.finditer(line):
                found.append(f"line {number}: {what} ({match.group().strip()!r})")
    return found


def sample(template: str) -> str:
    """A check's example text, its references to what is outside spelt out only here, so that
    this file itself passes the check it tests."""
    spelt = {"issue": "issue", "Issue": "Issue", "hash": "#", "work": "work", "API": "API"}
    return template.format(shared="/".join(("..", "shared")), DESIGN="DESIGN", **spelt)


def test_tracked_text_cites_nothing_outside_the_repository():
    texts = tracked_text_files()
    assert "README.md" in texts and "yogadl_plus/__init__.py" in texts
    found = [
        f"{name} {hit}"
        for name, text in sorted(texts.items())
        if name not in EXEMPT
        for hit in outside_references(text)
    ]
    assert not found, (
        "cite docs/design.md#... or docs/api.md#..., say what the behaviour is rather than "
        "which issue brought it, and name files inside the repository:\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "text",
    [
        '"""Mixtures ({issue} 17): weights."""',
        "# --- rough edges ({Issue} {hash}27) ---",
        "fixed in {hash}12.",
        "see [it](storage.md#fast-rows-{issue}-26)",
        "bash {shared}/tools/venvs.sh",
        "python compare.py --a /{work}/base",
        '"""The order contract of {API}.md section 5; {DESIGN}.md "The cache format"."""',
    ],
)
def test_outside_reference_check_can_fail(text):
    assert outside_references(sample(text))


@pytest.mark.parametrize(
    "text",
    [
        "see docs/design.md#layers and docs/api.md#stream",
        "fill: {hash}222; stroke: {hash}555",
        "objects at exit (google/grain{hash}1031)",
        "the issues a bucket has: 503 and timeouts",
        "bash bench/baselines/venvs.sh .baselines",
    ],
)
def test_outside_reference_check_lets_the_repositorys_own_text_be(text):
    assert outside_references(sample(text)) == []


def test_the_repository_has_a_license_a_changelog_and_a_contributors_guide():
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert (ROOT / "CHANGELOG.md").is_file()
    guide = (ROOT / "CONTRIBUTING.md").read_text()
    for pointer in ("docs/contributing.md", "nox -s quick", "nox -s tests", "nox -s lint"):
        assert pointer in guide, pointer
