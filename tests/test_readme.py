"""README's examples run, so they cannot go stale.

- The Python session ("A short session") and the other self-contained Python blocks run as
  written, in a scratch directory holding ``policies/`` and the demo database under the
  names the README uses; every other Python block must be listed in ``NEEDS_A_SERVER_OR_DATA``
  with the reason it is not run here.
- Every ``$ dpsql ...`` line of a ``console`` block runs (in order, in the same directory,
  in-process through :func:`dpsql.cli.main`) and must exit 0, or 1 with a one-line error
  when the README shows it failing (``error: ...``). The lines shown after it are its
  expected output: each must appear in what the command printed, except lines holding a
  noisy value (a ``±``) and ``...``.
- Every other ``dpsql`` command line in a code block (a server, a 10-minute audit) must at
  least be accepted by the command line's parser, so no option it shows is stale.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest



ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"

#: Python blocks not run here, by the heading they sit under, and why.
NEEDS_A_SERVER_OR_DATA = {
    "The server": "needs a running Flight server and a token",
    "Connect with psql, psycopg or a BI tool": "needs a running Postgres front",
    "Auditing a deployment": "audits take minutes (tests/test_audit.py runs the same API)",
    "Local differential privacy": "a fragment: the client's device id and a local policy file",
    "Data where it lives: Parquet, CSV, DataFrames and Apache Spark": "a fragment: the reader's DataFrame and "
    "SparkSession (tests/test_datasources.py and tests/engines/ run the same calls)",
}


@dataclass(frozen=True)
class Block:
    language: str
    heading: str
    text: str


def readme_blocks() -> list[Block]:
    blocks: list[Block] = []
    heading = ""
    language: str | None = None
    lines: list[str] = []
    for line in README.read_text(encoding="utf-8").splitlines():
        if language is None:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            elif line.startswith("```"):
                language, lines = line[3:].strip(), []
        elif line.startswith("```"):
            blocks.append(Block(language, heading, "\n".join(lines)))
            language = None
        else:
            lines.append(line)
    return blocks


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory as a reader's would be: policies/, and the demo data under the README's names."""
    from dpsql.demo import demo_database

    where = tmp_path_factory.mktemp("readme")
    (where / "policies").symlink_to(ROOT / "policies", target_is_directory=True)
    demo = demo_database(where / "demo.duckdb", rows=100_000, units=10_000)  # the session's call
    (where / "data.duckdb").symlink_to(demo)
    return where


def test_readme_has_the_examples_this_test_runs() -> None:
    blocks = readme_blocks()
    assert any(b.language == "python" and b.heading == "A short session" for b in blocks)
    assert sum(b.language == "console" for b in blocks) >= 1
    python_headings = {b.heading for b in blocks if b.language == "python"}
    assert set(NEEDS_A_SERVER_OR_DATA) <= python_headings  # the skip list names real blocks


@pytest.mark.filterwarnings("ignore:pandas only supports SQLAlchemy")  # it warns for any DB-API connection
def test_python_blocks_run(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    ran = []
    for block in readme_blocks():
        if block.language != "python" or block.heading in NEEDS_A_SERVER_OR_DATA:
            continue
        namespace: dict[str, object] = {"__name__": "__readme__"}
        exec(compile(block.text, f"README.md: {block.heading}", "exec"), namespace)  # noqa: S102
        ran.append((block.heading, namespace))
    headings = [h for h, _ in ran]
    assert "A short session" in headings
    session = dict(ran)["A short session"]
    # what the session's comments claim
    res = session["res"]
    shown = next(b for b in readme_blocks() if b.heading == "A short session").text
    header = re.search(r"print\(res\.format\(\)\)\n# (.*)\n", shown).group(1)  # type: ignore[union-attr]
    assert res.format().splitlines()[0].split() == header.split()
    half_width = re.search(r"half-width of the noise on n: ([\d.,]+)", shown).group(1)  # type: ignore[union-attr]
    assert res.accuracy["n"] == float(half_width.replace(",", ""))


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """``$ command`` lines (with ``\\`` continuations) and the output lines shown after each."""
    out: list[tuple[str, list[str]]] = []
    pending = ""
    for line in text.splitlines():
        if pending:
            pending += " " + line.strip().rstrip("\\")
            if not line.rstrip().endswith("\\"):
                out.append((pending, []))
                pending = ""
        elif line.startswith("$ "):
            command = line[2:].split("  #")[0].strip()
            if command.endswith("\\"):
                pending = command.rstrip("\\")
            else:
                out.append((command, []))
        elif out:
            out[-1][1].append(line)
    return out


def test_console_examples_run(workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from dpsql.cli import main

    monkeypatch.chdir(workdir)
    for name in ("budget.sqlite", "budget.sqlite.answers"):
        (workdir / name).unlink(missing_ok=True)  # the console examples start a fresh ledger
    ran = 0
    for block in readme_blocks():
        if block.language != "console":
            continue
        for command, expected in _commands(block.text):
            words = shlex.split(command)
            assert words[0] == "dpsql", command
            capsys.readouterr()
            code = main(words[1:])
            printed = capsys.readouterr()
            fails = bool(expected) and expected[0].startswith("error: ")  # shown failing: exit 1
            assert code == (1 if fails else 0), f"{command}\n{printed.err}"
            if fails:
                assert "Traceback" not in printed.err and printed.err.count("\n") == 1
            lines = (printed.out + printed.err).splitlines()
            for want in expected:
                if not want.strip() or "±" in want or want.strip() == "...":
                    continue
                assert want.rstrip() in [line.rstrip() for line in lines], f"{command}: missing {want!r}\n{printed.out}"
            ran += 1
    assert ran >= 4


def test_every_other_command_line_parses() -> None:
    from dpsql.cli import _parser

    parser = _parser()
    checked = 0
    for block in readme_blocks():
        if block.language in ("console", "python"):
            continue
        for line in block.text.splitlines():
            line = line.split("  #")[0].strip()
            if not line.startswith("dpsql ") or "[" in line or "..." in line:
                continue  # a synopsis line, not an example
            words = shlex.split(os.path.expandvars(line))
            parser.parse_args(words[1:])  # SystemExit (a test failure) on a stale option
            checked += 1
    assert checked >= 4
