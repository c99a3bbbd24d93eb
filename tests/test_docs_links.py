"""Every relative link in README.md and docs/*.md reaches a file, and its #anchor a heading there.

Anchors follow GitHub's rule for headings: the heading's text, lower case,
punctuation other than '-' and '_' dropped, spaces turned into '-', and '-1',
'-2'... appended to repeats.  Links inside code blocks and code spans are not links.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.MULTILINE)
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def prose(text: str) -> str:
    """The page without fenced code blocks and code spans."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    body = prose(text)
    return _INLINE.findall(body) + _REFERENCE.findall(body)


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading counts by its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set(_HTML_ANCHOR.findall(page.read_text()))
    for _, heading in _HEADING.findall(_FENCE.sub("", page.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    problems = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # http:, https:, mailto:: not checked here
        path, _, fragment = target.partition("#")
        destination = (page.parent / unquote(path)).resolve() if path else page
        if not destination.exists():
            problems.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and unquote(fragment).lower() not in anchors(destination):
            problems.append(f"{target}: no heading #{fragment} in {destination.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_the_checker_finds_broken_links(tmp_path):
    """The check above can fail: a missing file, a missing heading, and what must not count."""
    (tmp_path / "other.md").write_text("# Other page\n\n## Step 1: `build` it\n\n## Step 1: `build` it\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\nSee [other](other.md#step-1-build-it), [again](other.md#step-1-build-it-1), "
        "[top](#title), [web](https://example.com/x.md) and `[code](nowhere.md)`.\n\n"
        "```\n[fenced](nowhere.md)\n```\n\n"
        "[gone](missing.md) [bad anchor](other.md#step-2) [self](#no-such-heading)\n\n[ref]: missing-too.md\n"
    )
    problems = broken_links(page)
    assert [p.split(":", 1)[0] for p in problems] == [
        "missing.md",
        "other.md#step-2",
        "#no-such-heading",
        "missing-too.md",
    ]
