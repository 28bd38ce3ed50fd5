"""``python -m lib.bench.table``: the stage tables of the README and docs/measurements.md,
written from results folders.

    python -m lib.bench.table results/cpu-amd-epyc-2c results/gpu-a+results/gpu-b   # print it
    python -m lib.bench.table --full results/cpu-amd-epyc-2c                        # with f/s and spread
    python -m lib.bench.table --update README.md docs/measurements.md              # rewrite both pages

Each argument is one machine's column: a bench's results folder (its ``fps.csv`` and
``meta.json``), or several joined by ``+`` where one machine's stages were measured by more than
one bench (a stage's figures come from the first folder that ran it), optionally ending in
``@UNITS`` (``amx``, ``avx512bf16``, ...), the CPU's widest vector units where a folder's
``meta.json`` is older than the bench's record of them. ``--update`` reads the folders from each
page's opening marker (``<!-- stage table from: FOLDER ... -->`` for the narrow table,
``<!-- full stage table from: ... -->`` for the full one; paths relative to the page) and writes
the table up to the closing one (``<!-- end of stage table -->``); a test holds the pages' tables
to what this writes.

The narrow table (the README's) has one column per machine: each stage's f/s as a ratio to stage
01, marked where the stage is not told apart from the one before it. The full table gives per
machine each stage's ratio to 01 with its f/s, and "vs previous", its f/s over the stage before it
(what the one optimisation it adds buys) with the min-max over rounds. Both are followed by the
machines table: per column the machine, bench, learner, torch, date, commit and folder.

Every ratio is taken the bench's way: within each round, then the median over rounds
(``fps.csv``'s ``ratio_to_01`` and ``ratio_to_prev``), so a ratio is not always the quotient of
the medians of f/s shown. A folder of one round has one ratio per stage; across the folders of one
column only benches of one round each are paired, and such a ratio is marked. Where the min-max of
"vs previous" over rounds covers 1.00 the stage is marked: it is not told apart from the one
before it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import textwrap

from lib.run import cli
from lib.run.stages import ARTICLE_HW, ROOT, STAGES

PROG = "python -m lib.bench.table"
START = re.compile(r"^<!-- (?P<full>full )?stage table from:\s+(?P<folders>[^>]*?)\s+-->$", re.M)  # over lines too
END = "<!-- end of stage table -->"
SAME = "†"  # a "vs previous" whose min-max over rounds covers 1.00
CROSS = "‡"  # a ratio between two benches (one-round folders of one column)
ARTICLE_URL = "https://medium.com/mlreview/speeding-up-dqn-on-pytorch-solving-pong-in-30-minutes-81a1bd2dff55"
META_KEYS = ("date", "commit", "hardware", "versions", "settings")  # what a column says of its bench
ISA_WORDS = {"amx": "AMX", "avx512bf16": "AVX-512 bf16", "avx512": "AVX-512", "avx2": "AVX2 only"}
VENDORS = {"Intel", "AMD", "NVIDIA"}  # left out of a column's short name


def _number(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


class Column:
    """One machine: the stages of its folders (fps.csv rows and meta.json), first folder first."""

    def __init__(self, spec: str, root: str = "."):
        self.spec, self.root, self.folders, self.rows = spec, root, [], {}
        folders, _, self.isa = spec.partition("@")
        for folder in folders.split("+"):
            path = os.path.join(root, folder)
            try:
                with open(os.path.join(path, "meta.json")) as f:
                    meta = json.load(f)
                with open(os.path.join(path, "fps.csv"), newline="") as f:
                    rows = list(csv.DictReader(f))
            except (OSError, ValueError) as e:
                raise cli.UsageError(f"{folder}: not a bench's results folder ({type(e).__name__}: {e})") from None
            missing = [k for k in META_KEYS if k not in meta] + [
                c for c in ("stage", "fps") if rows and c not in rows[0]
            ]
            unknown = [row.get("stage") for row in rows if row.get("stage") not in STAGES]
            if missing or unknown or not rows:
                why = (
                    f"lacks {', '.join(missing)}"
                    if missing
                    else f"stages {unknown} not in the registry"
                    if unknown
                    else "no stages"
                )
                raise cli.UsageError(f"{folder}: not a bench's results folder (its meta.json or fps.csv {why})")
            self.folders.append((folder, meta))
            for row in rows:
                if _number(row.get("fps")) is not None and row["stage"] not in self.rows:
                    self.rows[row["stage"]] = dict(row, folder=folder, rounds=self._rounds(row, meta))
        self.meta = self.folders[0][1]
        recorded = self.meta["hardware"].get("isa")
        if self.isa and recorded and self.isa != recorded:
            raise cli.UsageError(f"{spec}: @{self.isa}, but its meta.json records {recorded}")
        self.isa = self.isa or recorded

    @staticmethod
    def _rounds(row: dict, meta: dict) -> int:
        """Rounds that gave the stage's figure (a bench from before rounds ran one pass)."""
        return int(row.get("rounds") or meta["settings"].get("repeat", 1))

    def interrupted(self, stage: str) -> bool:
        """A bench cut short (meta.json's status) was to measure ``stage``."""
        return any(
            meta.get("status") == "interrupted" and stage in meta["settings"].get("stages", ())
            for _, meta in self.folders
        )

    def missing(self, stage: str) -> str:
        """The cell of a stage without f/s: "interrupted" where its bench was cut short (no
        finished bench), else "—"."""
        return "interrupted" if self.interrupted(stage) else "—"

    def fps(self, stage: str) -> float | None:
        row = self.rows.get(stage)
        return row and _number(row["fps"])

    def ratio(self, stage: str, to: str, column: str) -> tuple[float, float, float] | None:
        """(median, min, max) over rounds of ``stage``'s f/s over ``to``'s within a round: the
        folder's own ``column`` (ratio_to_01, ratio_to_prev) where it has one, else the quotient
        of two single-round figures."""
        row, base = self.rows.get(stage), self.rows.get(to)
        if row is None or base is None:
            return None
        prefix = {"ratio_to_01": "ratio", "ratio_to_prev": "ratio_prev"}[column]
        if row["folder"] == base["folder"] and _number(row.get(column)) is not None:
            low, high = _number(row.get(f"{prefix}_min")), _number(row.get(f"{prefix}_max"))
            median = _number(row[column])
            return (median, median if low is None else low, median if high is None else high)
        if row["rounds"] != 1 or base["rounds"] != 1:
            raise cli.UsageError(
                f"{self.spec}: stage {stage} over stage {to} pairs benches of more than one round "
                f"({row['folder']}, {base['folder']}); only one-round benches are paired across folders"
            )
        value = self.fps(stage) / self.fps(to)
        return (value, value, value)

    def crosses(self, stage: str, to: str) -> bool:
        """Whether ``stage`` over ``to`` divides one bench's f/s by another's."""
        row, base = self.rows.get(stage), self.rows.get(to)
        return row is not None and base is not None and row["folder"] != base["folder"]

    def _model(self) -> str:
        hw = self.meta["hardware"]
        if self.meta["settings"]["device"] == "cuda":
            return hw.get("gpu") or "CUDA device"
        return " ".join(re.sub(r"\((R|TM)\)|\bProcessor\b|\bCPU\b|@.*", "", hw["cpu"]).split())

    def machine(self) -> str:
        """What the machine is, in full: '2-core Intel Xeon, AMX', 'NVIDIA H200, 16 host cores'."""
        hw = self.meta["hardware"]
        if self.meta["settings"]["device"] == "cuda":
            return f"{self._model()}, {hw['cores']} host cores"
        units = f", {ISA_WORDS.get(self.isa, self.isa)}" if self.isa else ""
        return f"{hw['cores']}-core {self._model()}{units}"

    def label(self) -> str:
        """The column's short name: 'H200', 'Xeon AMX', 'EPYC AVX2 quick'."""
        words = [w for w in self._model().split() if w not in VENDORS] or self._model().split()
        if self.isa and self.meta["settings"]["device"] != "cuda":
            words.append(ISA_WORDS.get(self.isa, self.isa).replace(" only", ""))
        return " ".join(words) + (" quick" if self.meta["settings"].get("quick") else "")

    def facts(self) -> dict:
        """What the column is: the bench (kind, rounds x frames, K), the learner, commit, date,
        torch and folder; one value where its folders agree, else each folder's, its stages named."""
        per = []  # (stages "01-05", {fact: value}) for each folder
        for folder, meta in self.folders:
            s = meta["settings"]
            stages = [sid for sid, row in self.rows.items() if row["folder"] == folder]
            rounds = max((self.rows[sid]["rounds"] for sid in stages), default=1)
            kind = "quick" if s.get("quick") else ("full" if _full(meta) else "custom")
            kind += ", interrupted" if meta.get("status") == "interrupted" else ""
            values = {
                "kind": kind,
                "size": f"{rounds} x {s['frames']:,}",
                "bench": f"{kind}, {rounds} x {s['frames']:,}",
                "games": f"K={s['envs']}" if any("envs" in STAGES[sid].knobs for sid in stages) else None,
                "learner": s.get("precision", "bf16")
                if any("precision" in STAGES[sid].knobs for sid in stages)
                else None,
                "commit": meta["commit"],
                "date": meta["date"][:10],
                "torch": meta["versions"]["torch"],
            }
            per.append(("-".join(dict.fromkeys([stages[0], stages[-1]])) if stages else _short(folder), values))

        def joined(key: str, sep: str = "; ") -> str:
            given = [(which, v[key]) for which, v in per if v[key] is not None]
            if len({v for _, v in given}) <= 1:
                return given[0][1] if given else ""
            return sep.join(f"{which}: {v}" for which, v in given)

        out = {key: joined(key) for key in ("bench", "learner", "commit", "date", "torch")}
        sizes = {v["size"] for _, v in per}
        if len(per) > 1 and len(sizes) == 1 and len({v["bench"] for _, v in per}) > 1:  # the size said once
            out["bench"] = "; ".join(f"{which}: {v['kind']}" for which, v in per) + f"; {sizes.pop()}"
        out["bench"] += "".join(f", {v}" for v in [joined("games")] if v)
        if len(per) > 1 and len({v["bench"] for _, v in per}) == 1:  # else the benches are named above
            out["bench"] += f"; {' and '.join(which for which, _ in per)} from two benches"
        out["folder"] = self._folder_link()
        return out

    def _folder_link(self) -> str:
        """A link to the column's folder, or to the folder that holds its folders (and a README)."""
        names = [folder for folder, _ in self.folders]
        parent = os.path.dirname(os.path.normpath(names[0]))
        if len(names) > 1 and all(os.path.dirname(os.path.normpath(n)) == parent for n in names):
            if os.path.isfile(os.path.join(self.root, parent, "README.md")):
                names = [parent]
        return " + ".join(f"[`{_short(n)}`]({n}/README.md)" for n in names)


def _full(meta: dict) -> bool:
    """A bench with its default budgets and every stage of its day (only where it wrote and on what device)."""
    budget = {"--frames", "--sweep-frames", "--repeat", "--stages", "--bound-seconds", "--replay-initial", "--resume"}
    return not any(arg.split("=")[0] in budget for arg in meta.get("argv", []))


def _short(folder: str) -> str:
    """A folder's name below results/."""
    parts = os.path.normpath(folder).split(os.sep)
    return "/".join(parts[parts.index("results") + 1 :]) if "results" in parts else folder


def _ratio_cell(ratio, fps=None, mark=False, cross=False) -> str:
    """'2.95 (101.3)': a ratio to 01 with the stage's f/s; '1.09 (0.99-1.15) †' (``mark``): a
    "vs previous" with its min-max over rounds, marked where that covers 1.00 as printed;
    ``cross``: marked as a ratio between two benches."""
    if ratio is None:
        return "—"
    median, low, high = (round(x, 2) for x in ratio)
    text = f"{median:.2f}" + (f" ({fps:.1f})" if fps is not None else "")
    if fps is None and low != high:
        text += f" ({low:.2f}-{high:.2f})"
    return text + (f" {CROSS}" if cross else "") + (f" {SAME}" if mark and _covers_one(ratio) else "")


def _covers_one(ratio) -> bool:
    """Whether a min-max over rounds (as printed, to two decimals) covers 1.00."""
    median, low, high = (round(x, 2) for x in ratio)
    return low <= 1.0 <= high and low != high


def _article(sid: str, to: str | None) -> str:
    """The article's ratio of ``sid`` to ``to``: the quotient of its f/s; '—' where it has none."""
    fps = STAGES[sid].article_fps
    base = STAGES[to].article_fps if to else None
    return "—" if fps is None or base is None else f"{fps / base:.2f}"


def _wrap(text: str) -> list[str]:
    """A paragraph in lines of at most 100 characters, as the pages' prose is written; inline code
    and a link's text stay on one line (a command is copied whole)."""
    keep = re.sub(r"`[^`]*`|\[[^\]]*\]", lambda m: m.group(0).replace(" ", "\0"), text)
    lines = textwrap.wrap(keep, 100, break_long_words=False, break_on_hyphens=False)
    return [line.replace("\0", " ") for line in lines]


def _columns(specs: list[str], root: str) -> list[Column]:
    columns = [Column(spec, root) for spec in specs]
    labels = [c.label() for c in columns]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise cli.UsageError(f"two columns would be named {repeated[0]!r}; a column is one machine")
    return columns


def _measurements_link(root: str) -> str:
    """docs/measurements.md's table, as a link from a page in ``root``."""
    return os.path.relpath(os.path.join(ROOT, "docs", "measurements.md"), os.path.abspath(root)) + "#measured-here"


def machines_table(columns: list[Column]) -> list[str]:
    """One row per column of the stage table: what machine, bench, learner, torch, date, commit and folder."""
    lines = ["| column | machine | bench: rounds x frames, K | learner of 06-08 | torch | date | commit | folder |",
             "|---" * 8 + "|",
             f"| article | {ARTICLE_HW.split(',')[0]} | the article's table | fp32 | | 2017 | | [the article]({ARTICLE_URL}) |"]  # fmt: skip
    for c in columns:
        f = c.facts()
        cells = [c.label(), c.machine(), f["bench"], f["learner"], f["torch"], f["date"], f["commit"], f["folder"]]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(specs: list[str], root: str = ".") -> str:
    """The narrow table (each stage's ratio to 01 on each machine), the machines table, and two
    sentences on how to read them."""
    columns = _columns(specs, root)
    ids = list(STAGES)
    base = ids[0]
    header = ["stage", "adds", "article"] + [c.label() for c in columns]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for prev, sid in zip([None] + ids, ids):
        stage = STAGES[sid]
        cells = [f"{sid} {stage.name}", stage.gist, _article(sid, base)]
        for c in columns:
            ratio = c.ratio(sid, base, "ratio_to_01") if c.fps(sid) is not None else None
            same = prev is not None and ratio is not None and c.fps(prev) is not None
            same = same and _covers_one(c.ratio(sid, prev, "ratio_to_prev"))
            text = (
                c.missing(sid) if ratio is None else f"{ratio[0]:.2f}" + (f" {CROSS}" if c.crosses(sid, base) else "")
            )
            cells.append(text + (f" {SAME}" if same else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(
        lines
        + [""]
        + machines_table(columns)
        + [""]
        + _wrap(
            f"Each figure is a stage's f/s over stage 01's, taken within each round of a bench and then the median "
            f"over rounds ({CROSS}: over stage 01 of the other bench), and {SAME} marks a stage whose ratio to the "
            "stage before it ranged over 1.00 across rounds, so that the two are not told apart; a machine of one "
            "round has no such spread, and its small differences are not results. "
            f"The f/s, each stage over the one before and their spread are in each folder and in "
            f"[the full table]({_measurements_link(root)}), written with this one by "
            "`python -m lib.bench.table --update README.md docs/measurements.md`."
        )
    )


def render_full(specs: list[str], root: str = ".") -> str:
    """Per machine each stage's ratio to 01 with its f/s and "vs previous" with its spread, the
    machines table, and the lines that say how to read them."""
    columns = _columns(specs, root)
    ids = list(STAGES)
    base = ids[0]
    header = [f"article: vs {base} (f/s)", "vs previous"]
    for c in columns:
        header += [f"{c.label()}: vs {base} (f/s)", "vs previous"]
    lines = ["| stage | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for prev, sid in zip([None] + ids, ids):
        stage = STAGES[sid]
        article = "—" if stage.article_fps is None else f"{_article(sid, base)} ({stage.article_fps})"
        cells = [article, "" if prev is None or stage.article_fps is None else _article(sid, prev)]
        for c in columns:
            fps = c.fps(sid)
            if fps is None:
                cells.append(c.missing(sid))
            else:
                cells.append(_ratio_cell(c.ratio(sid, base, "ratio_to_01"), fps, cross=c.crosses(sid, base)))
            cells.append(
                ""
                if prev is None or fps is None or c.fps(prev) is None
                else _ratio_cell(c.ratio(sid, prev, "ratio_to_prev"), mark=True, cross=c.crosses(sid, prev))
            )
        lines.append(f"| {sid} {stage.name} | " + " | ".join(cells) + " |")
    return "\n".join(
        lines
        + [""]
        + machines_table(columns)
        + [""]
        + _wrap(
            "Ratios are taken within each round, then the median over rounds (not the quotient of the medians "
            f'of f/s shown); "vs previous" shows their min-max over rounds where there was more than one, and '
            f"{SAME} where that covers 1.00: the stage is not told apart from the one before it. A column of one "
            f"round has no spread: its small differences are not results. {CROSS}: a ratio between two benches of "
            "one machine, each of one round. The article's ratios are the quotients of its f/s. Written with the "
            "README's table by `python -m lib.bench.table --update README.md docs/measurements.md`."
        )
    )


def folders_of(page: str) -> list[str]:
    """The folders a page's opening marker names."""
    found = START.search(page)
    if found is None or END not in page[found.end() :]:
        raise cli.UsageError(f"no '<!-- stage table from: FOLDER ... -->' ... '{END}' markers")
    return found["folders"].split()


def is_full(page: str) -> bool:
    """Whether a page's marker asks for the full table."""
    found = START.search(page)
    return bool(found and found["full"])


def table_of(page: str) -> str:
    """The text between a page's markers."""
    found = START.search(page)
    return page[found.end() : page.index(END, found.end())].strip("\n")


def update(path: str) -> None:
    """Rewrite the table between ``path``'s markers from the folders its opening marker names."""
    with open(path) as f:
        page = f.read()
    folders = folders_of(page)
    table = (render_full if is_full(page) else render)(folders, os.path.dirname(os.path.abspath(path)))
    found = START.search(page)
    end = page.index(END, found.end())
    with open(path, "w") as f:
        f.write(page[: found.end()] + "\n\n" + table + "\n\n" + page[end:])  # blank lines: Markdown blocks


def make_parser() -> cli.Parser:
    p = cli.Parser(prog=PROG, description="The stage tables from results folders (one column each).")
    p.add_argument("folders", nargs="*", metavar="FOLDER[+FOLDER][@UNITS]", help="a machine's results folder(s)")
    p.add_argument("--full", action="store_true", help="print the full table: f/s, vs previous and spread")
    p.add_argument(
        "--update",
        nargs="+",
        metavar="PAGE",
        help="rewrite the table between each PAGE's markers, from the folders they name",
    )
    return p


def main(argv=None) -> int:
    p = make_parser()
    try:
        args = p.parse_args(argv)
        if bool(args.folders) == bool(args.update):
            raise cli.UsageError("give FOLDER arguments or --update PAGE, not both or neither")
        if args.update:
            for page in args.update:
                try:
                    update(page)
                except OSError as e:
                    raise cli.UsageError(f"--update {page}: {e.strerror or e}") from None
        else:
            print((render_full if args.full else render)(args.folders))
    except cli.UsageError as e:
        return cli.usage_exit(PROG, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
