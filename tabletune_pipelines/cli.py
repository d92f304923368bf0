"""``tabletune``: profile, measure acceptance, build and show tables, run the pipeline.

Every subcommand works on a deployment of the fleet file (default: the embedded ``local-cpu``
deployment on vLLM's CPU build) and the DuckDB store (default ``$TABLETUNE_HOME/tabletune_store.duckdb``).
Measured cells are written the moment they are measured, so an interrupted ``profile`` resumes.

Exit status: 0 on success; 2 on any error the input caused (a bad argument, fleet file, prompt
file or store, nothing measured yet, an engine that cannot be used), printed as one
``error: ...`` line on stderr (more detail, if any, on indented lines below it); 130 when
interrupted. ``profile``, ``acceptance``, ``table`` and ``show`` never import Dagster, so they
run on a GPU node that has only vLLM; only ``run`` needs the pipeline extra.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from tabletune_pipelines.errors import EndpointUnreachable, NotFoundError, StoreError, TableTuneError, UsageError
from tabletune_pipelines.vocab import DEFAULT_PROFILE_MODE, DEFAULT_REPETITIONS, PROFILE_MODES

if TYPE_CHECKING:
    from tabletune_pipelines.formats.documents import AcceptancePrior, EngineIdentity
    from tabletune_pipelines.formats.fleet import Deployment
    from tabletune_pipelines.formats.published_schema import PublishedTable
    from tabletune_pipelines.store import TableTuneStore

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


# -- argument types: argparse reports their errors as "error: argument --x: <message>" -------

def _int_list(minimum: int):
    def parse(text: str) -> tuple[int, ...]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        try:
            values = tuple(int(x) for x in items)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r} lists no values")
        low = [v for v in values if v < minimum]
        if low:
            raise argparse.ArgumentTypeError(f"{low} must be >= {minimum}")
        return values

    parse.__name__ = "integer list"
    return parse


def _profile_number(name: str):
    """A ``profile`` option checked against the library's own limit (``engine.plan.PROFILE_LIMITS``:
    one validation for the CLI and ``ProfileOptions``); imported only when the option is given."""
    def parse(text: str) -> int | float:
        from tabletune_pipelines.engine.plan import PROFILE_LIMITS, limit_problem

        integer = PROFILE_LIMITS[name].integer
        try:
            value: int | float = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if integer else 'a number of seconds'}") from None
        problem = limit_problem(name, value)
        if problem:
            raise argparse.ArgumentTypeError(f"{text} {problem}")
        return value

    parse.__name__ = name
    return parse


def _iso_date(text: str) -> str:
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date YYYY-MM-DD") from None


def _monday(text: str) -> str:
    day = date.fromisoformat(_iso_date(text))
    if day.weekday() != 0:
        raise argparse.ArgumentTypeError(f"{text} is a {day:%A}; weeks start on Monday (UTC)")
    return day.isoformat()


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error format: one ``error: ...`` line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_ERROR)


# -- shared context ------------------------------------------------------------------------------

def _log() -> logging.Logger:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    return logging.getLogger("tabletune")


def _deployment(args: argparse.Namespace) -> Deployment:
    from tabletune_pipelines.formats.fleet import load_fleet
    from tabletune_pipelines.formats.live_counters import counters_damage

    fleet = load_fleet(args.fleet)
    dep = fleet.deployment(args.deployment) if args.deployment else fleet.deployments[0]
    damage = counters_damage(dep.live_counters) if dep.live_counters is not None else None
    if damage:  # the command goes on: the file is the deployment's, left behind by a crash or a rotation
        print(f"note: {damage}", file=sys.stderr)
    return dep


def _store_path(args: argparse.Namespace) -> Path:
    from tabletune_pipelines.formats.fleet import default_store_path

    return Path(args.db).expanduser() if args.db else default_store_path()


def _open_store(args: argparse.Namespace, *, must_exist: bool, read_only: bool = False) -> TableTuneStore:
    """The store; a read-only command does not create one where none exists, and opens it read-only."""
    from tabletune_pipelines.store import TableTuneStore

    path = _store_path(args)
    if must_exist and not path.exists():
        raise NotFoundError(f"no TableTune store at {path}: nothing is measured yet; run `tabletune profile` and "
                            "`tabletune acceptance --prompts FILE` first (or pass --db / set TABLETUNE_DUCKDB)")
    if path.is_dir():
        raise UsageError(f"the store path {path} is a directory; pass a DuckDB file with --db or TABLETUNE_DUCKDB")
    try:
        return TableTuneStore(path, read_only=read_only)
    except OSError as exc:  # e.g. the folder cannot be created; duckdb's own errors are StoreErrors
        raise StoreError(f"cannot use the store at {path}: {exc.strerror or exc}; pass --db or set "
                         "TABLETUNE_DUCKDB to a writable path") from None


def _int_list_or_none(minimum: int):
    """Like ``_int_list``; ``none`` → an empty tuple."""
    ints = _int_list(minimum)

    def parse(text: str) -> tuple[int, ...]:
        return () if text.strip().lower() == "none" else ints(text)

    parse.__name__ = "integer list or 'none'"
    return parse


def _rates(text: str) -> tuple[float, ...]:
    """``"0.7,0.5,0.3"`` → acceptance rates (checked by the prior document itself)."""
    try:
        vals = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not vals or any(not 0.0 <= v <= 1.0 for v in vals) or any(b > a for a, b in zip(vals, vals[1:], strict=False)):
        raise argparse.ArgumentTypeError(f"{text!r}: rates must be non-increasing values in [0, 1]")
    return vals


# -- subcommands ---------------------------------------------------------------------------------

def cmd_profile(args: argparse.Namespace) -> int:
    from tabletune_pipelines.tuning import deployments

    dep = _deployment(args)
    options = deployments.ProfileOptions(mode=args.mode, repetitions=args.repetitions,
                                         batch_sizes=args.batch_sizes, ks=args.ks,
                                         accept_batch_sizes=args.accept_batch_sizes,
                                         include_no_spec=not args.no_nospec,
                                         fixed_k_baseline=args.fixed_k_baseline,
                                         startup_timeout=args.startup_timeout, plan_search=args.plan,
                                         context_levels=args.context_levels,
                                         **({} if args.remeasure_budget is None
                                            else {"remeasure_budget_s": args.remeasure_budget}),
                                         **({} if args.max_repetitions is None
                                            else {"max_repetitions": args.max_repetitions}),
                                         **({} if args.decode_steps is None else {"decode_steps": args.decode_steps}),
                                         **({} if args.coarse_points is None
                                            else {"coarse_points": args.coarse_points}))
    # --batch-sizes, --ks, --accept-batch-sizes against the deployment, by the plan's own rule, before
    # an engine starts or the store is opened.
    options.check_engine(dep.max_num_seqs, dep.max_k,
                         f" (deployment {dep.name!r}: max_num_seqs {dep.max_num_seqs}, max_k {dep.max_k})")
    if args.dry_run:  # the plan alone: no engine, no store
        from tabletune_pipelines.engine.config import ServerConfig
        from tabletune_pipelines.engine.plan import plan_from_options, plan_lines

        options = deployments.with_fleet_levels(options, dep)
        plan = plan_from_options(ServerConfig(model=dep.model, method=dep.method, drafter=dep.drafter,
                                              num_speculative_tokens=dep.max_k, max_num_seqs=dep.max_num_seqs),
                                 options)
        print("\n".join([f"deployment {dep.name}: dry run, nothing launched", *plan_lines(plan, options)]))
        return 0
    identity = deployments.current_identity(dep)
    store = _open_store(args, must_exist=False)
    print(f"profiling {identity.key} into {store.path}", file=sys.stderr)
    profile = deployments.profile(identity, dep, store, log=_log(), options=options)
    print(json.dumps({"identity": identity.key, "cells": len(profile.cells), "mode": profile.mode,
                      "cells_remeasured": len(profile.remeasured()), "wall_timed_cells": len(profile.wall_timed())}))
    return 0


def cmd_acceptance(args: argparse.Namespace) -> int:
    from tabletune_pipelines.formats.prompts import count_prompts
    from tabletune_pipelines.tuning import deployments

    dep = _deployment(args)
    prompts = Path(args.prompts).expanduser()
    count_prompts(prompts)  # a bad prompt file fails here, before an engine starts
    identity = deployments.current_identity(dep)
    store = _open_store(args, must_exist=False)
    prior = deployments.measure_acceptance(identity, dep, prompts, args.week or "adhoc", log=_log())
    store.upsert_identity(identity)
    store.write_acceptance_prior(prior, identity.key)
    print(prior.to_json(indent=2))
    return 0


def _identities_held(store: TableTuneStore, stored: list[str] | None = None) -> str:
    """``the store holds 2 engine identities: KEY, KEY (PATH)``: what ``--identity`` may name."""
    stored = store.identity_keys() if stored is None else stored
    listed = ", ".join(stored[:10]) + (", ..." if len(stored) > 10 else "")
    return (f"the store holds {len(stored)} engine identit{'y' if len(stored) == 1 else 'ies'}: {listed}" if stored
            else "the store holds no engine identity yet") + f" ({store.path})"


def _deployment_profile_key(store: TableTuneStore, dep: Deployment) -> str:
    """The identity key of the engine ``dep`` runs now (the fleet's fields + its vLLM version), which
    the store must hold a profile of: never another GPU's, K's or max_num_seqs' profile of the same model."""
    from tabletune_pipelines.tuning import deployments

    stored = store.identity_keys()
    held = _identities_held(store, stored)
    try:
        key = deployments.current_identity(dep).key
    except EndpointUnreachable as exc:
        raise NotFoundError(f"deployment {dep.name!r}: cannot learn the engine it runs ({exc}); pass --identity KEY "
                            f"to pick a stored profile; {held}") from None
    if key not in stored:
        raise NotFoundError(f"no step-time profile for deployment {dep.name!r} (engine {key}): {held}; run "
                            "`tabletune profile` to profile this engine, or pass --identity KEY to use another "
                            "engine's profile")
    return key


def _prior(store: TableTuneStore, identity: EngineIdentity, prior_id: str | None) -> AcceptancePrior:
    """``--prior``, else the prior the pipeline would use (``tuning.gates.prior_for_table``, the one rule)."""
    if prior_id:
        try:
            return store.acceptance_prior(prior_id)
        except KeyError as exc:  # the store's NotFoundError (a KeyError) lists the ids it has
            raise NotFoundError(f"--prior {prior_id!r}: {exc}; omit --prior to use the latest sane one") from None
    from tabletune_pipelines.tuning.gates import prior_for_table

    prior, skipped = prior_for_table(store, identity)
    for s in skipped:
        print(f"warning: skipping prior: {s}", file=sys.stderr)
    if prior is None:
        raise NotFoundError(
            f"no sane acceptance prior for {identity.model} / {identity.drafter} / {identity.method} at K = "
            f"{identity.max_k} in {store.path}" + (f" (rejected: {'; '.join(skipped)})" if skipped else "")
            + "; run `tabletune acceptance --prompts FILE` first, or pass --prior ID or --rates")
    return prior


def _plot_guard(args: argparse.Namespace) -> dict[Path, str]:
    """The files ``--plot`` may never replace, whether they exist yet or not (the store, the fleet
    file, every deployment's published table, companion and live counters); the target is checked
    now against them and against what is there (``tuning.report.check_plot_target``)."""
    from tabletune_pipelines.formats.fleet import load_fleet
    from tabletune_pipelines.tuning.report import check_plot_target

    fleet = load_fleet(args.fleet)
    guard = {_store_path(args): "the DuckDB store", Path(fleet.source): "the fleet file"}
    for d in fleet.deployments:
        guard.update({path: f"deployment {d.name!r}'s {key}" for path, key in d.written_files()})
    with _plot_option():
        check_plot_target(args.plot, guard)
    return guard


@contextlib.contextmanager
def _plot_option() -> Iterator[None]:
    """A ``PlotTargetError`` as the ``--plot`` option's error (``error: --plot: refusing ...``)."""
    from tabletune_pipelines.errors import PlotTargetError

    try:
        yield
    except PlotTargetError as exc:
        raise UsageError(f"--plot: {exc}") from None


def cmd_table(args: argparse.Namespace) -> int:
    from tabletune_pipelines.tuning.derive import DeriveOptions
    from tabletune_pipelines.tuning.derive_context import (
        derive_context_table,
        rates_per_level,
        stored_context_surface,
        stored_decode_surface,
    )
    from tabletune_pipelines.tuning.report import (
        context_grid_lines,
        evidence_markdown,
        goodput_markdown,
        table_markdown,
        table_plot,
        write_plot,
    )

    dep = _deployment(args)
    plot_guard = _plot_guard(args) if args.plot else None  # a --plot target is refused before any work
    store = _open_store(args, must_exist=True, read_only=not args.save)
    if args.identity and not store.has_identity(args.identity):
        raise NotFoundError(f"--identity {args.identity!r}: no engine identity with that key; "
                            f"{_identities_held(store)}; pass one of them, or omit --identity to use the profile of "
                            "the engine the deployment runs")
    key = args.identity or _deployment_profile_key(store, dep)
    profile = store.load_profile(key, args.mode)  # NotFoundError when that mode has no cells
    if args.rates is not None and args.prior:
        raise UsageError("give --prior or --rates, not both")
    if args.rates is not None:
        from tabletune_pipelines.formats.documents import AcceptancePrior

        if len(args.rates) != dep.max_k:
            raise UsageError(f"--rates has {len(args.rates)} values; deployment {dep.name!r} has max_k {dep.max_k}")
        prior = AcceptancePrior(rates=args.rates, num_drafts=0, drafted_per_pos=(0,) * len(args.rates),
                                accepted_per_pos=(0,) * len(args.rates), prompt_fingerprint="given",
                                prompt_count=0, source="synthetic", deployment=dep.name)
    else:
        prior = _prior(store, profile.identity, args.prior)
    options = DeriveOptions(correct_accepted_work=not args.no_correction, policy=args.policy)
    surfaces = stored_context_surface(profile, prior, options)
    rates, pooled_why = rates_per_level(prior, sorted(surfaces))
    if pooled_why:
        print(f"warning: {pooled_why}", file=sys.stderr)
    decode = stored_decode_surface(profile, prior, options) if len(surfaces) > 1 else None
    tuned = derive_context_table(profile, prior, surfaces, rates=rates, options=options, decode=decode)
    if args.format == "vllm":
        print(json.dumps(tuned.table.as_vllm()))
        for w in tuned.warnings:
            print(f"warning: {w}", file=sys.stderr)
    else:
        print(f"# draft-length table for {key}\n# prior {prior.prior_id}: a = {[round(a, 3) for a in prior.rates]}\n")
        print(table_markdown(tuned.table.as_vllm()))
        if tuned.table.context_entries:
            print("\nk by batch size and context (the table above is its first context bucket's):")
            print("\n".join(context_grid_lines(tuned.table.full_table)))
        print()
        print(goodput_markdown(tuned))
        print()
        print(evidence_markdown(tuned))
        print("vLLM --speculative-config:", json.dumps(tuned.table.speculative_config(dep.base_speculative_config())))
    if args.plot:
        png = table_plot(tuned, profile.no_spec_ms(), f"{key}\nprior {prior.prior_id}")
        with _plot_option():
            write_plot(args.plot, png, plot_guard)
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.save:
        print(f"stored as {store.write_table(tuned.table)}", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from tabletune_pipelines.formats.published import load_published

    dep = _deployment(args)
    pub = load_published(dep.published_table)  # the strict reader: a bad file is one error line
    notes = _whose_table(pub, dep)
    if args.json:  # json.dumps escapes every control character and non-ASCII character
        for note in notes:  # stdout stays the document alone
            print(terminal_safe(f"note: {note}"), file=sys.stderr)
        print(json.dumps(pub.document, indent=2))
        return 0
    print("\n".join(terminal_safe(line) for line in _show_summary(pub, dep, notes, _store_for_show(args))))
    return 0


#: Characters a terminal acts on rather than shows: C0 controls but the tab (ESC starts an escape
#: sequence), DEL, C1 controls (CSI, OSC) and the bidirectional overrides that reorder what follows.
_TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: A run of more digits than any figure ``show`` prints (a hand-edited 1e300 formatted as a fixed-point number).
_LONG_NUMBER = re.compile(r"\d{25,}(?:\.\d+)?")


def terminal_safe(line: str) -> str:
    """One line of ``show``'s output as a terminal should print it: every character a terminal would
    act on (an escape sequence from a hand-edited file, a newline inside a value) written as its
    ``\\x..`` / ``\\u....`` escape, and a number of 25 digits or more in short scientific form."""
    line = _TERMINAL_CONTROLS.sub(lambda m: json.dumps(m.group())[1:-1] if ord(m.group()) > 0x7f or
                                  m.group() in "\n\r" else f"\\x{ord(m.group()):02x}", line)
    return _LONG_NUMBER.sub(lambda m: f"{float(m.group()):.3g}", line)


def _whose_table(pub: PublishedTable, dep: Deployment) -> list[str]:
    """Why the file at ``dep``'s path may not be ``dep``'s table: published for another deployment, or
    for another engine than the fleet entry describes (the controller's own comparison,
    ``controller.loader.identity_mismatches``; the vLLM version only where it is known here, for an
    embedded deployment; the graph envelope, capture ceiling and token budget, the fleet's as the
    engine would run it, ``engine.identity.capture_ceiling``)."""
    from tabletune_pipelines.controller.loader import DEPLOYMENT_ENV, EngineFacts, identity_mismatches
    from tabletune_pipelines.engine.identity import capture_ceiling

    notes = []
    if pub.deployment != dep.name:
        notes.append(f"this table was published for deployment {pub.deployment!r}, not {dep.name!r}, whose "
                     f"published_table it sits at: a controller run with {DEPLOYMENT_ENV}={dep.name} refuses it, "
                     f"one without that setting serves it; publish the table of {dep.name!r} with the pipeline")
    if pub.identity is None:
        notes.append("it records no engine identity, so nothing says which engine it was measured on; a controller "
                     "refuses it")
        return notes
    version = None
    if dep.embedded:
        from tabletune_pipelines.engine.installed import installed_vllm_version

        with contextlib.suppress(TableTuneError):
            version = installed_vllm_version()
    ceiling = capture_ceiling(eager=dep.gpu == "cpu", explicit=dep.max_cudagraph_capture_size,
                              max_num_seqs=dep.max_num_seqs, max_k=dep.max_k)
    facts = EngineFacts(max_k=dep.max_k, max_num_seqs=dep.max_num_seqs, launch_ranges=None, model=dep.model,
                        method=dep.method, drafter=dep.drafter, vllm_version=version, gpu=dep.gpu,
                        capture_ceiling=ceiling, max_num_batched_tokens=dep.max_num_batched_tokens)
    bad = identity_mismatches(pub, facts)
    if bad:
        notes.append(f"it was made for another engine than deployment {dep.name!r} runs: "
                     + "; ".join(b.replace("this engine's", "the deployment's") for b in bad)
                     + "; the deployment's controller refuses it")
    return notes


def _store_for_show(args: argparse.Namespace) -> TableTuneStore | str:
    """The store, read-only, when one exists (never created); else why not, for one line of the summary."""
    from tabletune_pipelines.store import TableTuneStore

    path = _store_path(args)
    if not path.is_file():
        return f"no store at {path}"
    try:
        return TableTuneStore(path, read_only=True, lock_timeout_s=0.0)
    except (TableTuneError, OSError) as exc:
        return f"the store could not be read ({(str(exc) or type(exc).__name__).splitlines()[0]})"


def _show_summary(pub: PublishedTable, dep: Deployment, notes: list[str], store: TableTuneStore | str) -> list[str]:
    """What ``tabletune show`` prints: whose table it is, then the run report (``run_report.measured_lines``:
    the table, what it came from, what it is predicted to do, what serving measured, where the file is)."""
    from tabletune_pipelines.tuning.deployments import AcceptanceOptions
    from tabletune_pipelines.tuning.run_report import measured_lines

    lines = [f"{dep.name}: draft-length table v{pub.version}, published {pub.published_at}"]
    lines += [f"NOTE: {n}" for n in notes]
    lines += measured_lines(pub, dep, store, sample_seed=AcceptanceOptions().seed)
    lines.append("  (--json prints the whole document)")
    return lines


def cmd_run(args: argparse.Namespace) -> int:
    # The one subcommand that needs Dagster: imported here so the others run without it.
    try:
        import dagster  # noqa: F401 - the pipeline extra; embedded.main imports it only when called

        from tabletune_pipelines.embedded import main as run_embedded
    except ImportError as exc:
        raise UsageError(f"`tabletune run` needs the pipeline extra ({exc}); install it with "
                         "pip install -e '.[pipeline]'") from None

    if args.deployment:
        raise UsageError(f"--deployment {args.deployment!r}: `tabletune run` runs every deployment of the fleet; "
                         "point --fleet at a file with only the deployments to run")
    _deployment(args)  # a bad --fleet fails here, before Dagster starts
    if args.fleet:
        os.environ["TABLETUNE_FLEET"] = args.fleet
    if args.db:
        os.environ["TABLETUNE_DUCKDB"] = args.db
    if args.mix is not None:
        from tabletune_pipelines.errors import InvalidValueError, NotFoundError
        from tabletune_pipelines.formats.prompt_mixes import parse_weights

        try:
            parse_weights(args.mix)  # a bad mix fails here, before Dagster starts
        except (NotFoundError, InvalidValueError) as exc:
            raise UsageError(f"--mix {args.mix!r}: {exc}") from None
    return run_embedded((["--quick"] if args.quick else []) + (["--week", args.week] if args.week else [])
                        + (["--mix", args.mix] if args.mix is not None else []))


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="tabletune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fleet", default=os.environ.get("TABLETUNE_FLEET"),
                    help="fleet YAML (default: the embedded default, tabletune_pipelines/data/fleet.yaml)")
    ap.add_argument("--deployment", default=None, help="deployment name (default: the first in the fleet)")
    ap.add_argument("--db", default=None, help="DuckDB store (default $TABLETUNE_HOME/tabletune_store.duckdb)")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("profile", help="measure step times T(B, k) on the deployment's engine (resumable)")
    p.add_argument("--mode", default=DEFAULT_PROFILE_MODE, choices=PROFILE_MODES)
    p.add_argument("--plan", default="adaptive", choices=("adaptive", "grid"),
                   help="adaptive (default, one_launch mode): coarse batch sizes first, then bisection where the best "
                        "k changes and repetitions until each decision is settled or tied within 1%%; grid: every "
                        "batch size of --batch-sizes with --repetitions each")
    p.add_argument("--batch-sizes", type=_int_list(1),
                   help="comma-separated, each in 1..max_num_seqs (default: 1..16 then every 8 to max_num_seqs)")
    p.add_argument("--ks", type=_int_list(0), help="comma-separated k values, each in 0..max_k (default 0..max_k)")
    p.add_argument("--repetitions", type=_profile_number("repetitions"), default=DEFAULT_REPETITIONS,
                   help=f"repetitions per cell, 1..100 (default {DEFAULT_REPETITIONS})")
    p.add_argument("--accept-batch-sizes", type=_int_list_or_none(1), default=None,
                   help="batch sizes of the all-accepted cells (accepted-work correction; default smallest, "
                        "middle, largest); 'none' for none (on a GPU they need a launch of their own)")
    p.add_argument("--context-levels", type=_int_list(1), default=None,
                   help="comma-separated context levels in tokens, ascending: every cell measured with prompts this "
                        "long (default: the fleet's context_levels, else one level of 32)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (levels, batch sizes, k) and launch nothing")
    p.add_argument("--no-nospec", action="store_true", help="skip the no-speculation baseline launch")
    p.add_argument("--fixed-k-baseline", action="store_true",
                   help="also time each k >= 1 in its own launch with K = k and no table (engine-dependence check)")
    # Defaults (engine.plan.DEFAULT_REMEASURE_BUDGET_S, core.remeasure.DEFAULT_MAX_REPETITIONS) are
    # named, not imported, so `--help` stays light; tests/cli check that the two agree.
    p.add_argument("--remeasure-budget", type=_profile_number("remeasure_budget_s"), default=None,
                   metavar="SECONDS",
                   help="after the first pass, measure for at most this long (0..86400; one_launch mode): the "
                        "cells behind ambiguous table decisions and the batch sizes the adaptive plan adds; "
                        "default 120, 0 turns it off")
    p.add_argument("--max-repetitions", type=_profile_number("max_repetitions"), default=None,
                   help="most repetitions re-measurement gives one cell, 1..100 (default 9)")
    p.add_argument("--decode-steps", type=_profile_number("decode_steps"), default=None,
                   help="decode steps one repetition times, 8..1024 (default 64; the main job uses 32)")
    p.add_argument("--coarse-points", type=_profile_number("coarse_points"), default=None,
                   help="batch sizes of the adaptive plan's first pass, 2..64 (default 5; the main job uses 3)")
    p.add_argument("--startup-timeout", type=_profile_number("startup_timeout"), default=None,
                   help="seconds to wait for each engine launch to become healthy, 1..3600 (default 600; a cold GPU "
                        "launch with CUDA graphs can take 2-3 minutes, a slow CPU several)")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("acceptance", help="measure a_i on a JSONL prompt file (one {\"prompt\": ...} per line)")
    p.add_argument("--prompts", required=True)
    p.add_argument("--week", type=_iso_date, default=None, help="label, e.g. 2026-11-23 (default: adhoc)")
    p.set_defaults(func=cmd_acceptance)

    p = sub.add_parser("table", help="derive and show the goodput-optimal table from the store")
    p.add_argument("--identity", help="engine identity key (default: the engine the deployment runs now)")
    p.add_argument("--prior", help="acceptance prior id (default: the newest sane prior that applies to the profile's "
                                   "engine, the pipeline's rule)")
    p.add_argument("--rates", type=_rates, default=None,
                   help="use these acceptance rates a_1..a_K instead of a stored prior, e.g. 0.7,0.5,0.3")
    p.add_argument("--mode", default=DEFAULT_PROFILE_MODE, choices=PROFILE_MODES)
    p.add_argument("--format", default="text", choices=["text", "vllm"])
    p.add_argument("--plot", help="write a goodput-vs-batch-size PNG here: a new file or an earlier plot of "
                                  "TableTune's, never anything else (written atomically)")
    p.add_argument("--no-correction", action="store_true", help="ignore the accepted-work step-time correction")
    p.add_argument("--policy", default="evidence", choices=["evidence", "stickiness"],
                   help="table search rule: switch k only on evidence (default) or the method's 0.5%% rule")
    p.add_argument("--save", action="store_true", help="store the table in DuckDB")
    p.set_defaults(func=cmd_table)

    p = sub.add_parser("run", help="run the whole Dagster pipeline on the fleet (the README's main command)")
    p.add_argument("--quick", action="store_true", help="small profile plan (3 batch sizes, 2 repetitions)")
    p.add_argument("--week", type=_monday,
                   help="week of logged prompts (Monday, YYYY-MM-DD); default the last complete week")
    p.add_argument("--mix", default=None,
                   help="mix of the sample week written when the week has no logged prompts, e.g. code:0.5,prose:0.5 "
                        "(mixes: code = HumanEval, prose = WritingBench, chat = FreshQA); default code:0.5,prose:0.5")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("show", help="summarise the deployment's published table: the table, its engine, prior, "
                                    "predicted loss, served verification and file (--json: the whole document)")
    p.add_argument("--json", action="store_true", help="print the published document as it is, JSON")
    p.set_defaults(func=cmd_show)
    return ap


def _print_error(exc: BaseException) -> None:
    first, *rest = (str(exc) or type(exc).__name__).splitlines() or [""]
    print(f"error: {first}", file=sys.stderr)
    for line in rest:
        print(f"  {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TableTuneError as exc:
        _print_error(exc)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted: measured cells are stored; rerun to resume", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
