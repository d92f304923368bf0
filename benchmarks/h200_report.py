"""Tables, predicted losses and the measured closed-loop goodput on the H200 profiles (no GPU needed).

    python benchmarks/h200_report.py

Reads the profiles the project's own tuner measured on one H200 (vLLM 0.26.0, Model Runner V2,
full CUDA graphs, dummy weights; `benchmarks/data/h200/*.one_launch.json`, the store's export) and:
1. derives each engine's table for acceptance (0.7, 0.5, 0.3) and (0.8, 0.6, 0.4);
2. predicts, from the same profile, each fixed k's and the docs' table's loss against the best
   fixed k per batch size (what the table would lose if the profile is right);
3. summarises the measured closed-loop goodput logs of `benchmarks/gpu_goodput.py` (synthetic
   acceptance (0.7, 0.5, 0.3), tables hot-swapped between windows in rotating order, two rounds;
   one launch per log): goodput per policy and load with the spread of the two rounds, the loss
   against the best fixed k measured at that load, and the A/A line (two names for one table);
4. prints the controller's GPU run (`dense-controller.json`, `benchmarks/gpu_controller.py`): its
   per-step hook cost as a share of a decode step, and the repair from the quartered table.
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from tabletune_pipelines.evaluation.synthetic import fixed_prior

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "h200"
RATES = ((0.7, 0.5, 0.3), (0.8, 0.6, 0.4))
DOCS_DENSE = [[1, 64, 3], [65, 128, 1]]  # the docs' EAGLE example cut to max_num_seqs = 128


def load_profiles() -> dict[str, "object"]:
    from tabletune_pipelines.formats.documents import StepTimeProfile

    out = {}
    for p in sorted(DATA.glob("*.one_launch.json")):
        prof = StepTimeProfile.from_json(p.read_text())
        out["moe" if "a3b" in prof.identity.model else "dense"] = prof
    return out


def predicted_losses(tuned, table) -> np.ndarray:
    """Per B: 1 - G(table's k) / max over k of G, from the profile the table was derived on."""
    from tabletune_pipelines.core.table import DraftTable

    g = tuned.choice.goodput
    ks = list(tuned.choice.ks)
    M = g.shape[1]
    dense = DraftTable.from_entries(table).vllm_lookup(M, max(ks))[1:]
    return np.array([1.0 - g[ks.index(dense[b]), b] / g[:, b].max() for b in range(M)])


def measured_summary(log: Path):
    pat = re.compile(r"load\s+(\d+) round (\d+) (\S+)\s+([\d.]+) tok/s")
    vals: dict[tuple[str, int], list[float]] = defaultdict(list)
    for line in log.read_text().splitlines():
        m = pat.search(line)
        if m:
            vals[(m.group(3), int(m.group(1)))].append(float(m.group(4)))
    return vals


def main() -> int:
    from tabletune_pipelines.tuning.derive import derive_table

    profiles = load_profiles()
    for name, prof in profiles.items():
        ident = prof.identity
        bs = sorted({c.batch_size for c in prof.cells})
        spreads = [c.spread for c in prof.cells]
        print(f"\n## {name}: {ident.key}")
        print(f"   {ident.gpu}, vLLM {ident.vllm_version}, runner {ident.model_runner}, graphs {ident.cudagraph_mode}; "
              f"{len(prof.cells)} cells at B = {bs[0]}..{bs[-1]} ({len(bs)} sizes); median cell spread "
              f"{100 * statistics.median(spreads):.1f}% (max {100 * max(spreads):.0f}%)")
        for rates in RATES:
            tuned = derive_table(prof, fixed_prior(rates))
            table = tuned.table.as_vllm()
            loss = {f"fixed k={k}": predicted_losses(tuned, [[1, ident.max_num_seqs, k]]).max()
                    for k in tuned.choice.ks}
            docs = predicted_losses(tuned, DOCS_DENSE)
            print(f"   a = {rates}: table {table}; predicted worst loss: tuned "
                  f"{100 * predicted_losses(tuned, table).max():.1f}%, docs {100 * docs.max():.1f}% "
                  f"(at B = {int(docs.argmax()) + 1}), " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in loss.items()))
    for title, logs in MEASURED:
        paths = [DATA / name for name in logs if (DATA / name).exists()]
        if paths:
            measured_table(title, paths)
    controller_report(DATA / "dense-controller.json")
    return 0


#: (title, logs): each log is one launch of benchmarks/gpu_goodput.py.
MEASURED = [
    ("moe, measured closed-loop goodput; loads 1-64 one launch (2 s windows), 96 and 128 another (3 s windows)",
     ["moe-goodput-closed-loop.log", "moe-goodput-96-128.log"]),
    ("dense, measured closed-loop goodput; one launch, 3 s windows", ["dense-goodput.log"]),
    ("dense, load 128 with `--compilation-config '{\"max_cudagraph_capture_size\": 1024}'`; one launch",
     ["dense-goodput-capture1024.log"]),
]


def measured_table(title: str, paths: list[Path]) -> None:
    vals: dict[tuple[str, int], list[float]] = defaultdict(list)
    aa: list[str] = []
    for path in paths:
        for key, v in measured_summary(path).items():
            vals[key].extend(v)
        aa += [line.strip() for line in path.read_text().splitlines() if line.strip().startswith("A/A")]
    loads = sorted({l for _, l in vals})
    policies = list(dict.fromkeys(p for p, _ in vals))
    fixed = [p for p in policies if p.startswith("fixed_k")]
    print(f"\n## {title} (tok/s, mean of 2 rounds ± half their difference; loss vs best fixed k)")
    print("| policy | " + " | ".join(f"load {l}" for l in loads) + " | worst |")
    print("|---|" + "---|" * (len(loads) + 1))
    for p in policies:
        cells, worst = [], 0.0
        for l in loads:
            v = vals.get((p, l), [])
            if not v:
                cells.append("n/a")
                continue
            best = max(statistics.fmean(vals[(f, l)]) for f in fixed if vals.get((f, l)))
            m = statistics.fmean(v)
            half = (max(v) - min(v)) / 2
            loss = 1 - m / best
            worst = max(worst, loss)
            cells.append(f"{m:.0f} ± {half:.0f} ({100 * loss:+.1f}%)")
        print(f"| {p} | " + " | ".join(cells) + f" | {100 * worst:.1f}% |")
    for line in aa:
        print(f"{line}")


def controller_report(path: Path) -> None:
    """The controller's run on the GPU: hook cost per step and the repair from the quartered table."""
    import json

    if not path.exists():
        return
    r = json.loads(path.read_text())
    print(f"\n## {r['engine']}: the controller in vLLM on the H200 (one launch, synthetic acceptance {tuple(r['rates'])})")
    print("| load | hook µs/step (mean, max) | clean decode step at that B | hook / step | all steps (mixed prefill) |")
    print("|---|---|---|---|---|")
    for load, h in sorted(r["hook"].items(), key=lambda kv: int(kv[0])):
        print(f"| {load} | {h['hook_us']:.1f}, {h['hook_us_max']:.1f} | {h['step_ms']:.2f} ms (B = {h['step_b']}) | "
              f"{100 * h['ratio']:.2f}% | {h['busy_step_ms']:.2f} ms |")
    print(f"tuned {r['tuned']}; wrong (each range quartered, k = 0 above) {r['wrong']}")
    print("| load | wrong tok/s | tuned tok/s | controller tok/s | controller / wrong | controller / tuned | gap recovered "
          "| first table change |")
    print("|---|---|---|---|---|---|---|---|")
    for load, x in sorted(r["repair"].items(), key=lambda kv: int(kv[0])):
        g = {k: statistics.fmean(v) if v else float("nan") for k, v in x["goodput"].items()}
        cw, ct, gap = x["controller_over_wrong"], x["controller_over_tuned"], x["gap_recovered"]
        print(f"| {load} | {g['wrong']:.0f} | {g['tuned']:.0f} | {g['controller']:.0f} | {cw[0]:.2f} ± {cw[1]:.2f} | "
              f"{ct[0]:.2f} ± {ct[1]:.2f} | {100 * gap[0]:.0f}% ± {100 * gap[1]:.0f}% | after {x['repaired_after_s']} s |")


if __name__ == "__main__":
    sys.exit(main())
