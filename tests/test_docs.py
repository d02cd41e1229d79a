"""README and docs/ stay true: every relative link resolves (to a file, and to a heading for ``#anchor``), every
repository path quoted in backticks exists, every docs page is in docs/index.md, README stays a five-minute read,
and README's sample recipe is a recipe that loads."""

from __future__ import annotations

import re

import pytest

from hf_grpo.recipe import load_recipe

from .helpers.common import REPO


PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
QUOTED_PATH = re.compile(r"`((?:docs|recipes|benchmarks|tests|hf_grpo|accelerate_configs|notebooks)/[\w./-]*[\w/])`")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path) -> set[str]:
    return {slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_and_quoted_paths_resolve(page):
    text = page.read_text()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        if not resolved.exists():
            broken.append(target)
        elif anchor and anchor not in anchors(resolved):
            broken.append(f"{target} (no such heading)")
    broken += [f"`{p}`" for p in QUOTED_PATH.findall(text) if not (REPO / p).exists()]
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_every_docs_page_is_in_the_index():
    index = (REPO / "docs" / "index.md").read_text()
    missing = [p.name for p in PAGES[1:] if p.name != "index.md" and f"]({p.name})" not in index]
    assert not missing, f"docs/index.md does not list {missing}"


def test_readme_is_a_short_read_with_the_two_set_up_commands():
    readme = (REPO / "README.md").read_text()
    assert len(readme.split()) <= 1200, len(readme.split())
    assert "<!-- run-command -->" in readme and "<!-- test-command -->" in readme


def test_readmes_sample_recipe_loads(tmp_path):
    readme = (REPO / "README.md").read_text()
    sample = re.search(r"```yaml\n(.*?)```", readme, re.DOTALL).group(1)
    path = tmp_path / "sample.yaml"
    path.write_text(sample)
    recipe, _ = load_recipe([str(path)], for_run=False)
    assert recipe.values["dynamic_sampling"] is True and recipe.generation.backend == "vllm_server"
    assert recipe.plan.num_processes == 1
