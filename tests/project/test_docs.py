"""The README and docs/ pages link to files and headings that exist: the README keeps the first day's
material and links to the depth in docs/, so a moved section must not leave a dead link behind."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md",
         REPO / "launch" / "README.md"]


def _github_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but `-` and `_` dropped, spaces `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readmes_reading_table_lists_every_docs_page():
    """The README's "Further reading" table is the index of docs/: each page it links exists, and every
    page in docs/ is in it (so the link checks below read every page a user is pointed to)."""
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("## Further reading"):].split("\n## ")[0]
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", table))
    assert linked == {str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")}, linked
    assert all(page.is_file() for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_a_file_and_heading_that_exist(page):
    dead = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            dead.append(target)
        elif anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", linked.read_text(), flags=re.M)
            if anchor not in {_github_anchor(h) for h in headings}:
                dead.append(target)
    assert not dead, dead


def test_the_case_studys_derived_throughput_is_the_timed_epochs_over_its_minutes():
    """The published 7.9 minutes timed 90 epochs (the warm-up epoch ran before the clock): 243,000
    images/sec is 90 epochs' figure, not 91's (246,000)."""
    text = " ".join((REPO / "docs" / "case_study.md").read_text().split())
    found = re.search(r"7\.9 minutes for the (\d+) timed epochs of ([\d,]+) images .*? is about ([\d,]+) "
                      r"images/sec", text)
    assert found, "the derived throughput sentence"
    epochs, images, per_sec = (int(g.replace(",", "")) for g in found.groups())
    assert epochs == 90 and images == 1_281_167
    assert per_sec == pytest.approx(epochs * images / (7.9 * 60), rel=0.005)
