"""bfloat16 vs float32 on this CPU, side by side in one run: the figure behind the default dtype.

Times the matmul that dominates the medium tiny model's MLP (16 x 1024 x 2816, one thread, the
figure in docs/usage.md, "Which CPU you are on") in both dtypes, interleaved round by round, and prints
each mean with its standard error, their ratio and the dtype TableTune chooses here
(``engine/dtype.py``). On an AVX2-only AMD EPYC this matmul took 88 ms in bf16 against 3.3 ms in
float32 (27x); on a CPU with ``avx512_bf16``/AMX the two are close. With ``--engine`` it also
profiles the embedded default's k = 0 and k = 3 steps at B = 1 and 16 in both dtypes (two launches
of real vLLM, a few minutes).

    python benchmarks/cpu_dtype.py [--rounds 15] [--engine]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tabletune_pipelines.evaluation.bench import loadavg
from tabletune_pipelines.core.stats import mean_se


def matmul_ms(dtype, rounds: int, m: int = 16, k: int = 1024, n: int = 2816) -> list[float]:
    import torch

    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b  # warm-up: first call picks the kernel
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        a @ b
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def engine_cells(dtype: str, models: str) -> dict[tuple[int, int], float]:
    """Median step ms of (k, B) for k in (0, 3), B in (1, 16), every draft rejected, one launch."""
    from tabletune_pipelines.engine import ProfileOptions, ServerConfig, profile_step_times
    from tabletune_pipelines.engine.tiny_models import ensure_tiny_models

    m = ensure_tiny_models(models, "small", dtype)
    cfg = ServerConfig(model=str(m.target_dir), method="ngram", num_speculative_tokens=3, dtype=dtype,
                       speculative_extra={"prompt_lookup_max": 4, "prompt_lookup_min": 2})
    opts = ProfileOptions(batch_sizes=(1, 16), ks=(0, 3), repetitions=5, accept_batch_sizes=(), include_no_spec=False,
                          remeasure_budget_s=0)
    prof = profile_step_times(cfg, opts, progress=lambda _msg: None)
    return {(k, b): ms for k, row in prof.reject_cells().items() for b, ms in row.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--engine", action="store_true", help="also profile the embedded default in both dtypes")
    ap.add_argument("--models", default=str(Path.home() / ".tabletune" / "models"))
    args = ap.parse_args()
    import torch

    from tabletune_pipelines.engine.dtype import choose_dtype

    torch.set_num_threads(1)
    choice = choose_dtype("cpu")
    print(f"[cpu_dtype] torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"load {loadavg()}")
    print(f"[cpu_dtype] TableTune's default here: {choice.dtype} ({choice.reason})")
    bf, f32 = [], []
    for _ in range(args.rounds):  # interleaved: a busy moment hits both
        bf += matmul_ms(torch.bfloat16, 3)
        f32 += matmul_ms(torch.float32, 3)
    (mb, sb), (mf, sf) = mean_se(bf), mean_se(f32)
    print(f"[cpu_dtype] 16x1024x2816 matmul, 1 thread: bfloat16 {mb:.2f} ± {sb:.2f} ms, float32 {mf:.2f} ± "
          f"{sf:.2f} ms; bf16/f32 = {mb / mf:.2f}")
    if args.engine:
        cells = {d: engine_cells(d, args.models) for d in ("bfloat16", "float32")}
        print("| cell | bfloat16 | float32 | bf16/f32 |\n|---|---|---|---|")
        for k, b in ((0, 1), (3, 1), (0, 16), (3, 16)):
            x, y = cells["bfloat16"][(k, b)], cells["float32"][(k, b)]
            print(f"| k = {k}, B = {b} | {x:.1f} ms | {y:.1f} ms | {x / y:.2f} |")
        for d in cells:
            print(f"[cpu_dtype] {d}: k3/k0 at B = 16 = {cells[d][(3, 16)] / cells[d][(0, 16)]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
