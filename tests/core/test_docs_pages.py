"""The operations docs stay whole and navigable: every section of the one-page
docs/OPERATIONS.md of 608444d still exists under docs/OPERATIONS.md + docs/operations/
(issue 32: split by task, nothing lost), every relative link in README.md and docs/
resolves to a file and, with a #fragment, to a heading there, and the task pages stay
short and their tables narrow."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
OPERATIONS = [DOCS / "OPERATIONS.md", *sorted((DOCS / "operations").glob("*.md"))]
MAX_LINES = 300
MAX_TABLE_LINE = 200

# The headings of `git show 608444d:docs/OPERATIONS.md`, frozen: the split must keep them all.
HEADINGS_AT_608444D = (
    "Operating vllmwatch",
    "Install",
    "Configure",
    "Guarantees under bad input",
    "Bounds: nothing from outside can exhaust or block the watchdog",
    "Moving from a hand-run vLLM",
    "Start, stop, reload",
    "What the daemon promises under signals and stuck probes",
    "Logs",
    "Journal fields (journald's native protocol)",
    "Upgrade",
    "One instance per GPU or model",
    "Behind a load balancer or in Kubernetes",
    "Planned restarts that clients do not see",
    "Running many boxes",
    "The status listener on a fleet",
    "Prometheus scrape config",
    "Labels: how series join",
    "The metrics",
    "Alerts",
    "Dashboard",
    "Log queries",
    "Kubernetes",
    "The load-balancer drain contract",
    "A single box: the `[gate]` front door",
    "Standby: restarts in seconds",
    "vLLM sleep mode",
    "DGX Spark (unified memory)",
    "Container mode (PID 1)",
    "Canary kinds",
    "How long a hang takes to see",
    "Fleet-safe quiet hours",
    "GPU hardware faults",
    "Incidents: why did vLLM hang?",
    "Troubleshooting",
    "Unit settings",
    "Hardening",
    "Testing the units and the package",
)

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks (a `#` in a shell block is no heading)."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _headings(path: Path) -> list[str]:
    return [m.group(1).strip() for line in _prose(path)
            if (m := re.match(r"#{1,6}\s+(.*)", line))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in _headings(path):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _linking_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_every_heading_of_the_one_page_operations_doc_still_exists() -> None:
    now = {h for page in OPERATIONS for h in _headings(page)}
    missing = [h for h in HEADINGS_AT_608444D if h not in now]
    assert not missing, f"sections lost in the split: {missing}"


def test_every_relative_link_in_the_docs_resolves_to_a_file_and_heading() -> None:
    broken = []
    checked = 0
    for source in _linking_files():
        for line in _prose(source):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # http(s), mailto: not this test's business
                checked += 1
                path, _, anchor = target.partition("#")
                dest = (source.parent / path).resolve() if path else source
                where = f"{source.relative_to(REPO)}: {target}"
                if not dest.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    broken.append(f"{where} (no such heading)")
    assert checked > 20, "the link scan found almost nothing: the pattern is broken"
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_index_links_every_task_page() -> None:
    index = (DOCS / "OPERATIONS.md").read_text()
    pages = sorted((DOCS / "operations").glob("*.md"))
    assert len(pages) >= 8
    unlinked = [p.name for p in pages if f"(operations/{p.name}" not in index]
    assert not unlinked, f"task pages the index does not link: {unlinked}"


def test_operations_pages_stay_short_and_their_tables_narrow() -> None:
    too_long, too_wide = [], []
    for page in OPERATIONS:
        lines = page.read_text().splitlines()
        if len(lines) > MAX_LINES:
            too_long.append(f"{page.name}: {len(lines)} lines")
        too_wide += [f"{page.name}:{n}: {len(line)} characters"
                     for n, line in enumerate(lines, 1)
                     if line.startswith("|") and len(line) > MAX_TABLE_LINE]
    assert not too_long, f"pages over {MAX_LINES} lines (split them): {too_long}"
    assert not too_wide, (f"table lines over {MAX_TABLE_LINE} characters (shorten the "
                          "cells, or make the table a list):\n" + "\n".join(too_wide))


def test_the_slug_follows_githubs_rule() -> None:
    assert _slug("DGX Spark (unified memory)") == "dgx-spark-unified-memory"
    assert _slug("A single box: the `[gate]` front door") == "a-single-box-the-gate-front-door"
    assert _slug("Incidents: why did vLLM hang?") == "incidents-why-did-vllm-hang"
