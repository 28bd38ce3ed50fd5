"""``python -m lib.bench.table``: the README's stage table, written from results folders.

    python -m lib.bench.table results/cpu-amd-epyc-2c results/gpu-a+results/gpu-b   # print it
    python -m lib.bench.table --update README.md       # rewrite it between its markers

Each argument is one machine's column: a bench's results folder (its ``fps.csv`` and
``meta.json``), or several joined by ``+`` where one machine's stages were measured by more than
one bench (a stage's figures come from the first folder that ran it). ``--update`` reads the
folders from the page's opening marker (``<!-- stage table from: FOLDER ... -->``, paths relative
to the page) and writes the table up to the closing one (``<!-- end of stage table -->``);
a test holds the README's table to what this writes.

Per machine two columns: each stage's f/s as a ratio to stage 01 with its f/s, and "vs previous",
its f/s over the stage before it (what the one optimisation it adds buys). Every ratio is taken
the bench's way: within each round, then the median over rounds (``fps.csv``'s ``ratio_to_01``
and ``ratio_to_prev``), so a ratio is not always the quotient of the medians of f/s shown. A
folder of one round has one ratio per stage; across the folders of one column only benches of
one round each are paired. Where the min-max of "vs previous" over rounds covers 1.00 the cell is
marked: the stage is not told apart from the one before it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys

from lib import cli
from lib.stages import ARTICLE_HW, STAGES

PROG = "python -m lib.bench.table"
START = re.compile(r"^<!-- stage table from: (?P<folders>[^>]*?) -->$", re.M)
END = "<!-- end of stage table -->"
SAME = "†"  # a "vs previous" whose min-max over rounds covers 1.00
META_KEYS = ("date", "commit", "hardware", "versions", "settings")  # what a column says of its bench
ISA_WORDS = {"amx": "AMX", "avx512bf16": "AVX-512 bf16", "avx512": "AVX-512", "avx2": "AVX2 only"}


def _number(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


class Column:
    """One machine: the stages of its folders (fps.csv rows and meta.json), first folder first."""

    def __init__(self, spec: str, root: str = "."):
        self.spec, self.folders, self.rows = spec, [], {}
        for folder in spec.split("+"):
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

    def label(self) -> str:
        hw, settings = self.meta["hardware"], self.meta["settings"]
        if settings["device"] == "cuda":
            name = hw.get("gpu") or "CUDA device"
        else:
            cpu = re.sub(r"\((R|TM)\)|\bProcessor\b|\bCPU\b|@.*", "", hw["cpu"])
            name = f"{hw['cores']}-core {' '.join(cpu.split())}"
            if hw.get("isa"):
                name += f", {ISA_WORDS.get(hw['isa'], hw['isa'])}"
        return name + (" (quick)" if settings.get("quick") else "")

    def facts(self) -> dict:
        """What the column is: the bench (kind, rounds, budget, K), the learner, commit, date,
        torch and folder; one value where its folders agree, else each folder's, its stages named."""
        per = []  # (stages "01-05", {fact: value}) for each folder
        for folder, meta in self.folders:
            s = meta["settings"]
            stages = [sid for sid, row in self.rows.items() if row["folder"] == folder]
            rounds = max((self.rows[sid]["rounds"] for sid in stages), default=1)
            kind = "quick bench" if s.get("quick") else ("full bench" if _full(meta) else "custom bench")
            kind += ", interrupted" if meta.get("status") == "interrupted" else ""
            values = {
                "bench": f"{kind}, {rounds} round{'s' if rounds > 1 else ''} of {s['frames']:,} frames",
                "games": f"K={s['envs']} games" if any("envs" in STAGES[sid].knobs for sid in stages) else None,
                "learner": s.get("precision", "bf16")
                if any("precision" in STAGES[sid].knobs for sid in stages)
                else None,
                "commit": meta["commit"],
                "date": meta["date"][:10],
                "torch": meta["versions"]["torch"],
                "folder": f"[`{_short(folder)}`]({folder}/README.md)",
            }
            per.append(("-".join(dict.fromkeys([stages[0], stages[-1]])) if stages else _short(folder), values))

        def joined(key: str, sep: str = "; ") -> str:
            given = [(which, v[key]) for which, v in per if v[key] is not None]
            if len({v for _, v in given}) <= 1:
                return given[0][1] if given else ""
            return sep.join(f"{which}: {v}" for which, v in given)

        out = {key: joined(key) for key in ("bench", "learner", "commit", "date", "torch")}
        out["bench"] += "".join(f", {v}" for v in [joined("games")] if v)
        if len(per) > 1:
            out["bench"] += f"; {' and '.join(which for which, _ in per)} from separate benches"
        out["folder"] = " + ".join(v["folder"] for _, v in per)
        return out


def _full(meta: dict) -> bool:
    """A bench with its default budgets and every stage of its day (only where it wrote and on what device)."""
    budget = {"--frames", "--sweep-frames", "--repeat", "--stages", "--bound-seconds", "--replay-initial", "--resume"}
    return not any(arg.split("=")[0] in budget for arg in meta.get("argv", []))


def _short(folder: str) -> str:
    """A folder's name below results/."""
    parts = os.path.normpath(folder).split(os.sep)
    return "/".join(parts[parts.index("results") + 1 :]) if "results" in parts else folder


def _ratio_cell(ratio, fps=None, mark=False) -> str:
    """'2.95 (101.3)': a ratio to 01 with the stage's f/s; '1.09 (0.99-1.15) †' (``mark``): a
    "vs previous" with its min-max over rounds, marked where that covers 1.00 as printed."""
    if ratio is None:
        return "not run"
    median, low, high = (round(x, 2) for x in ratio)
    text = f"{median:.2f}" + (f" ({fps:.1f})" if fps is not None else "")
    if fps is None and low != high:
        text += f" ({low:.2f}-{high:.2f})"
    return text + (f" {SAME}" if mark and low <= 1.0 <= high and low != high else "")


def render(specs: list[str], root: str = ".") -> str:
    """The table, its rows of what each column is, and the lines that say how to read it."""
    columns = [Column(spec, root) for spec in specs]
    ids = list(STAGES)
    base = ids[0]
    header = [f"article, {ARTICLE_HW}: vs {base} (f/s)", "vs previous"]
    for c in columns:
        header += [f"{c.label()}: vs {base} (f/s)", "vs previous"]
    lines = ["| stage | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for prev, sid in zip([None] + ids, ids):
        stage = STAGES[sid]
        article = STAGES[base].article_fps
        cells = (
            ["—", ""] if stage.article_fps is None else [f"{stage.article_fps / article:.2f} ({stage.article_fps})", ""]
        )
        if prev is not None and stage.article_fps is not None and STAGES[prev].article_fps is not None:
            cells[1] = f"{stage.article_fps / STAGES[prev].article_fps:.2f}"
        for c in columns:
            fps = c.fps(sid)
            missing = "interrupted" if c.interrupted(sid) else "not run"  # a bench cut short is no finished one
            cells.append(_ratio_cell(c.ratio(sid, base, "ratio_to_01"), fps) if fps is not None else missing)
            cells.append(
                "" if prev is None or fps is None else _ratio_cell(c.ratio(sid, prev, "ratio_to_prev"), mark=True)
            )
        lines.append(f"| {sid} {stage.name} | " + " | ".join(cells) + " |")
    facts = [c.facts() for c in columns]
    article = {"bench": "the article's table", "learner": "fp32", "commit": "", "date": "2017", "torch": "",
               "folder": "[the article](https://medium.com/mlreview/speeding-up-dqn-on-pytorch-solving-pong-in-30-minutes-81a1bd2dff55)"}  # fmt: skip
    for key in ("bench", "learner", "commit", "date", "torch", "folder"):
        cells = [article[key], ""] + [cell for f in facts for cell in (f[key], "")]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(
        lines
        + [
            "",
            f"Ratios are taken within each round, then the median over rounds (not the quotient of the medians "
            f'of f/s shown); "vs previous" shows their min-max over rounds where there was more than one, and '
            f"{SAME} where that covers 1.00: the stage is not told apart from the one before it. A column of one "
            "round has no spread: its small differences are not results. The article's ratios are the quotients "
            "of its f/s. Written by `python -m lib.bench.table --update README.md` from the folders named in the "
            "comment above the table.",
        ]
    )


def folders_of(page: str) -> list[str]:
    """The folders a page's opening marker names."""
    found = START.search(page)
    if found is None or END not in page[found.end() :]:
        raise cli.UsageError(f"no '<!-- stage table from: FOLDER ... -->' ... '{END}' markers")
    return found["folders"].split()


def table_of(page: str) -> str:
    """The text between a page's markers."""
    found = START.search(page)
    return page[found.end() : page.index(END, found.end())].strip("\n")


def update(path: str) -> None:
    """Rewrite the table between ``path``'s markers from the folders its opening marker names."""
    with open(path) as f:
        page = f.read()
    folders = folders_of(page)
    table = render(folders, os.path.dirname(os.path.abspath(path)))
    found = START.search(page)
    end = page.index(END, found.end())
    with open(path, "w") as f:
        f.write(page[: found.end()] + "\n\n" + table + "\n\n" + page[end:])  # blank lines: Markdown blocks


def make_parser() -> cli.Parser:
    p = cli.Parser(prog=PROG, description="The README's stage table from results folders (one column each).")
    p.add_argument("folders", nargs="*", metavar="FOLDER[+FOLDER]", help="a machine's results folder(s)")
    p.add_argument(
        "--update", metavar="PAGE", help="rewrite the table between PAGE's markers, from the folders they name"
    )
    return p


def main(argv=None) -> int:
    p = make_parser()
    try:
        args = p.parse_args(argv)
        if bool(args.folders) == bool(args.update):
            raise cli.UsageError("give FOLDER arguments or --update PAGE, not both or neither")
        if args.update:
            try:
                update(args.update)
            except OSError as e:
                raise cli.UsageError(f"--update {args.update}: {e.strerror or e}") from None
        else:
            print(render(args.folders))
    except cli.UsageError as e:
        return cli.usage_exit(PROG, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
