"""Acceptance measurement a_1..a_K on a real engine (docs/method.md, "Acceptance").

Prompt files are read by ``tabletune_pipelines.formats.prompts.load_prompts`` (JSONL, one
``{"prompt": "..."}`` per line; errors name the file and line, never quote a prompt).

A measurement samples ``n`` (``vocab.DEFAULT_SAMPLE_SIZE``, 160) prompts with a fixed seed, runs
them at the launch K with the production temperature, and reads vLLM's Prometheus counters before and after:
``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
``vllm:spec_decode_num_accepted_tokens_total`` and
``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`` (0-based). Then
``a_i = kept_i / drafted_i`` where drafted_i is how often position i was drafted (from
TableTune's step records when the timing scheduler runs, else ``num_drafts`` for every position,
exact under a fixed K). The result stores the sampled prompts' fingerprint and count, never the
prompts. The fingerprint is an HMAC-SHA256 keyed with this installation's secret
(``$TABLETUNE_HOME/fingerprint.key``, 32 random bytes, created with mode 0600 on first use): it
still identifies the prompt set (same set, same key: same fingerprint), but someone who reads the
store and guesses a prompt set cannot confirm the guess without the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import random
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tabletune_pipelines.core.acceptance_estimate import rates_from_counts
from tabletune_pipelines.core.context_acceptance import PoolingRule, bucket_acceptance, bucket_of
from tabletune_pipelines.core.table import context_buckets
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.process import VLLMServer
from tabletune_pipelines.errors import (
    EngineConfigError,
    EngineError,
    InvalidValueError,
    PromptFileError,
    UnwritablePathError,
)
from tabletune_pipelines.formats.documents import AcceptancePrior
from tabletune_pipelines.formats.prompts import load_prompt_lengths, load_prompts
from tabletune_pipelines.formats.strict_io import (
    FileTooLargeError,
    NotRegularFileError,
    atomic_write_text,
    read_bounded,
)

__all__ = ["DEFAULT_MAX_TOKENS", "DEFAULT_SAMPLE_SIZE", "ContextSplit", "SpecCounters", "load_prompts",
           "measure_acceptance", "fingerprint_key", "measure_acceptance_from_file", "parse_spec_counters",
           "prompt_fingerprint", "sample_prompts", "write_default_prompt_file"]
from tabletune_pipelines.vocab import DEFAULT_SAMPLE_SIZE, DEFAULT_TEMPERATURE, PriorSource

DEFAULT_MAX_TOKENS = 64
"""Output tokens per prompt of an acceptance measurement."""

_METRIC_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# --------------------------------------------------------------------------- prompt sets
P = TypeVar("P")
"""A prompt, or a prompt with what travels with it (its logged length)."""


def sample_prompts(prompts: Sequence[P], n: int = DEFAULT_SAMPLE_SIZE, seed: int = 0) -> list[P]:
    """``n`` prompts drawn without replacement with a fixed seed (all of them if fewer). The draw
    depends only on how many there are: prompts with their lengths are drawn as the prompts alone."""
    if n < 1:
        raise EngineConfigError(f"sample size n = {n!r} must be >= 1")
    if len(prompts) <= n:
        return list(prompts)
    return random.Random(seed).sample(list(prompts), n)


FINGERPRINT_KEY_FILE = "fingerprint.key"
"""This installation's fingerprint secret, in ``$TABLETUNE_HOME``."""


#: The key file holds 64 hex digits and a newline; a file larger than this is not a key (never read whole).
_MAX_KEY_FILE_BYTES = 256


def _read_key(path: Path) -> bytes:
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise  # not created yet: fingerprint_key makes it (or names the folder it cannot make it in)
    except OSError as exc:
        raise InvalidValueError(f"cannot read fingerprint key {path} ({exc.strerror or exc}); make it readable by "
                                "this user, or set TABLETUNE_HOME to this installation's folder") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidValueError(f"fingerprint key {path} is not a regular file; remove it (a new key is made)")
    if st.st_mode & 0o077:
        raise InvalidValueError(f"fingerprint key {path} can be read by other users "
                                f"(mode {stat.S_IMODE(st.st_mode):o}); "
                                f"run chmod 600 {path}: it keys the stored prompt fingerprints")
    try:
        raw, _ = read_bounded(path, _MAX_KEY_FILE_BYTES)  # a regular file, read with a bound
    except FileNotFoundError:
        raise
    except FileTooLargeError as exc:
        raise InvalidValueError(f"fingerprint key {path} is {exc.size or 'more than ' + str(exc.limit)} bytes; a key "
                                "is 64 hex digits. Remove it to make a new one (fingerprints stored so far then no "
                                "longer match new measurements of the same prompts)") from None
    except NotRegularFileError:
        raise InvalidValueError(
            f"fingerprint key {path} is not a regular file; remove it (a new key is made)") from None
    except OSError as exc:
        raise InvalidValueError(f"cannot read fingerprint key {path} ({exc.strerror or exc}); make it readable by "
                                "this user, or set TABLETUNE_HOME to this installation's folder") from None
    text = raw.decode("ascii", errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise InvalidValueError(f"fingerprint key {path} is not 64 hex digits; remove it to make a new one "
                                "(fingerprints stored so far then no longer match new measurements of the "
                                "same prompts)")
    return key


def fingerprint_key(home: str | Path | None = None) -> bytes:
    """The installation's fingerprint secret (``<home>/fingerprint.key``, default ``$TABLETUNE_HOME``),
    made on first use: 32 random bytes as hex, mode 0600, created atomically so that concurrent
    first uses agree on one key."""
    if home is None:
        from tabletune_pipelines.formats.fleet import tabletune_home

        home = tabletune_home()
    path = Path(home) / FINGERPRINT_KEY_FILE
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    except NotADirectoryError:  # TABLETUNE_HOME (or a folder above it) is a file
        pass  # creating the key below names the folder
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".fingerprint.", dir=path.parent)  # mkstemp: mode 0600
    except OSError as exc:
        raise UnwritablePathError(
            f"cannot create the fingerprint key in {path.parent} ({exc.strerror or exc}); the first acceptance "
            "measurement makes it there. Make that folder writable, or set TABLETUNE_HOME to a writable "
            "folder") from None
    try:
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another process made the key first: theirs is kept
        except FileExistsError:
            pass
    except OSError as exc:
        raise UnwritablePathError(f"cannot write the fingerprint key {path} ({exc.strerror or exc}); make "
                                  f"{path.parent} writable, or set TABLETUNE_HOME to a writable folder") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return _read_key(path)


def prompt_fingerprint(prompts: Sequence[str], key: bytes | None = None) -> str:
    """HMAC-SHA256 over the prompts in order (length-prefixed), keyed with ``key`` (default: the
    installation's ``fingerprint_key()``): identifies the set, cannot rebuild it, and a guessed set
    cannot be checked against it without the key."""
    h = hmac.new(fingerprint_key() if key is None else key, digestmod=hashlib.sha256)
    for s in prompts:
        b = s.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def write_default_prompt_file(path: str | Path, n: int = 400, seed: int = 7) -> Path:
    """The embedded default's prompt set: short texts with repeated phrases, so n-gram drafting
    finds matches and acceptance is real and non-trivial."""
    from tabletune_pipelines.engine.tiny_models import generate_corpus

    rng = random.Random(seed)
    lines = generate_corpus(num_lines=600, seed=seed)
    out = []
    for i in range(n):
        base = rng.choice(lines)
        words = base.split()
        phrase = " ".join(words[: rng.randint(3, 8)])
        reps = rng.randint(2, 5)
        tail = " ".join(rng.choice(lines).split()[:6])
        out.append(json.dumps({"prompt": f"{tail}. " + ". ".join([phrase] * reps) + ".", "id": i}))
    return atomic_write_text(path, "\n".join(out) + "\n")


# --------------------------------------------------------------------------- metrics
@dataclass(frozen=True)
class SpecCounters:
    """vLLM's speculative-decoding counters (summed over engines)."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    accepted_per_pos: tuple[float, ...]

    def minus(self, before: SpecCounters) -> SpecCounters:
        n = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        a = list(self.accepted_per_pos) + [0.0] * (n - len(self.accepted_per_pos))
        b = list(before.accepted_per_pos) + [0.0] * (n - len(before.accepted_per_pos))
        return SpecCounters(self.num_drafts - before.num_drafts, self.num_draft_tokens - before.num_draft_tokens,
                            self.num_accepted_tokens - before.num_accepted_tokens,
                            tuple(x - y for x, y in zip(a, b, strict=True)))


def parse_spec_counters(text: str) -> SpecCounters:
    """Read the spec-decode counters from Prometheus text exposition."""
    totals = {"vllm:spec_decode_num_drafts_total": 0.0, "vllm:spec_decode_num_draft_tokens_total": 0.0,
              "vllm:spec_decode_num_accepted_tokens_total": 0.0}
    per_pos: dict[int, float] = {}
    seen = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_RE.match(line)
        if not m:
            continue
        name = m.group("name")
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if name in totals:
            totals[name] += value
            seen = True
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            labels = dict(_LABEL_RE.findall(m.group("labels") or ""))
            pos = int(labels.get("position", "0"))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    if not seen:
        raise EngineError("the server exposes no vllm:spec_decode_* counters: is speculative decoding on and "
                          "stats logging enabled (no --disable-log-stats)?")
    n = max(per_pos) + 1 if per_pos else 0
    return SpecCounters(totals["vllm:spec_decode_num_drafts_total"], totals["vllm:spec_decode_num_draft_tokens_total"],
                        totals["vllm:spec_decode_num_accepted_tokens_total"],
                        tuple(per_pos.get(i, 0.0) for i in range(n)))


def _settled_counters(server: VLLMServer, settle: float = 0.3, tries: int = 20) -> SpecCounters:
    last = parse_spec_counters(server.metrics_text())
    for _ in range(tries):
        time.sleep(settle)
        cur = parse_spec_counters(server.metrics_text())
        if cur == last:
            return cur
        last = cur
    return last


@dataclass(frozen=True)
class _GroupCounts:
    """What one group of prompts drafted and kept (counter deltas around its run)."""

    num_drafts: int
    """Request-steps that drafted."""
    drafted: tuple[int, ...]
    """How often position i was drafted (step records when the timing scheduler runs, else num_drafts)."""
    accepted: tuple[int, ...]
    """How often position i was kept."""
    usage: tuple[tuple[int, int], ...]
    """(prompt tokens, completion tokens) of each request that reported them."""


@dataclass(frozen=True)
class ContextSplit:
    """How a measurement splits its prompts by context (``core.context_acceptance``)."""

    levels: tuple[int, ...]
    """The plan's context levels (tokens, ascending); one level measures one group, as without a split."""
    max_context: int | None = None
    """Where the last bucket ends (tokens); None = the server's ``max_model_len``."""
    lengths: tuple[int | None, ...] | None = None
    """Each prompt's length in tokens as logged (None: tokenized by the server)."""
    rule: PoolingRule = PoolingRule()
    """When a bucket keeps rates of its own."""


def _run_group(server: VLLMServer, items: Sequence[tuple[int, str]], K: int, *, temperature: float,
               max_tokens: int, seed: int, workers: int) -> _GroupCounts:
    """Run ``items`` ((index in the sample, prompt): the index seeds its sampling) and count."""
    before = _settled_counters(server, tries=2)
    offset = server.step_log_offset()
    t0 = time.monotonic()
    usage: list[tuple[int, int]] = []  # (prompt tokens, completion tokens) per request: the workload

    def one(i_prompt: tuple[int, str]) -> None:
        i, p = i_prompt
        out = server.complete(p, max_tokens=max_tokens, temperature=temperature,
                              seed=None if temperature == 0 else seed + i)
        u = out.get("usage") if isinstance(out, dict) else None
        if (isinstance(u, dict) and isinstance(u.get("prompt_tokens"), int)
                and isinstance(u.get("completion_tokens"), int)):
            usage.append((u["prompt_tokens"], u["completion_tokens"]))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, items))
    t1 = time.monotonic()
    delta = _settled_counters(server).minus(before)
    accepted = [int(round(x)) for x in (list(delta.accepted_per_pos) + [0.0] * K)[:K]]
    drafted = [int(round(max(delta.num_drafts, 0.0)))] * K
    steps = server.read_steps(since=t0, until=t1 + 1.0, offset=offset)
    dp = [0] * K
    for s in steps:
        for i, v in enumerate(s.get("dp", [])[:K]):
            dp[i] += int(v)
    if steps and dp[0] > 0:
        drafted = dp
    return _GroupCounts(int(round(delta.num_drafts)), tuple(drafted), tuple(accepted), tuple(usage))


def _groups(server: VLLMServer, prompts: Sequence[str], split: ContextSplit | None
            ) -> tuple[list[list[tuple[int, str]]], tuple[tuple[int, int], ...] | None]:
    """The prompts as one group (no split, or one level), or one group per context bucket, and the buckets."""
    items = list(enumerate(prompts))
    if split is None or len(split.levels) < 2:
        return [items], None
    buckets = context_buckets(split.levels, split.max_context or server.config.max_model_len)
    logged = split.lengths if split.lengths is not None else (None,) * len(prompts)
    if len(logged) != len(prompts):
        raise EngineConfigError(f"{len(logged)} prompt lengths for {len(prompts)} prompts")
    lengths = [n if n is not None else server.count_tokens(p) for p, n in zip(prompts, logged, strict=True)]
    column = bucket_of(lengths, buckets)
    return [[it for it, c in zip(items, column, strict=True) if c == j] for j in range(len(buckets))], buckets


def measure_acceptance(
    server: VLLMServer,
    prompts: Sequence[str],
    *,
    temperature: float = DEFAULT_TEMPERATURE,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    concurrency: int | None = None,
    seed: int = 0,
    source: PriorSource | None = None,
    week: str | None = None,
    deployment: str | None = None,
    context: ContextSplit | None = None,
) -> AcceptancePrior:
    """Run ``prompts`` on a running speculative server and return the per-position acceptance. With
    ``context`` of two or more levels, each context bucket's prompts run as one group after another,
    and the prior carries each bucket's counts and rates, pooled where its sample is too small."""
    cfg = server.config
    K = int(cfg.num_speculative_tokens or 0)
    if cfg.method is None or K < 1:
        raise EngineConfigError("acceptance needs a speculative server (method and num_speculative_tokens)")
    if not prompts:
        raise PromptFileError("no prompts to measure acceptance on")
    groups, buckets = _groups(server, prompts, context)
    counts = [_run_group(server, g, K, temperature=temperature, max_tokens=max_tokens, seed=seed,
                         workers=concurrency or cfg.max_num_seqs) if g else _GroupCounts(0, (0,) * K, (0,) * K, ())
              for g in groups]
    num_drafts = sum(c.num_drafts for c in counts)
    if num_drafts <= 0:
        raise EngineError(f"no drafts were made for {len(prompts)} prompts (method {cfg.method!r}); "
                          "acceptance is undefined", server.log_tail(10))
    accepted = [sum(c.accepted[i] for c in counts) for i in range(K)]
    drafted = [sum(c.drafted[i] for c in counts) for i in range(K)]
    # Every position is drafted at a fixed K; one that was not repeats the position before it.
    rates = tuple(float(r) for r in rates_from_counts(accepted, drafted, undrafted="previous"))
    if source is None:
        source = "synthetic" if cfg.synthetic_acceptance_rates is not None else "measured"
    usage = [u for c in counts for u in c.usage]
    workload = None
    if usage:
        workload = {"prompt_tokens": round(sum(u[0] for u in usage) / len(usage), 2),
                    "output_tokens": round(max(1.0, sum(u[1] for u in usage) / len(usage)), 2),
                    "source": f"mean prompt tokens of the {len(usage)} sampled prompts (the engine's tokenizer); "
                              f"output tokens as generated here (capped at max_tokens = {max_tokens}): "
                              "replace with served output lengths where known"}
    breakdown = None
    if buckets is not None and context is not None:
        breakdown = bucket_acceptance(context.levels, buckets, [
            (len(g), c.num_drafts, c.drafted, c.accepted) for g, c in zip(groups, counts, strict=True)], context.rule)
    return AcceptancePrior(
        rates=rates, num_drafts=num_drafts, drafted_per_pos=tuple(drafted),
        accepted_per_pos=tuple(accepted), prompt_fingerprint=prompt_fingerprint(prompts),
        prompt_count=len(prompts), temperature=float(temperature), source=source, week=week, deployment=deployment,
        workload=workload, context=breakdown)


def measure_acceptance_from_file(
    config: ServerConfig,
    prompt_file: str | Path,
    *,
    n: int = DEFAULT_SAMPLE_SIZE,
    seed: int = 0,
    temperature: float = DEFAULT_TEMPERATURE,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    server: VLLMServer | None = None,
    concurrency: int | None = None,
    source: PriorSource | None = None,
    week: str | None = None,
    deployment: str | None = None,
    context_levels: Sequence[int] = (),
) -> AcceptancePrior:
    """Load + sample the prompt file, then measure at the config's K (launching a server unless
    ``server`` is given). The launch uses a fixed K (no table) so every draft covers all K positions.
    ``context_levels`` (two or more): acceptance per context bucket, each prompt placed by its logged
    ``prompt_tokens`` or, without one, its length as the server tokenizes it."""
    records = sample_prompts(load_prompt_lengths(prompt_file), n=n, seed=seed)  # the same draw as of the prompts
    prompts = [p for p, _ in records]
    fingerprint_key()  # a key others can read (or a broken one) fails here, before an engine starts
    split = None
    if len(context_levels) >= 2:
        split = ContextSplit(levels=tuple(int(x) for x in context_levels), lengths=tuple(t for _, t in records))

    def measure(srv: VLLMServer) -> AcceptancePrior:
        return measure_acceptance(srv, prompts, temperature=temperature, max_tokens=max_tokens, seed=seed,
                                  concurrency=concurrency, source=source, week=week, deployment=deployment,
                                  context=split)

    if server is not None:
        return measure(server)
    with VLLMServer(dataclasses.replace(config, table=None)) as srv:
        return measure(srv)
