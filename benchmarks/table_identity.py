"""The sha256 of every table derived from the committed profiles, and of the pages rendered from them:
a refactoring that must not change behaviour shows it by equal hashes before and after.

    python benchmarks/table_identity.py --out identity.json            # profiles, tables, reports, pages
    python benchmarks/table_identity.py --out identity.json --no-simulator   # without the simulator (minutes)
    python benchmarks/table_identity.py --compare before.json after.json     # exit 1 on any difference

Every step-time profile under ``benchmarks/data/`` (``*.one_launch.json``, ``*.profile.json``) is derived
(``tuning.derive.derive_table``) under both search rules and five priors (two fixed rate sets, and the
geometric ones of ``core.remeasure.DEFAULT_DECISION_RATES``); each table's JSON document, its markdown
reports (``tuning.report``) and the gates' verdicts are hashed. Then the results page
(``benchmarks/report.py``'s ``render``) and the simulator page (``benchmarks/evaluate.py``, written to a
temporary folder; its plots are not hashed) are hashed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"_tt_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def profiles() -> list[Path]:
    return sorted({*DATA.glob("**/*.one_launch.json"), *DATA.glob("**/*.profile.json")})


def table_hashes() -> dict[str, str]:
    from tabletune_pipelines.core.remeasure import DEFAULT_DECISION_RATES, geometric_rates
    from tabletune_pipelines.formats.documents import AcceptancePrior, StepTimeProfile
    from tabletune_pipelines.tuning import gates, report
    from tabletune_pipelines.tuning.derive import DeriveOptions, derive_table

    out: dict[str, str] = {}
    for path in profiles():
        prof = StepTimeProfile.from_json(path.read_text())
        K = prof.identity.max_k
        rate_sets = {"a753": (0.7, 0.5, 0.3)[:K], "a864": (0.8, 0.6, 0.4)[:K],
                     **{f"geo{p}": geometric_rates(p, K) for p in DEFAULT_DECISION_RATES}}
        for rname, rates in rate_sets.items():
            n = len(rates)
            prior = AcceptancePrior(rates=tuple(rates), num_drafts=4800, drafted_per_pos=(4800,) * n,
                                    accepted_per_pos=tuple(int(round(4800 * a)) for a in rates),
                                    prompt_fingerprint="identity", prompt_count=160, source="synthetic")
            for policy in ("stickiness", "evidence"):
                key = f"{path.relative_to(DATA).as_posix()}|{rname}|{policy}"
                tuned = derive_table(prof, prior, DeriveOptions(policy=policy))
                t = tuned.table
                out[key + "|table.json"] = _sha(t.to_json())
                out[key + "|reports"] = _sha("\n".join([
                    report.table_markdown(t.ranges), report.ranges_line(t.ranges), report.goodput_markdown(tuned),
                    report.loss_text(t), report.boundaries_markdown(t), report.within_noise_markdown(t),
                    report.accepted_work_text(t), report.evidence_markdown(tuned)]))
                verdicts = [*gates.blocking_table_gates(t, 0.02),
                            gates.cuda_graph_headroom_gate(t, prof.identity.cudagraph_mode or "NONE")]
                out[key + "|gates"] = _sha(repr(verdicts))
    return out


def page_hashes(simulator: bool) -> dict[str, str]:
    out = {"docs/results.md (rendered)": _sha(_module("report").render())}
    if simulator:
        ev = _module("evaluate")
        with tempfile.TemporaryDirectory(prefix="tt-identity-") as d:
            page = Path(d) / "simulator.md"
            ev.main(["--out", str(page)])
            out["benchmarks/simulator.md (rendered)"] = _sha(page.read_text())
    return out


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    for k in differ:
        print(f"differs: {k}: {a.get(k)} -> {b.get(k)}")
    print(f"{len(a)} hashes before, {len(b)} after, {len(differ)} differ")
    return 1 if differ else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--no-simulator", action="store_true", help="skip the simulator page (minutes)")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    hashes = {**table_hashes(), **page_hashes(not args.no_simulator)}
    text = json.dumps(hashes, indent=1, sort_keys=True) + "\n"
    if args.out:
        args.out.write_text(text)
        print(f"wrote {len(hashes)} hashes to {args.out}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
