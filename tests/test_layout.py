"""The documented layout cannot go stale.

- README's "Layout" block lists every module and package of ``dpsql/`` (a new one fails
  here until it has its line) and nothing that does not exist;
- every path under ``dpsql/``, ``tests/``, ``benchmarks/``, ``policies/``, ``docs/`` or
  ``examples/`` that a Markdown file of the repository names exists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PACKAGE = ROOT / "dpsql"
#: What a package needs but a reader of the layout does not.
NOT_LISTED = {"__init__.py", "__main__.py", "py.typed"}
#: Paths the docs name that a run creates (gitignored or made by a benchmark's setup).
GENERATED = ("benchmarks/data/", "benchmarks/.venv-smartnoise")
PATH = re.compile(r"(?<![\w/.])((?:dpsql|tests|benchmarks|policies|docs|examples)/[\w./-]*[\w/])")


def layout_entries() -> list[str]:
    """The paths README's Layout block lists (``dpsql/cli/``, ``policies/`` ...)."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1]
    block = section.split("```\n", 2)[1]
    entries, parent = [], ""
    for line in block.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name:
            continue
        if line.startswith(" "):
            entries.append(parent + name)
        else:
            parent = name if name.endswith("/") else ""
            entries.append(name)
    return entries


def test_the_layout_lists_only_what_exists() -> None:
    missing = [entry for entry in layout_entries() if not (ROOT / entry).exists()]
    assert not missing, f"README's Layout lists {missing}, which do not exist: fix or remove their lines"


def test_the_layout_lists_every_module_and_package() -> None:
    listed = set(layout_entries())
    present = {
        f"dpsql/{p.name}/" if p.is_dir() else f"dpsql/{p.name}"
        for p in PACKAGE.iterdir()
        if p.name not in NOT_LISTED and (p.suffix == ".py" or (p / "__init__.py").exists())
    }
    unlisted = sorted(present - listed)
    assert not unlisted, (f"{unlisted} are not in README's Layout: add a line for each under dpsql/ "
                          "saying what it does, in pipeline order")


def _markdown_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
        return [ROOT / line for line in out.stdout.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every Markdown file
        return [p for p in ROOT.rglob("*.md") if ".git" not in p.parts and "node_modules" not in p.parts]


def _generated(path: str) -> bool:
    """A path a run creates (benchmark data, a peer's venv), named with or without its trailing slash."""
    return any(path == prefix.rstrip("/") or path.startswith(prefix) for prefix in GENERATED)


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_named_in_the_docs_exist(doc: Path) -> None:
    named = {m.group(1).rstrip(".") for m in PATH.finditer(doc.read_text(encoding="utf-8"))}
    stale = sorted(p for p in named if "*" not in p and not _generated(p) and not (ROOT / p).exists())
    assert not stale, f"{doc.relative_to(ROOT)} names {stale}, which do not exist: update the paths"
