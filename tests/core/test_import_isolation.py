"""What runs inside vLLM serving processes must not pull in the pipeline's heavy dependencies."""

import subprocess
import sys

import pytest

SERVING_SIDE = [
    "tabletune_pipelines",
    "tabletune_pipelines.core.goodput",
    "tabletune_pipelines.core.table",
    "tabletune_pipelines.core.acceptance",
    "tabletune_pipelines.core.steptime",
    "tabletune_pipelines.documents",
    "tabletune_pipelines.published",
    "tabletune_pipelines.controller",
]


@pytest.mark.parametrize("module", SERVING_SIDE)
def test_serving_side_modules_import_without_dagster_pandas_duckdb(module):
    code = (
        f"import sys, {module}\n"
        "bad = sorted(m for m in ('dagster', 'pandas', 'duckdb', 'matplotlib') if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing {module} pulled in {out}"
