"""Render docs/results.md, the README's headline and docs/img/goodput-vs-batch.png from benchmarks/data/.

    python benchmarks/report.py            # write docs/results.md, README.md's headline block and the picture
    python benchmarks/report.py --check    # exit 1 with a diff when the page or the README block differs

The page is generated, not written by hand: every figure on it comes from a file under
``benchmarks/data/``, and every table names that file and the command that measured it. The README's
headline (the caption under its picture and the paragraph after it) is rendered from the same rows,
between the markers ``README_BEGIN`` and ``README_END``; the rest of README.md is kept. ``--check``
compares the markdown only (the picture depends on the installed matplotlib and fonts); the drift
test ``tests/evaluation/test_results_page.py`` runs the same comparison (``check``).

Paired ratios and standard errors come from ``tabletune_pipelines.tuning.served_windows``
(``policy_ratio``, ``summarize``), ``core.stats`` (``mean_se``) and ``tuning.served_verdict``
(``judge_load`` for the verdict at a 3 % tolerance),
the same code the served verification publishes with. A judge's JSON holds its windows and policies but
not the command line that launched it: the ``meta.json`` beside it does (``Launch``, ``read_launch``).
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from tabletune_pipelines.errors import DataFileError
from tabletune_pipelines.options import Bound, check_value

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
H200 = DATA / "h200"
PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
README_BEGIN, README_END = "<!-- report:headline -->", "<!-- /report:headline -->"
PICTURE = ROOT / "docs" / "img" / "goodput-vs-batch.png"
TOLERANCE = 0.03
MAX_NUM_SEQS, K = 128, 3
JUDGE = "python benchmarks/gpu_served.py judge"
CALIBRATED_ALL = "benchmarks/data/h200/2026-12-03-moe-served-calibration/moe-served-calibrated-all.json"

#: Every judge launch on the H200 is described by a ``meta.json`` beside its data (in its folder; for a
#: launch whose JSON sits at the top of benchmarks/data/h200/, ``<name>.meta.json``): see ``Launch``.
META = "meta.json"
#: The launch the picture draws: every load from 1 to 128 in one launch.
PICTURE_LAUNCH = "dense-served-judge.json"

#: The controller under steady load, one launch per engine: data, command.
STEADY = [
    ("2026-12-04-dense-controller-steady-island-merge/dense-controller-steady.json",
     "python benchmarks/gpu_controller.py --engine dense --served-prior --hook-loads 1,128 --hook-window 5 "
     '--repair-loads "" --steady "128:cliff,128:quartered,64:quartered" --converge 40 --steady-rounds 3 '
     "--steady-window 4 --fixed-k 1,2,3"),
    ("2026-12-04-moe-controller-steady-island-merge/moe-controller-steady.json",
     "python benchmarks/gpu_controller.py --engine moe --served-prior --hook-loads 128 --hook-window 20 "
     '--repair-loads "" --steady "128:cliff,128:quartered" --converge 80 --steady-rounds 2 --steady-window 4 '
     "--fixed-k 1,2,3"),
]
REPAIR = ("dense-controller.json", "2026-12-01",
          "python benchmarks/gpu_controller.py --engine dense --hook-loads 1,128 --repair-loads 64,128 --rounds 2 "
          "--window 5 --settle 2")

#: The tuning flow on the GPU machine, one run each: data folder, date, commands.
FLOWS = [
    ("2026-12-03-moe-flow-profile-derive", "2026-12-03",
     ["bash deploy/gpu/h200.sh flow moe --steps profile,derive --batch-sizes 1,2,4,8,16,32,64,96,128"]),
    ("2026-12-04-moe-flow", "2026-12-04",
     ["bash deploy/gpu/h200.sh flow moe --steps profile,derive --batch-sizes 1,2,4,8,16,32,64,96,128 "
      "--remeasure-budget 20",
      "bash deploy/gpu/h200.sh flow moe --steps publish --verify-budget 200"]),
]
#: The flow on one launch on an H100 (two device calls, the store kept between them): folder, date, calls.
ONE_LAUNCH = ("2026-12-05-dense-one-launch-flow", "2026-12-05",
              [("cold-profile-verify", "bash deploy/gpu/flow_call.sh dense 480 --verify-loads 128,64 "
                "--verify-window 3 --verify-budget 140"),
               ("warm-publish", "bash deploy/gpu/flow_call.sh dense 480 --steps publish --verify-loads 128,64 "
                "--verify-window 3 --verify-budget 140")])
CPU_EVAL = DATA / "cpu" / "real_engine_eval.json"
ENGINE_SHAPES = {"dense": "Qwen3-4B shape + EAGLE-3", "moe": "Qwen3-30B-A3B shape + EAGLE-3"}
ENGINE_NAMES = {"dense": f"dense ({ENGINE_SHAPES['dense']})", "moe": f"MoE ({ENGINE_SHAPES['moe']})"}
#: The README's MoE sentence: the tables file judged as "a calibrated table", then the recalibrated one.
README_MOE_TABLES = ("benchmarks/data/h200/moe-served-calibrated-all.json", CALIBRATED_ALL)
VERDICT_WORDS = {"pass": "within 3 %", "fail": "**loss beyond the noise**", "inconclusive": "undecided"}


# ----------------------------------------------------------------------------- reading the data files
# Every data file is read like every other input of TableTune: a regular file of bounded size, UTF-8,
# strict JSON (NaN allowed: a policy that never ran has no goodput), a JSON object; a number under
# a key that is a count, a time or a rate (``NONNEGATIVE``) finite and within ``options.Bound``s; a
# key or index the page reads that is not there named with its file. Each problem is one line,
# ``error: <file>: ...``, and exit status 2; nothing is written.
MAX_DATA_BYTES = 64 * 1024 * 1024
NONNEGATIVE = frozenset({
    "budget_s", "elapsed_s", "goodput", "kept_tokens", "launch_s", "load", "loads", "mean_batch",
    "mismatched_steps", "round", "rounds", "seconds", "settle_s", "startup_s", "steps", "stderr", "se", "t_end",
    "t_start", "wall_s", "window_s", "median_ms", "ms", "repetitions_ms", "batch", "batch_size", "max_num_seqs",
    "max_k", "K", "tolerance", "profile", "derive", "publish", "launch"})
"""Keys whose every number is a count, a duration or a rate: never negative, NaN or infinite."""


_READ: list[str] = []
"""The data files read so far, in order (a failure the shape checks do not catch names the last)."""


def _read_text(path: Path) -> str:
    """The UTF-8 text of a data file (a regular file of at most ``MAX_DATA_BYTES``); errors name it."""
    from tabletune_pipelines.formats.strict_io import FileTooLargeError, NotRegularFileError, read_bounded

    name = _rel(path) if path.is_relative_to(ROOT) else str(path)
    _READ.append(name)
    try:
        raw, _ = read_bounded(path, MAX_DATA_BYTES)
    except FileNotFoundError:
        raise DataFileError(f"{name}: data file missing; restore it (git checkout -- {name}) or rerun the "
                            "command the page names for it") from None
    except (IsADirectoryError, NotRegularFileError, FileTooLargeError) as exc:
        raise DataFileError(f"{name}: {exc.strerror or exc}; not a data file") from None
    except OSError as exc:
        raise DataFileError(f"{name}: cannot read it ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataFileError(f"{name}: not UTF-8 (byte {exc.start}); a data file is JSON or a printed log") from None


def _load(path: Path) -> dict:
    """A data file's JSON object, checked (see above); a missing key or index names the file."""
    from tabletune_pipelines.formats import strict_io

    text = _read_text(path)
    name = _READ[-1]
    try:
        doc = strict_io.loads(text, allow_nan=True)
    except ValueError as exc:
        raise DataFileError(f"{name}: not valid JSON ({' '.join(str(exc).split())}); truncated or edited?") from None
    if not isinstance(doc, dict):
        raise DataFileError(f"{name}: a JSON object expected, got a {type(doc).__name__}")
    return _checked(doc, name, "")


class _Object(dict):
    """A JSON object of a data file: a key the page reads that is missing is named with the file."""

    def __init__(self, data: dict, name: str, where: str) -> None:
        super().__init__(data)
        self._name, self._where = name, where

    def __getitem__(self, key):
        try:
            return super().__getitem__(key)
        except KeyError:
            raise DataFileError(f"{self._name}: no {key!r} in {self._where or 'the top-level object'}; not the "
                                "shape this page reads") from None


class _Array(list):
    """A JSON array of a data file: an index the page reads that is missing is named with the file."""

    def __init__(self, data: list, name: str, where: str) -> None:
        super().__init__(data)
        self._name, self._where = name, where

    def __getitem__(self, index):
        try:
            return super().__getitem__(index)
        except IndexError:
            raise DataFileError(f"{self._name}: {self._where} has {len(self)} entries, no [{index}]; not the shape "
                                "this page reads") from None


_AMOUNT = Bound(0.0, 1e15, why="a count, a duration or a rate")


def _checked(value, name: str, where: str, key: str | None = None):
    """``value`` with its objects and arrays wrapped (``_Object``, ``_Array``) and every number under a
    ``NONNEGATIVE`` key checked by ``_AMOUNT``."""
    if isinstance(value, dict):
        return _Object({k: _checked(v, name, f"{where}.{k}" if where else k, k) for k, v in value.items()},
                       name, where)
    if isinstance(value, list):
        return _Array([_checked(v, name, f"{where}[{i}]", key) for i, v in enumerate(value)], name, where)
    if key in NONNEGATIVE and not isinstance(value, str) and value is not None:
        check_value(_AMOUNT, where, value, where=name, error=DataFileError)
    return value


def _windows(rows: Sequence[dict]):
    from tabletune_pipelines.tuning.served_windows import Window

    names = {f.name for f in fields(Window)}
    required = {f.name for f in fields(Window) if f.default is MISSING and f.default_factory is MISSING}
    out = []
    for i, w in enumerate(rows):
        name, where = getattr(rows, "_name", "?"), f"{getattr(rows, '_where', 'windows')}[{i}]"
        if not isinstance(w, dict) or not required <= set(w):
            raise DataFileError(f"{name}: {where} is not a window (needs {sorted(required)})")
        if w["mismatched_steps"] > w["steps"] or w.get("t_end", 0.0) < w.get("t_start", 0.0):
            raise DataFileError(f"{name}: {where}: more mismatched steps than steps, or an end before its start; "
                                "not a measured window")
        out.append(Window(**{k: v for k, v in w.items() if k in names}))
    return out


def _by_round(windows, policy: str, load: int) -> dict[int, float]:
    return {w.round: w.goodput for w in windows
            if w.policy == policy and w.load == load and w.table_verified and w.seconds > 0}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _table(ranges) -> str:
    return "`" + json.dumps(ranges, separators=(",", ":")) + "`"


def _ratio(r: float, se: float, n: int | None = None) -> str:
    if r != r:  # NaN
        return "n/a"
    s = f"{r:.3f}" + (f" ± {se:.3f}" if se == se else "")
    return s + (f" ({n})" if n is not None else "")


def _n(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _same_up_to(a, b, load: int) -> bool:
    from tabletune_pipelines.core.table import DraftTable

    ka, kb = (DraftTable.from_entries(t).vllm_lookup(MAX_NUM_SEQS, K)[1:load + 1] for t in (a, b))
    return ka == kb


# ----------------------------------------------------------------------------- the launches' meta.json
@dataclass(frozen=True)
class Launch:
    """One judge launch on the H200 (``gpu_served.py judge``), as the ``meta.json`` beside its data says."""

    file: str
    """Its judge JSON, relative to benchmarks/data/h200/ (the meta's ``data``, a file beside the meta)."""
    command: str
    """The full command line that measured it: ``python benchmarks/gpu_served.py judge ... --out $OUT``."""
    date: str
    """The day it ran, ``YYYY-MM-DD`` (the folder's date where the folder name starts with one)."""
    ceiling: int
    """The CUDA-graph capture ceiling in tokens: the command's ``--capture-size``, 512 without one."""
    tables: str
    """The tables file it judged, relative to the checkout: the command's ``--tables``."""
    judged: str
    """``tuned`` (a launch of the headline) or ``controller-ended`` (the tables the controller ended on)."""
    sequence: int
    """Its place in the order the judge launches ran, 1 first (the order their data was committed in)."""
    commit: str | None
    """The commit that added its data (a short hash), or None where that is not known."""


JUDGED = ("tuned", "controller-ended")
_META_FIELDS = {"data": str, "command": str, "date": str, "ceiling": int, "tables": str, "judged": str,
                "sequence": int, "commit": (str, type(None))}


def _option(command: str, flag: str) -> str | None:
    """The value after ``flag`` in a command line (quotes kept), or None."""
    parts = command.split()
    return parts[parts.index(flag) + 1] if flag in parts[:-1] else None


def read_launch(path: Path, root: Path = H200) -> Launch:
    """A launch's ``meta.json`` under ``root``, checked: every field present, of its type and agreeing with the command
    line and the files beside it; one ``DataFileError`` naming the file and the field otherwise."""
    doc = _load(path)
    name = _READ[-1]

    def bad(key: str, why: str) -> DataFileError:
        return DataFileError(f"{name}: field {key!r}: {why}")

    for key in doc:
        if key not in _META_FIELDS:
            raise bad(key, f"not a field of a launch's meta.json (its fields: {', '.join(_META_FIELDS)})")
    for key, kind in _META_FIELDS.items():
        if key not in doc:
            raise bad(key, f"missing (a launch's meta.json has {', '.join(_META_FIELDS)})")
        value = doc[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise bad(key, f"{value!r} is not " + {str: "a string", int: "an integer"}.get(kind, "a string or null"))
    data, command, date = doc["data"], doc["command"], doc["date"]
    if "/" in data or not (path.parent / data).is_file():
        raise bad("data", f"{data!r} is not a file beside {path.name}")
    if path.name != META and path.name != f"{Path(data).stem}.{META}":
        raise bad("data", f"{data!r} is not the file {path.name} is named for")
    if not (command.startswith(JUDGE + " ") and command.endswith(" --out $OUT")):
        raise bad("command", f"{command[:60]!r}... is not `{JUDGE} ... --out $OUT`")
    try:
        datetime.date.fromisoformat(date)
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
            raise ValueError
    except ValueError:
        raise bad("date", f"{date!r} is not a date (YYYY-MM-DD)") from None
    folder_date = re.match(r"\d{4}-\d{2}-\d{2}", path.parent.name)
    if path.name == META and folder_date and folder_date.group(0) != date:
        raise bad("date", f"{date!r} differs from the folder's date {folder_date.group(0)!r}")
    capture = _option(command, "--capture-size")
    if str(doc["ceiling"]) != (capture or "512"):
        raise bad("ceiling", f"{doc['ceiling']!r} differs from the command's capture ceiling {capture or '512 (default)'}")
    if doc["tables"] != _option(command, "--tables"):
        raise bad("tables", f"{doc['tables']!r} differs from the command's --tables {_option(command, '--tables')!r}")
    if not (ROOT / doc["tables"]).is_file():
        raise bad("tables", f"{doc['tables']!r} is not a file in the checkout")
    if doc["judged"] not in JUDGED:
        raise bad("judged", f"{doc['judged']!r} is not one of {', '.join(JUDGED)}")
    if doc["sequence"] < 1:
        raise bad("sequence", f"{doc['sequence']!r} is below 1")
    commit = doc["commit"]
    if commit is not None and not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        raise bad("commit", f"{commit!r} is not a commit hash (7 to 40 hex digits) or null")
    file = (path.parent / data).relative_to(root).as_posix() if path.is_relative_to(root) else data
    return Launch(file=file, command=command, date=date, ceiling=doc["ceiling"], tables=doc["tables"],
                  judged=doc["judged"], sequence=doc["sequence"], commit=commit)


def launches(judged: str = "tuned", root: Path = H200) -> list[Launch]:
    """The judge launches under ``root`` whose meta says ``judged``, in the order they ran (``sequence``);
    two launches with one sequence number are an error naming both."""
    paths = [*sorted(root.glob(f"*/{META}")), *sorted(root.glob(f"*.{META}"))]
    every = [read_launch(p, root) for p in paths]
    seen: dict[int, Path] = {}
    for path, launch in zip(paths, every):
        if launch.sequence in seen:
            first, name = (_rel(q) if q.is_relative_to(ROOT) else str(q) for q in (seen[launch.sequence], path))
            raise DataFileError(f"{name}: field 'sequence': {launch.sequence} is also {first}'s")
        seen[launch.sequence] = path
    return sorted((x for x in every if x.judged == judged), key=lambda x: x.sequence)


def ended_launch() -> Launch:
    """The one launch that judged the tables the controller ended on."""
    ended = launches("controller-ended")
    if len(ended) != 1:
        raise DataFileError(f"benchmarks/data/h200: {len(ended)} launches judged 'controller-ended', one expected")
    return ended[0]


# ----------------------------------------------------------------------------- judged launches
def judged_rows(rel: str, date: str, ceiling: int, candidate: str = "served", tables: str = "") -> list[dict]:
    """One row per load of a judge launch: the candidate against the best fixed k (``judge_load``) and
    against the docs' table (``policy_ratio``); ``tables`` is the tables file the launch judged."""
    from tabletune_pipelines.tuning.served_verdict import judge_load
    from tabletune_pipelines.tuning.served_windows import policy_ratio, summarize

    doc = _load(H200 / rel)
    windows = _windows(doc["windows"])
    policies = doc["policies"]
    fixed = [p for p in policies if p.startswith("fixed_k")]
    summary = summarize(windows)
    engine = "moe" if "moe" in rel else "dense"
    rows = []
    for load in sorted({w.load for w in windows}):
        v = judge_load(load, _by_round(windows, candidate, load),
                       {p: _by_round(windows, p, load) for p in fixed}, tolerance=TOLERANCE)
        best = v.best_fixed
        best_k = int(best.removeprefix("fixed_k")) if best else None
        same_docs = _same_up_to(policies[candidate], policies["docs"], load)
        rd, sed, nd = policy_ratio(windows, candidate, "docs", load)
        rows.append({
            "engine": engine, "load": load, "date": date, "ceiling": ceiling, "table": policies[candidate],
            "best": best_k, "best_goodput": summary[(best, load)].goodput if best else float("nan"),
            "best_se": summary[(best, load)].stderr if best else float("nan"),
            "ratio": v.ratio if v.ratio is not None else float("nan"),
            "se": v.ratio_se if v.ratio_se is not None else float("nan"), "rounds": v.rounds,
            "status": v.status, "aa": best is not None and _same_up_to(policies[candidate], policies[best], load),
            "docs": None if same_docs else (rd, sed, nd), "file": rel, "tables": tables,
            "docs_table": policies["docs"],
        })
    return rows


def tuned_tables() -> dict[str, tuple[str, list]]:
    """engine -> (file, table): the table the tuner derives from each engine's committed profile, priced
    by what serving pays (``gpu_served.py profile``; the MoE flow run publishes the same table)."""
    return {engine: (f"{engine}-served.json", _load(H200 / f"{engine}-served.json")["served"])
            for engine in ("dense", "moe")}


def launch_rows() -> list[dict]:
    """Every judged load of every headline launch (``launches``), by engine, ceiling, load and date."""
    rows = [r for x in launches() for r in judged_rows(x.file, x.date, x.ceiling, tables=x.tables)]
    rows.sort(key=lambda r: (r["engine"], r["ceiling"], r["load"], r["date"]))
    return rows


def best_row(rows: Sequence[dict]) -> dict | None:
    """The row with the most paired rounds (the latest on a tie), or None."""
    return max(rows, key=lambda r: (r["rounds"], r["date"])) if rows else None


def chosen_rows(rows: Sequence[dict], tuned: dict[str, tuple[str, list]]) -> dict[tuple[str, int], dict | None]:
    """(engine, load) -> the headline's row: per load, the launch with the most paired rounds whose table
    runs the engine's tuned table's k at every batch size up to the load (512-token ceiling)."""
    return {(engine, load): best_row([r for r in rows if r["engine"] == engine and r["load"] == load
                                      and r["ceiling"] == 512 and _same_up_to(r["table"], table, load)])
            for engine, (_, table) in tuned.items()
            for load in sorted({r["load"] for r in rows if r["engine"] == engine})}


def headline(rows: Sequence[dict]) -> list[str]:
    out = ["## Headline: the tuned table against the best fixed k and the docs' table", "",
           "GPU: H200 (every judge launch in `benchmarks/data/h200/`), vLLM 0.26.0, Model Runner V2, "
           "FULL_AND_PIECEWISE CUDA graphs at the default 512-token capture ceiling, dummy weights, synthetic "
           "acceptance (0.7, 0.5, 0.3), max_num_seqs 128, K = 3. Each launch serves a closed loop of `load` "
           "clients (32-token prompts, 32–128 output tokens) and hot-swaps every policy in it, window by window, "
           "in an order that rotates from round to round; kept tokens are counted from the engine's step log, "
           "and every window is checked against it. Ratios are paired by round: the mean of (table / other) over "
           "the rounds ± its standard error, rounds in brackets. Verdict: "
           "`tuning.served_verdict.judge_load` at a "
           "3 % tolerance, the rule the served verification publishes with: within 3 % when the paired 95 % "
           "interval lies above 0.97, a loss when it lies below, undecided when it straddles 0.97. *A/A*: at "
           "that load the table runs the best fixed k's k at every batch size a closed loop reaches, so the "
           "ratio measures the noise. The docs' table is `[[1,64,3],[65,128,1]]`; \"=\" where it runs the same "
           "k as the table at every batch size up to the load.", ""]
    tuned = tuned_tables()
    owner = {_table(tb): engine_short(e) for e, (_, tb) in tuned.items()}
    published = "".join(f" The flow run `{folder}/` publishes {_table(doc['published_table'])}, the "
                        f"{owner.get(_table(doc['published_table']), 'no')} engine's tuned table."
                        for folder, doc in flow_publishes())
    out += ["The tuned table of each engine: " + "; ".join(
        f"{ENGINE_NAMES[e]} {_table(table)} (`benchmarks/data/h200/{f}`)" for e, (f, table) in tuned.items())
        + "." + published + " Per load, the launch with the most paired rounds that ran it (the latest on a tie; "
        "a launch counts when its table runs the same k at every batch size up to the load):", "",
        "| engine | load | table / best fixed k | table / docs' table | verdict | launch |",
        "|---|---|---|---|---|---|"]
    for (engine, load), r in chosen_rows(rows, tuned).items():
        if r is None:
            out.append(f"| {engine_short(engine)} | {load} | not judged | | | |")
            continue
        docs = "=" if r["docs"] is None else _ratio(*r["docs"])
        out.append(f"| {engine_short(engine)} | {load} | {_ratio(r['ratio'], r['se'], r['rounds'])} of k = "
                   f"{r['best']} | {docs} | {VERDICT_WORDS[r['status']]}{' (A/A)' if r['aa'] else ''} | "
                   f"{r['date']}, `{r['file'].split('/')[0]}` |")
    out += ["", "### Every judged launch", ""]
    for engine in ("dense", "moe"):
        mine = [r for r in rows if r["engine"] == engine and r["ceiling"] == 512]
        counts = {s: sum(r["status"] == s for r in mine) for s in ("pass", "inconclusive", "fail")}
        fails = [f"load {r['load']} ({r['date']}, {_table(r['table'])}: {_ratio(r['ratio'], r['se'])} of "
                 f"k = {r['best']})" for r in mine if r["status"] == "fail"]
        differ = [r for r in mine if r["docs"] is not None]
        docs_line = ""
        if differ:
            lo = min(differ, key=lambda r: r["docs"][0])
            hi = max(differ, key=lambda r: r["docs"][0])
            docs_line = (f" Against the docs' table where they differ: from {_ratio(*lo['docs'][:2])} (load "
                         f"{lo['load']}, {lo['date']}) to {_ratio(*hi['docs'][:2])} (load {hi['load']}, {hi['date']}).")
        near = sum(r["ratio"] >= 1 - TOLERANCE for r in mine)
        tables = _n(len({_table(r["table"]) for r in mine}), "table")
        out.append(f"- **{ENGINE_NAMES[engine]}**, 512-token ceiling: {len(mine)} judged loads over "
                   f"{len({r['file'] for r in mine})} launches and {tables}; "
                   f"point estimate within 3 % of the best fixed k at {near}; verdict {counts['pass']} within 3 %, "
                   f"{counts['inconclusive']} undecided, {counts['fail']} a loss beyond the noise"
                   + (": " + "; ".join(fails) if fails else "") + "." + docs_line)
    out += ["", "| engine | ceiling | load | date | table judged | best fixed k, tok/s | table / best fixed k | "
            "table / docs' table | verdict | data (benchmarks/data/h200/) |", "|---" * 10 + "|"]
    for r in rows:
        docs = "=" if r["docs"] is None else _ratio(*r["docs"])
        verdict = VERDICT_WORDS[r["status"]] + (" (A/A)" if r["aa"] else "")
        out.append(f"| {engine_short(r['engine'])} | {r['ceiling']} | {r['load']} | {r['date']} | "
                   f"{_table(r['table'])} | k = {r['best']}, {r['best_goodput']:.0f} ± {r['best_se']:.0f} | "
                   f"{_ratio(r['ratio'], r['se'], r['rounds'])} | {docs} | {verdict} | `{r['file']}` |")
    out += ["", "Reproduce (one launch per line; `$OUT` a fresh folder; `bash deploy/gpu/h200.sh` runs the same on "
            "the GPU machine):", "", "```"]
    out += [f"{x.command}   # {x.file.split('/')[0]}" for x in launches()]
    out += ["```", ""]
    return out


def flow_publishes() -> list[tuple[str, dict]]:
    """(folder, publish JSON) of each flow run that published a table."""
    out = []
    for folder, _, _ in FLOWS:
        for p in sorted((H200 / folder).glob("*publish.json")):
            out.append((folder, _load(p)))
    return out


def window_phrase(command: str) -> str:
    """'1.5-s windows at loads 1 and 32, 3.5-s at 64, 96 and 128' from a judge's ``--loads`` argument."""
    groups = [g.split(":") for g in command.split('--loads "')[1].split('"')[0].split(";")]

    def loads(s: str) -> str:
        xs = s.split(",")
        return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]
    return "; ".join(f"{w}-s windows at load{'s' if ',' in ls else ''} {loads(ls)}" for ls, w in groups)


def engine_short(engine: str) -> str:
    return "MoE" if engine == "moe" else "dense"


# ----------------------------------------------------------------------------- the picture
PICTURE_POLICIES = {"fixed_k1": "fixed k = 1", "fixed_k2": "fixed k = 2", "fixed_k3": "fixed k = 3",
                    "docs": "docs' table", "served": "tuned table"}


def picture_series() -> tuple[list[int], dict[str, list[tuple[float, float]]], dict]:
    from tabletune_pipelines.tuning.served_windows import summarize

    doc = _load(H200 / PICTURE_LAUNCH)
    summary = summarize(_windows(doc["windows"]))
    loads = sorted({load for _, load in summary})
    series = {p: [(summary[(p, load)].goodput, summary[(p, load)].stderr) for load in loads]
              for p in PICTURE_POLICIES if all((p, load) in summary for load in loads)}
    return loads, series, doc["policies"]


def picture_section() -> list[str]:
    loads, series, policies = picture_series()
    rounds = max(w["round"] for w in _load(H200 / PICTURE_LAUNCH)["windows"]) + 1
    command = next(x.command for x in launches() if x.file == PICTURE_LAUNCH)
    out = ["## Goodput against load, one launch", "",
           "![goodput against load: the tuned table and each fixed k](img/goodput-vs-batch.png)", "",
           f"The dense engine at loads {', '.join(map(str, loads))} in one launch ({rounds} rounds; "
           f"{window_phrase(command)}). Goodput in kept tokens per second, pooled over the rounds ± the "
           f"standard error across rounds. The tuned table is {_table(policies['served'])}" + same_k(loads, policies)
           + ".", "",
           "| policy | " + " | ".join(f"load {load}" for load in loads) + " |", "|---|" + "---|" * len(loads)]
    for p, label in PICTURE_POLICIES.items():
        if p in series:
            out.append(f"| {label} | " + " | ".join(f"{g:.0f} ± {se:.0f}" for g, se in series[p]) + " |")
    out += ["", f"Data: `benchmarks/data/h200/{PICTURE_LAUNCH}`. Reproduce: `{command}`.", ""]
    return out


def same_k(loads: Sequence[int], policies: dict) -> str:
    """'; at loads 1, 32 and 64 it runs the same k as the docs' table at every batch size ...' (or '')."""
    same = [str(load) for load in loads if _same_up_to(policies["served"], policies["docs"], load)]
    if not same:
        return ""
    where = same[0] if len(same) == 1 else ", ".join(same[:-1]) + " and " + same[-1]
    return (f"; at load{'s' if len(same) > 1 else ''} {where} it runs the same k as the docs' table at every "
            "batch size a closed loop reaches, so the two lines differ there by the launch's noise only")


def render_picture(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads, series, _ = picture_series()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    styles = {"served": dict(color="black", lw=2.4, marker="o"), "docs": dict(color="tab:red", ls="--", marker="s")}
    for p, label in PICTURE_POLICIES.items():
        if p not in series:
            continue
        g = [x for x, _ in series[p]]
        se = [s for _, s in series[p]]
        ax.errorbar(loads, g, yerr=se, label=label, capsize=3, **styles.get(p, dict(marker=".", alpha=0.8)))
    ax.set_xlabel("load (closed-loop clients; the batch the engine runs)")
    ax.set_ylabel("goodput, kept tokens / s")
    ax.set_title("H200, dense Qwen3-4B shape + EAGLE-3, acceptance (0.7, 0.5, 0.3)")
    ax.set_xticks(loads)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


# ----------------------------------------------------------------------------- the controller
def controller_section() -> list[str]:
    from tabletune_pipelines.core.stats import mean_se

    out = ["## The controller", "",
           "### Recovery and switches under steady load", "",
           "The controller runs inside vLLM (one launch per engine, synthetic acceptance (0.7, 0.5, 0.3), the "
           "published file carrying the engine's served model) from a start table: *cliff* `[[1,128,3]]` or "
           "*quartered* (the tuned table's ranges cut to a quarter, k = 0 above). After the convergence run, "
           "the table it ended on is measured against each fixed k in rounds (paired by round, ratio ± s.e.). "
           "Switches per hour are counted over the last third of the run.", "",
           "| engine | load | start | run | table it ended on | ranges | switches / h, last third | "
           "best fixed k, tok/s | ended / best fixed k |", "|---|---|---|---|---|---|---|---|---|"]
    hooks = []
    for rel, cmd in STEADY:
        doc = _load(H200 / rel)
        engine = doc["engine"]
        converge = cmd.split("--converge ")[1].split()[0]
        for load, res in sorted(doc["steady"].items(), key=lambda kv: -int(kv[0])):
            best = res["best_fixed"]
            g, gse = mean_se(res["goodput"][best])
            for start, c in res["controller"].items():
                r, se = res["vs_best"][f"ended<-{start}"]
                out.append(f"| {engine_short(engine)} | {load} | {start} | {converge} s | {_table(c['ended_on'])} | "
                           f"{c['ranges']} | {c['steady_switches_per_hour']:.0f} | {best.replace('k=', 'k = ')}, "
                           f"{g:.0f} ± {gse:.0f} | {_ratio(r, se, len(res['goodput'][best]))} |")
        for load, h in sorted(doc["hook"].items(), key=lambda kv: int(kv[0])):
            hooks.append((engine, int(load), h, rel))
    out += ["", "Data: " + ", ".join(f"`benchmarks/data/h200/{rel}`" for rel, _ in STEADY) + ". Reproduce:", "",
            "```", *[cmd for _, cmd in STEADY], "```", ""]

    rel, date, cmd = REPAIR
    doc = _load(H200 / rel)
    out += ["### Repair from a wrong table", "",
            f"The dense engine (a {date} launch, the controller as it was that day), the controller started on "
            f"{_table(doc['wrong'])} (the tuned table {_table(doc['tuned'])} cut to a quarter, k = 0 above), "
            "against the wrong and the tuned table as static tables in the same launch. Gap recovered = "
            "(controller − wrong) / (tuned − wrong), paired by round.", "",
            "| load | wrong, tok/s | tuned, tok/s | controller, tok/s | controller / wrong | controller / tuned | "
            "gap recovered | first table change after |", "|---|---|---|---|---|---|---|---|"]
    for load, x in sorted(doc["repair"].items(), key=lambda kv: int(kv[0])):
        g = {k: mean_se(v)[0] for k, v in x["goodput"].items()}
        cw, ct, gap = x["controller_over_wrong"], x["controller_over_tuned"], x["gap_recovered"]
        after = ", ".join(f"{s} s" for s in x["repaired_after_s"])
        out.append(f"| {load} | {g['wrong']:.0f} | {g['tuned']:.0f} | {g['controller']:.0f} | {_ratio(*cw)} | "
                   f"{_ratio(*ct)} | {100 * gap[0]:.0f} % ± {100 * gap[1]:.0f} % | {after} |")
    out += ["", f"Data: `benchmarks/data/h200/{rel}`. Reproduce: `{cmd}`.", ""]

    out += ["### Hook cost", "",
            "The controller's per-step hook in the engine's scheduler, mean over one window, against the clean decode "
            "step at the k in force and the batch size the window found its clean steps at.", "",
            "| engine | load | hook, µs (mean, max) | clean decode step | hook / step |", "|---|---|---|---|---|"]
    for engine, load, h, _ in hooks:
        out.append(f"| {engine_short(engine)} | {load} | {h['hook_us']:.1f}, {h['hook_us_max']:.1f} | "
                   f"{h['step_ms']:.2f} ms at B = {h['step_b']}, k = {h['k']} | {100 * h['ratio']:.2f} % |")
    out += ["", "Data and commands: the steady-load launches above (`--hook-loads`).", ""]

    ended = ended_launch()
    rel, date = ended.file, ended.date
    rows = judged_rows(rel, date, ended.ceiling) + judged_rows(rel, date, ended.ceiling, candidate="decode_only")
    out += ["### The tables the controller ended on, as static tables", "",
            f"The MoE's two ended tables judged in a launch of their own ({date}, the judge's workload: 32-token "
            "prompts, 32–128 output tokens; the controller's launch sends 16-token prompts and 48–96 tokens).", "",
            "| table | load | best fixed k, tok/s | table / best fixed k | table / docs' table | verdict |",
            "|---|---|---|---|---|---|"]
    for r in rows:
        docs = "=" if r["docs"] is None else _ratio(*r["docs"])
        out.append(f"| {_table(r['table'])} | {r['load']} | k = {r['best']}, {r['best_goodput']:.0f} ± "
                   f"{r['best_se']:.0f} | {_ratio(r['ratio'], r['se'], r['rounds'])} | {docs} | "
                   f"{VERDICT_WORDS[r['status']]} |")
    out += ["", f"Data: `benchmarks/data/h200/{rel}`. Reproduce: `{ended.command}`.", ""]
    return out


# ----------------------------------------------------------------------------- tuning wall time
def flow_section() -> list[str]:
    out = ["## Tuning wall time on the H200", "",
           "The library steps the pipeline's assets call, run on the GPU machine without Dagster "
           "(`benchmarks/gpu_flow.py`): profile (one launch), derive (every gate), verify + publish (a second "
           "launch, the served verification, then the deployment's file). One run each: a single wall time has "
           "no spread to give.", "",
           "| date | engine | profile | derive | verify + publish | whole flow | table | "
           "data (benchmarks/data/h200/) |",
           "|---|---|---|---|---|---|---|---|"]
    verifications = []
    for folder, date, _ in FLOWS:
        docs = {p.name: _load(p) for p in sorted((H200 / folder).glob("*.json")) if "one_launch" not in p.name}
        derive = next(d for d in docs.values() if "profile" in d.get("seconds", {}))
        publish = next((d for d in docs.values() if "publish" in d.get("seconds", {})), None)
        prof, der = derive["seconds"]["profile"], derive["seconds"]["derive"]
        pub = publish["seconds"]["publish"] if publish else None
        whole = f"**{prof + der + pub:.0f} s ({(prof + der + pub) / 60:.1f} min)**" if pub else "not run"
        out.append(f"| {date} | MoE | {prof:.0f} s | {der:.1f} s | {f'{pub:.0f} s' if pub else 'not run'} | {whole} | "
                   f"{_table(derive['table'])} | `{folder}/` |")
        if publish:
            verifications.append((folder, publish["served_goodput_verified"]))
    for folder, v in verifications:
        f = v["figures"]
        out += ["", f"The verification before publishing (`{folder}/`): {f['rounds']} rounds of {f['window_s']}-s "
                f"windows at loads {', '.join(map(str, f['loads']))} in a {f['budget_s']:.0f}-s budget, the second "
                f"launch up in {f['launch_s']:.0f} s. Its recorded verdict: \"{v['description']}\""]
    out += ["", f"Reproduce the {FLOWS[-1][1]} run (one call each, the store kept between them):", "", "```"]
    out += [c for _, _, cmds in FLOWS[-1:] for c in cmds] + ["```", ""]
    return out


def _flow_log(path: Path) -> tuple[dict[str, float], list[str]]:
    """A flow's printed log: the wall seconds of each ``[flow] <step>: N s`` line, and the served
    verification's per-load lines (the last word on each load, and its stop reason)."""
    import re

    seconds, loads = {}, {}
    for line in _read_text(path).splitlines():
        m = re.search(r"\[flow\] (launch|profile|derive|publish): ([0-9.]+) s$", line)
        if m:
            seconds[m.group(1)] = float(m.group(2))
        m = re.search(r"\[served\] load (\d+) after (\d+) round\(s\): (\w+): candidate / best fixed (k=\d) = "
                      r"([0-9.]+) ± ([0-9.]+)", line)
        if m:
            loads[m.group(1)] = (f"load {m.group(1)}: {m.group(5)} ± {m.group(6)} of the best fixed {m.group(4)} "
                                 f"after {m.group(2)} rounds, {m.group(3)}")
        m = re.search(r"\[served\] load (\d+): rounds stopped \((\w+)\)", line)
        if m and m.group(1) in loads:
            loads[m.group(1)] += f" (stopped: {m.group(2)})"
    return seconds, list(loads.values())


def one_launch_section() -> list[str]:
    folder, date, calls = ONE_LAUNCH
    base = DATA / "h100" / folder
    cold, verified = _flow_log(base / calls[0][0] / "stdout.log")
    warm = {c: _load(base / c / "start.json")["startup_s"] for c, _ in calls}
    pub = _load(base / calls[1][0] / "publish.json")
    gate = pub["gates"]["served_goodput_verified"]
    out = [f"## The flow on one launch (H100, {date})", "",
           "The dense engine on an H100 (the device call landed on one; the fleet file says `gpu: H100`): one "
           "vLLM launch serves the profile and then the served verification, the prior's acceptance switched in "
           "at runtime (`benchmarks/gpu_flow.py`, `tuning/flow.py`). One run: a single wall time has no spread.", "",
           "| step | wall time |", "|---|---|",
           f"| launch, cold (compile caches empty) | {cold['launch']:.0f} s |",
           f"| profile (32 cells, 2 repetitions, re-measurement) | {cold['profile']:.0f} s |",
           f"| derive | {cold['derive']:.1f} s |",
           "| launch, warm (compile caches of the first launch, under `$TABLETUNE_HOME/compile-cache/`) | "
           + " and ".join(f"{warm[c]:.0f} s" for c, _ in calls) + " |", "",
           "The served verification on the same launch, before the call's deadline stopped it: "
           + "; ".join(verified) + ". Neither load was decided within the budget.", "",
           f"The second call (publish only) started a warm launch in {pub['seconds']['launch']:.0f} s; that launch "
           "did not acknowledge the rate switch within 30 s, the verification's own launch failed to start "
           "beside it, and nothing was published (gate `served_goodput_verified`: "
           + ("failed" if not gate["passed"] else "passed") + "). Where a launch refuses the switch, `verify_served` "
           "stops it before starting its own (`tests/tuning/test_deployments.py`). The cause: the launch table "
           "opens with `[1, 1, 0]`, the switch's nudge was one request (B = 1, k = 0, no draft), and the rates are "
           "read only when drafts are verified; with no profile before it, nothing else had drafted. The nudge "
           "now runs a gated batch at the smallest B whose k > 0 (`RuntimeControl.nudge_batch`; "
           "`tests/engine/test_runtime_control.py`, and on the CPU build's vLLM "
           "`tests/engine/test_engine_real.py::test_rates_switch_is_acknowledged_where_a_lone_request_does_not_draft`).",
           "",
           f"Data: `benchmarks/data/h100/{folder}/` (printed logs, start-up and publish JSON). Reproduce:", "", "```"]
    out += [cmd for _, cmd in calls] + ["```", ""]
    return out


# ----------------------------------------------------------------------------- the CPU build
def cpu_section() -> list[str]:
    from tabletune_pipelines.tuning.served_verdict import judge_load
    from tabletune_pipelines.tuning.served_windows import policy_ratio, summarize

    doc = _load(CPU_EVAL)
    meta = doc["meta"]
    out = ["## The CPU build", "",
           f"{meta['engine']}, {meta['target']} target + 1-layer draft, K = {meta['K']}, max_num_seqs "
           f"{meta['max_num_seqs']}, on a 2-core machine. The same protocol as the H200 judge (every table "
           "policy hot-swapped in one launch, kept tokens from the step log), with TurboSpec-style, "
           "Nightjar-style and the controller in launches of their own. The tuned table (evidence rule) against "
           "the best fixed k and the docs' table, paired by round:", "",
           "| scenario | acceptance | load | best fixed k, tok/s | tuned / best fixed k | tuned / docs' table | "
           "verdict |", "|---|---|---|---|---|---|---|"]
    worst, commands = [], []
    for name, sc in doc["scenarios"].items():
        windows = _windows(sc["windows"])
        summary = summarize(windows)
        fixed = [p for p in sc["tables"] if p.startswith("k=") and p != "k=0"]
        rates = ", ".join(f"{a:.2f}" for a in sc["rates"])
        for load in sorted({w.load for w in windows}):
            v = judge_load(load, _by_round(windows, "tuned (evidence)", load),
                           {p: _by_round(windows, p, load) for p in fixed}, tolerance=TOLERANCE)
            rd, sed, nd = policy_ratio(windows, "tuned (evidence)", "docs' table", load)
            s = summary[(v.best_fixed, load)]
            se = v.ratio_se if v.ratio_se is not None else float("nan")
            out.append(f"| {name} | ({rates}) | {load} | {v.best_fixed.replace('k=', 'k = ')}, {s.goodput:.0f} ± "
                       f"{s.stderr:.0f} | {_ratio(v.ratio, se, v.rounds)} | "
                       f"{_ratio(rd, sed, nd)} | {VERDICT_WORDS[v.status]} |")
        w = sc["results"]["worst"]
        worst.append(f"{name}: " + ", ".join(f"{p.replace('k=', 'k = ')} {100 * w[p]:.1f} %" for p in (
            "tuned (evidence)", "docs' table", "k=1", "k=2", "k=3", "controller", "TurboSpec-style", "Nightjar-style")
            if p in w) + f" (A/A floor {100 * sc['results']['aa_floor']:.1f} %)")
        if sc.get("meta"):
            commands.append(sc["meta"]["command"])
    out += ["", "Worst loss over the loads against the best fixed k at each load (adaptive policies bridged through "
            "an anchor window of the tuned table in their own launch):", ""]
    out += [f"- {line}" for line in worst]
    out += ["", f"Data: `{_rel(CPU_EVAL)}` (printed output: `benchmarks/data/cpu/real_engine_eval.log`). Reproduce "
            f"({meta['wall_s'] / 60:.0f} min on 2 cores; a later line reruns one scenario into the same file):", "",
            "```", meta["command"]]
    out += [c for c in dict.fromkeys(commands) if c != meta["command"]] + ["```", ""]
    return out


# ----------------------------------------------------------------------------- the README's headline
def _k_at(table, load: int) -> int:
    from tabletune_pipelines.core.table import DraftTable

    return DraftTable.from_entries([list(r) for r in table]).k_at(load)


def _ratio2(r: float, se: float) -> str:
    return f"{r:.2f} ± {se:.2f}"


def _rounds(rows: Sequence[dict]) -> str:
    """'10 paired rounds each, 2026-12-03' when every row shares rounds and date, else each row's."""
    if len({(r["rounds"], r["date"]) for r in rows}) == 1:
        return f"{_n(rows[0]['rounds'], 'paired round')}{' each' if len(rows) > 1 else ''}, {rows[0]['date']}"
    return "paired rounds: " + "; ".join(f"load {r['load']}: {r['rounds']}, {r['date']}" for r in rows)


def readme_headline(rows: Sequence[dict]) -> list[str]:
    """The README's caption under the picture and its headline paragraph, from the rows the page's
    headline is rendered from: the dense figures are the headline table's rows (the highest load where
    the tuned table leaves k = K; the load where it gains most on the docs' table), the MoE figures the
    launches that judged ``README_MOE_TABLES``."""
    import textwrap

    pic = next(r for r in rows if r["file"] == PICTURE_LAUNCH)
    pic_rounds = max(w["round"] for w in _load(H200 / PICTURE_LAUNCH)["windows"]) + 1
    caption = (f"*Served goodput on one H200 ({engine_short(pic['engine'])} {ENGINE_SHAPES[pic['engine']]}, "
               "acceptance (0.7, 0.5, 0.3)) against the load, the batch the engine runs: the tuned table, each "
               f"fixed k and the docs' table in one launch ({pic['date']}, {_n(pic_rounds, 'round')}; rendered by "
               "`benchmarks/report.py` from `benchmarks/data/h200/`).*")

    tuned = tuned_tables()
    dense = [r for (e, _), r in chosen_rows(rows, tuned).items() if e == "dense" and r is not None]
    table = tuned["dense"][1]
    a = max((r for r in dense if _k_at(table, r["load"]) < K), key=lambda r: r["load"])
    b = max((r for r in dense if r["docs"] is not None), key=lambda r: r["docs"][0])
    if a["file"] == b["file"] and a["rounds"] == b["docs"][2]:
        when, at_a, at_b = f"in {_n(a['rounds'], 'paired round')} ({a['date']})", "", ""
    else:
        when, at_a, at_b = "", f" ({_rounds([a])})", f" ({_n(b['docs'][2], 'paired round')}, {b['date']})"
    text = (f"Measured on that H200{' ' + when if when else ''}, the dense table is "
            f"{_ratio(a['ratio'], a['se'])} of the best fixed k at load {a['load']}{at_a}, where it leaves "
            f"k = {K} for k = {_k_at(table, a['load'])}, and {_ratio2(*b['docs'][:2])} of the docs' table at load "
            f"{b['load']}{at_b}, where the docs' table drops to k = {_k_at(b['docs_table'], b['load'])}.")

    moe = [r for r in rows if r["engine"] == "moe" and r["ceiling"] == 512]
    calibrated = [r for r in moe if r["tables"] == README_MOE_TABLES[0]]
    recalibrated = [r for r in moe if r["tables"] == README_MOE_TABLES[1]]
    gain = best_row([r for r in calibrated if r["load"] == max(
        (r for r in calibrated if r["docs"] is not None), key=lambda r: r["docs"][0])["load"]])
    top = max(r["load"] for r in calibrated)
    high = best_row([r for r in calibrated if r["load"] == top])
    other = best_row([r for r in recalibrated if r["load"] == top])
    lost = (f"but lost {100 * (1 - high['ratio']):.0f} % at load {top} ({_ratio(high['ratio'], high['se'])})"
            if high["status"] == "fail" else f"and is {_ratio(high['ratio'], high['se'])} at load {top}")
    text += (f" On the MoE ({ENGINE_SHAPES['moe']}) a calibrated table, {_table(gain['table'])}, is "
             f"{_ratio(gain['ratio'], gain['se'])} of the best fixed k and {_ratio2(*gain['docs'][:2])} of the "
             f"docs' table at load {gain['load']}, {lost}; the recalibrated table {_table(other['table'])} is "
             f"{_ratio(other['ratio'], other['se'])} there ({_rounds([gain, high, other])}). Every judged load, "
             "with its data file and the command that reproduces it: [docs/results.md](docs/results.md).")

    def wrap(t: str) -> list[str]:
        return textwrap.wrap(t, width=100, break_long_words=False, break_on_hyphens=False)
    return [README_BEGIN, *wrap(caption), "", *wrap(text), README_END]


def splice_readme(readme: str, block: Sequence[str], name: str = "README.md") -> str:
    """``readme`` with the lines between ``README_BEGIN`` and ``README_END`` (markers included) replaced
    by ``block``; a README without exactly one pair of markers is an error naming it."""
    lines = readme.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip() == README_BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == README_END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise DataFileError(f"{name}: needs one {README_BEGIN} line followed by one {README_END} line, found "
                            f"{len(starts)} and {len(ends)}; the headline block goes between them")
    return "".join(lines[:starts[0]]) + "\n".join(block) + "\n" + "".join(lines[ends[0] + 1:])


# ----------------------------------------------------------------------------- the page
def data_section() -> list[str]:
    big = sorted(_rel(p) for p in DATA.rglob("*") if p.is_file() and p.stat().st_size > 1_000_000)
    return ["## Data and raw logs", "",
            "Every launch keeps its JSON (windows, policies, verdicts) beside its printed log. A judge launch also "
            "keeps its engine step log, `<engine>-judge.steps.jsonl.gz`: rerun the launch's command above to "
            "regenerate it, and `python benchmarks/gpu_served.py steps --tables <judge JSON> --step-log <step log> "
            "--ceiling 512` reads it. "
            + ("No data file over 1 MB is committed." if not big else "Over 1 MB: " + ", ".join(big) + "."),
            "The simulator's figures (seeded, no engine) are regenerated by `python benchmarks/evaluate.py` into "
            "`benchmarks/simulator.md`.", ""]


def render(rows: Sequence[dict] | None = None) -> str:
    """docs/results.md: every section, from the data."""
    rows = launch_rows() if rows is None else rows
    lines = ["# Results", "",
             "Generated by `python benchmarks/report.py` from the JSON in `benchmarks/data/`; "
             "`python benchmarks/report.py --check` fails when this page differs from what the data renders. "
             "Method: docs/evaluation.md.", ""]
    lines += headline(rows)
    lines += picture_section()
    lines += controller_section()
    lines += flow_section()
    lines += one_launch_section()
    lines += cpu_section()
    lines += data_section()
    return "\n".join(lines).rstrip("\n") + "\n"


def rendered(page: Path, readme: Path) -> dict[Path, tuple[str, str]]:
    """path -> (committed text, rendered text) for the results page and the README (its headline block
    rendered, the rest kept)."""
    rows = launch_rows()
    old_readme = _read_text(readme)
    name = _READ[-1]
    new = {page: render(rows), readme: splice_readme(old_readme, readme_headline(rows), name)}
    return {path: (old_readme if path == readme else (path.read_text() if path.exists() else ""), text)
            for path, text in new.items()}


def check(page: Path = PAGE, readme: Path = README) -> list[str]:
    """The unified diff between the committed results page and README and what the data renders (empty
    when both match); raises ``DataFileError`` where the data cannot be read."""
    out: list[str] = []
    for path, (old, new) in rendered(page, readme).items():
        if old != new:
            name = _rel(path) if path.is_relative_to(ROOT) else str(path)
            out += difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        name + " (committed)", name + " (rendered)")
            out.append(f"\n{name} differs from what benchmarks/data renders: run `python benchmarks/report.py`.\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare docs/results.md and README.md's headline block with what the data renders")
    args = ap.parse_args(argv)
    _READ.clear()
    try:
        if args.check:
            diff = check(PAGE, README)
            sys.stdout.writelines(diff)
            return 1 if diff else 0
        texts = rendered(PAGE, README)
    except DataFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, StopIteration, ZeroDivisionError) as exc:
        last = _READ[-1] if _READ else "benchmarks/data"
        print(f"error: {last}: not the shape this page reads ({type(exc).__name__}: "
              f"{' '.join(str(exc).split())[:160]}); the last data file read before the failure", file=sys.stderr)
        return 2
    for path, (_, text) in texts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    render_picture(PICTURE)
    print(f"wrote {_rel(PAGE)} ({texts[PAGE][1].count(chr(10))} lines), the headline block of {_rel(README)} "
          f"and {_rel(PICTURE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
