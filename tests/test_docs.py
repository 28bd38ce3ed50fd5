"""The documentation's promises that can break silently: every relative link in README.md,
docs/*.md and results/README.md leads to a file that exists (and, for ``#anchor``, to a heading
of that file); every test the deviations ledger (docs/ledger.md) names exists; the stage tables of
the README and docs/measurements.md are the ones ``lib.bench.table`` writes from the results
folders they name; the README fits a page; and no page speaks of how the project was made."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

from lib.bench import table
from lib.run.stages import STAGES
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "``", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, inline code marks and punctuation dropped,
    spaces to hyphens ("Stages 07-08: ale-py's vector env" -> "stages-07-08-ale-pys-vector-env")."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    """The anchors of a Markdown file's headings, with GitHub's -1, -2 for repeats."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for match in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M):
        base = slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def shown(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(page: pathlib.Path) -> list[str]:
    """What is wrong with the relative links of a Markdown file: one line per broken link."""
    problems = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{target}: no {shown(dest)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading for #{anchor} in {shown(dest)}")
    return problems


def test_the_pages_exist():
    assert {p.name for p in PAGES} >= {"README.md", "ledger.md", "stages.md", "gpu.md", "measurements.md"}
    assert all(p.exists() for p in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_link_check_sees_a_broken_link_and_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## Stages 07-08: ale-py's vector env\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md) [ok](a.md#stages-07-08-ale-pys-vector-env) ![ok](a.md#top) [web](https://x.org/y)\n"
        "`[not a link](nowhere.md)` [gone](nowhere.md) [bad anchor](a.md#nowhere)\n"
    )
    problems = broken_links(page)
    assert len(problems) == 2
    assert problems[0].startswith("nowhere.md: no ") and problems[1].startswith("a.md#nowhere: no heading")


def test_tests_named_in_the_ledger_exist():
    # Entries name tests as `test_x.py::test_y`, and further ones of the same file as `::test_z`.
    text = (ROOT / "docs" / "ledger.md").read_text()
    named = []
    current = None
    for file, name in re.findall(r"`(test_\w+\.py)?::(test_\w+)`", text):
        current = file or current
        named.append((current, name))
    assert len(named) >= 20 and None not in {file for file, _ in named}
    for file, name in named:
        tree = ast.parse((ROOT / "tests" / file).read_text())
        functions = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert name in functions, f"docs/ledger.md names {file}::{name}, which does not exist"


@pytest.mark.parametrize("name", ["README.md", "docs/measurements.md"])
def test_stage_tables_are_written_from_the_results(name):
    """The README's stage table and docs/measurements.md's full one are what
    ``python -m lib.bench.table`` writes from the results folders their opening markers name: one
    row per registered stage, in order, each figure from a folder's fps.csv and meta.json. After a
    new bench, ``--update README.md docs/measurements.md`` writes them again."""
    page_path = ROOT / name
    page = page_path.read_text()
    folders = table.folders_of(page)
    assert len(folders) >= 4 and all(
        (page_path.parent / f.split("+")[0].split("@")[0] / "fps.csv").is_file() for f in folders
    )
    render = table.render_full if table.is_full(page) else table.render
    assert table.is_full(page) == (name != "README.md")
    assert table.table_of(page) == render(folders, str(page_path.parent))
    rows = re.findall(r"^\| (\d\d) ([^|]+?) \|", table.table_of(page), flags=re.M)
    assert rows == [(s.id, s.name) for s in STAGES.values()]
    if name == "README.md":  # one machine a column: the same folders as the full table's
        full = (ROOT / "docs" / "measurements.md").read_text()
        assert [f.replace("../", "") for f in table.folders_of(full)] == folders


# -- the README fits a page ---------------------------------------------------------------------

WIDEST_LINE = 200  # characters: wider scrolls on GitHub's rendered page
WIDEST_TABLE = 8  # columns of the README's stage table


def too_wide(page: str) -> list[str]:
    """What makes a README too wide: its lines over WIDEST_LINE characters, and a stage table of
    more than WIDEST_TABLE columns (counted on its header row)."""
    problems = [
        f"line {i}: {len(line)} characters" for i, line in enumerate(page.splitlines(), 1) if len(line) > WIDEST_LINE
    ]
    header = table.table_of(page).splitlines()[0]
    columns = header.strip().strip("|").count("|") + 1
    if columns > WIDEST_TABLE:
        problems.append(f"stage table: {columns} columns")
    return problems


def test_the_readme_fits_a_page():
    assert too_wide((ROOT / "README.md").read_text()) == []


def test_the_width_check_sees_a_wide_table_and_a_long_line():
    """The README's table with one more machine than the limit allows, or one line too long, fails."""
    page = (ROOT / "README.md").read_text()
    columns = table.table_of(page).splitlines()[0].count("|") - 1
    extra = WIDEST_TABLE + 1 - columns
    wider = page.replace("| stage |", "| stage |" + " more |" * extra, 1)
    assert too_wide(wider) == [f"stage table: {WIDEST_TABLE + 1} columns"]
    assert too_wide(page + "x" * (WIDEST_LINE + 1) + "\n")[0].endswith(f"{WIDEST_LINE + 1} characters")


# -- the pages speak of the project, not of how it was made -------------------------------------

# Words of the project's own making that mean nothing to a reader: an answer to a question the page
# does not ask, the stretches of work and tries behind a result, plans, and what the code once did.
PROCESS_WORDS = re.compile(
    r"^The answer:|\bsittings?\b|\binvocations?\b|\bas planned\b|\bnot gone on\b|\ba first try\b"
    r"|\bthe first try\b|\bfresh clone\b|\bbefore the tree travels\b|\bsandboxed\b|\bfor 15 minutes in all\b"
    r"|\b[Ii]t used to\b|\bused to (?:fail|fall|kill|block)\b",
    re.M,
)
USER_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def process_words(text: str) -> list[str]:
    return [m.group(0) for m in PROCESS_WORDS.finditer(text)]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_speaks_of_how_it_was_made(page):
    assert process_words(page.read_text()) == []


def test_the_process_word_check_sees_them():
    text = (
        "The answer: yes.\nIn two sittings, one invocation, as planned, not gone on after a first try\n"
        "from a fresh clone; it used to fail.\n"
    )
    assert process_words(text) == [
        "The answer:", "sittings", "invocation", "as planned", "not gone on", "a first try", "fresh clone", "it used to",
    ]  # fmt: skip
    assert process_words("An answer: the sitter used a clone.\n") == []


def test_ci_runs_the_readmes_test_command():
    """.ci/run runs the README's test command (with more flags after it, never fewer)."""
    readme = re.findall(r"^    (python -m pytest .+)$", (ROOT / "README.md").read_text(), flags=re.M)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python -m pytest")]
    assert len(readme) == 1 and len(ci) == 1
    assert ci[0] == readme[0] or ci[0].startswith(readme[0] + " ")


def _code_blocks(page: str):
    """(path, [segments of lines]) for each ```python block whose first line is ``# <path>``;
    a line ``...`` splits the block into segments."""
    for block in re.findall(r"```python\n(.*?)```", page, flags=re.S):
        lines = block.rstrip("\n").split("\n")
        if not lines[0].startswith("# "):
            continue
        segments, current = [], []
        for line in lines[1:]:
            if line == "...":
                segments.append(current)
                current = []
            else:
                current.append(line)
        segments.append(current)
        yield lines[0][2:], [s for s in segments if s]


def _appears_in_order(segments, text_lines) -> bool:
    """Each segment's lines consecutive in ``text_lines``, the segments in their order."""
    start = 0
    for segment in segments:
        for i in range(start, len(text_lines) - len(segment) + 1):
            if text_lines[i : i + len(segment)] == segment:
                start = i + len(segment)
                break
        else:
            return False
    return True


def test_the_tricks_page_quotes_the_scripts_as_they_are():
    """Every code block of docs/tricks.md is in the file it names, line for line, its pieces in
    order, so the page cannot drift from the code it explains."""
    blocks = list(_code_blocks((ROOT / "docs" / "tricks.md").read_text()))
    assert len(blocks) >= 9
    for path, segments in blocks:
        text_lines = (ROOT / path).read_text().split("\n")
        assert _appears_in_order(segments, text_lines), f"docs/tricks.md quotes {path} as it no longer is"
    # The check itself: a line changed, or two pieces swapped, is caught.
    path, segments = blocks[0]
    text_lines = (ROOT / path).read_text().split("\n")
    assert not _appears_in_order([[segments[0][0] + " "]], text_lines)
    if len(segments) > 1:
        assert not _appears_in_order(list(reversed(segments)), text_lines)


def documented_flags(text: str) -> dict[str, str]:
    """The flags of docs/stages.md's "Command line (every stage)" table, each with the stages the
    row gives it in parentheses ("02+", "08"), or "" for every stage."""
    section = text.split("## Command line (every stage)", 1)[1].split("\n#", 1)[0]
    flags = {}
    for row in re.findall(r"^\| (.+?) \|", section, flags=re.M):
        for flag, stages in re.findall(r"`(--[a-z][a-z-]*)[^`]*`(?: \((\d\d\+?)\))?", row):
            flags[flag] = stages
    return flags


def stage_flags() -> dict[str, set[str]]:
    """Each flag of the stages' command lines, with the stages that have it."""
    from lib.run.stage_args import make_parser

    flags: dict[str, set[str]] = {}
    for stage in STAGES:
        for action in make_parser(stage, None)._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    flags.setdefault(option, set()).add(stage)
    return flags


def test_the_command_line_table_names_every_flag_of_the_stages():
    """docs/stages.md's table of the stages' flags has each flag a stage takes, no other, and for
    a knob the stages that take it ("02+": 02 and every later stage; "08": that stage alone)."""
    documented = documented_flags((ROOT / "docs" / "stages.md").read_text())
    actual = stage_flags()
    assert sorted(documented) == sorted(actual)
    for flag, stages in actual.items():
        said = documented[flag]
        if not said:
            assert stages == set(STAGES), f"{flag}: the table gives it to every stage, it is in {sorted(stages)}"
        else:
            first = said.rstrip("+")
            wanted = {s for s in STAGES if (s >= first if said.endswith("+") else s == first)}
            assert stages == wanted, f"{flag} ({said}): the stages that take it are {sorted(stages)}"


def test_the_flag_table_check_reads_rows_and_ranges():
    text = "## Command line (every stage)\n\n| flag | meaning |\n|---|---|\n| `--seed N` | x |\n" \
           "| `--steps N` (02+), `--capture {a,b}` (08) | y |\n\n## Next\n| `--not-this` | z |\n"  # fmt: skip
    assert documented_flags(text) == {"--seed": "", "--steps": "02+", "--capture": "08"}
