"""The documentation site: mkdocs builds it with --strict, every nav page is in it, and the
order diagrams show what yogadl_plus computes. (Test names say "documentation", so that
``-k documentation`` picks them with the snippet tests.)"""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import yogadl_plus as ydl

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SVG = "{http://www.w3.org/2000/svg}"


def nav_pages(nav: Any) -> list[str]:
    """Every page path of an mkdocs nav (nested sections, titled or not)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    raise TypeError(f"unexpected nav entry {nav!r}")


def load_config() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def built_page(site: Path, page: str, directory_urls: bool) -> Path:
    stem = page[: -len(".md")]
    if not directory_urls or stem == "index" or stem.endswith("/index"):
        return site / f"{stem}.html"
    return site / stem / "index.html"


def test_documentation_site_builds_strict_with_every_nav_page(tmp_path):
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "mkdocs.yml", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    assert "WARNING" not in result.stderr, result.stderr[-5000:]

    config = load_config()
    pages = nav_pages(config["nav"])
    assert len(pages) == len(set(pages)), "a page is twice in the nav"
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(pages) == on_disk, "every page under docs/ is in the nav, and only those"
    directory_urls = config.get("use_directory_urls", True)
    for page in pages:
        html = built_page(site, page, directory_urls)
        assert html.is_file(), f"{page} was not built ({html})"
        assert "<h1" in html.read_text(encoding="utf-8"), f"{page} has no title"
    for image in ("order.svg", "elastic.svg"):
        assert (site / "img" / image).is_file()


@pytest.mark.parametrize(
    "page, image",
    [
        ("concepts.md", "order.svg"),
        ("concepts.md", "elastic.svg"),
        ("distributed.md", "elastic.svg"),
    ],
)
def test_documentation_diagrams_are_embedded_with_alt_text(page, image):
    text = (DOCS / page).read_text()
    alts = re.findall(r"!\[([^\]]*)\]\(img/" + re.escape(image) + r"\)", text)
    assert alts and all(len(alt.split()) >= 10 for alt in alts), f"{image} needs alt text"


def boxes(image: str) -> list[dict[str, str]]:
    """The data-* attributes of every position box of a diagram."""
    tree = ET.parse(DOCS / "img" / image)
    found = []
    for group in tree.iter(f"{SVG}g"):
        if group.get("class") == "pos":
            found.append({k[len("data-") :]: v for k, v in group.attrib.items()})
    assert found, f"{image} has no position boxes"
    return found


@pytest.fixture(scope="module")
def ten_records(tmp_path_factory) -> ydl.DataRef:
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("diagrams"))
    return ydl.cache_dataset(
        ({"i": i} for i in range(10)), "diagram", "v1", storage, progress=False
    )


def by_shard_and_epoch(found: list[dict[str, str]]) -> dict[tuple[int, int], list[int]]:
    """(shard, epoch) -> the records of its boxes, in global position order."""
    out: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for box in found:
        out[int(box["shard"]), int(box["epoch"])].append((int(box["position"]), int(box["record"])))
    return {key: [record for _, record in sorted(items)] for key, items in out.items()}


def test_documentation_order_diagram_is_what_streams_hand_out(ten_records):
    found = boxes("order.svg")
    assert len(found) == 20  # 10 positions, 2 epochs
    args = dict(shuffle=True, shuffle_seed=7, num_shards=2)
    drawn = by_shard_and_epoch(found)
    for rank in range(2):
        stream = ten_records.stream(shard_rank=rank, **args)
        for epoch in range(2):
            assert drawn[rank, epoch] == [int(r["i"]) for r in stream], (rank, epoch)
    for box in found:
        position, shard = int(box["position"]), int(box["shard"])
        assert position % 2 == shard  # shard r takes global positions r, r + 2, ...
        resumed = ten_records.stream(shard_rank=shard, start_offset=int(box["offset"]), **args)
        assert int(next(iter(resumed))["i"]) == int(box["record"]), box
    # The permutation lines join each epoch-0 position to the record it holds.
    tree = ET.parse(DOCS / "img" / "order.svg")
    lines = {
        int(line.get("data-position")): int(line.get("data-record"))
        for line in tree.iter(f"{SVG}line")
        if line.get("class") == "perm"
    }
    epoch0 = {int(b["position"]): int(b["record"]) for b in found if b["epoch"] == "0"}
    assert lines == epoch0


def test_documentation_elastic_diagram_is_what_streams_hand_out(ten_records):
    found = boxes("elastic.svg")
    args = dict(shuffle=True, shuffle_seed=7)
    before = by_shard_and_epoch([b for b in found if b["shards"] == "2"])
    old = [ten_records.stream(num_shards=2, shard_rank=r, **args) for r in range(2)]
    iters = [iter(s) for s in old]
    for rank, it in enumerate(iters):
        assert before[rank, 0] == [int(next(it)["i"]) for _ in range(3)]
    global_start = old[0].global_offset
    assert [s.global_offset for s in old] == [6, 6]
    after = by_shard_and_epoch([b for b in found if b["shards"] == "3"])
    assert {int(b["global-start"]) for b in found if b["shards"] == "3"} == {global_start}
    for rank in range(3):
        new = ten_records.stream(num_shards=3, shard_rank=rank, global_start=global_start, **args)
        for epoch in range(2):
            assert after[rank, epoch] == [int(r["i"]) for r in new], (rank, epoch)


def _public_members() -> list[tuple[str, Any]]:
    """Every public name of ``ydl`` (classes and functions; modules' own names) and every
    public method and property of its classes, defined there."""
    import inspect

    found: list[tuple[str, Any]] = []
    for name in ydl.__all__:
        obj = getattr(ydl, name)
        if inspect.ismodule(obj):
            continue
        found.append((name, obj))
        if not inspect.isclass(obj):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            if isinstance(value, property):
                found.append((f"{name}.{attr}", value.fget))
            elif isinstance(value, (classmethod, staticmethod)):
                found.append((f"{name}.{attr}", value.__func__))
            elif inspect.isfunction(value):
                found.append((f"{name}.{attr}", value))
    return found


def test_documentation_every_public_name_says_what_it_gives():
    # Before: 23 public members had no docstring, so the API reference said nothing of them.
    bare = []
    for name, obj in _public_members():
        doc = getattr(obj, "__doc__", None)
        if not (doc or "").strip():
            owner, _, attr = name.partition(".")
            # A method that overrides a documented one says what the base says.
            inherited = attr and any(
                (getattr(getattr(base, attr, None), "__doc__", None) or "").strip()
                for base in getattr(ydl, owner).__mro__[1:]
            )
            if not inherited:
                bare.append(name)
    assert bare == []


def test_documentation_reference_covers_the_public_api():
    text = (DOCS / "reference.md").read_text()
    documented = set(re.findall(r"^::: yogadl_plus\.(\w+)", text, re.M))
    listed = set(re.findall(r"^        - (\w+)$", text, re.M))
    for name in ydl.__all__:
        if name in ("__version__", "codecs", "predicates", "sources"):
            continue
        assert name in documented | listed, f"{name} is not in docs/reference.md"


def test_documentation_wide_tables_and_code_are_not_cut_off():
    # The readthedocs theme kept every cell on one line in 800px: tables were cut at the right.
    css = (DOCS / "css" / "extra.css").read_text()
    assert "white-space: normal" in css and "max-width: 1200px" in css
    assert "css/extra.css" in load_config()["extra_css"]
