"""The layers, checked by importing them in fresh interpreters.

* Only the Dagster layer (``tabletune_pipelines/orchestration/``, the code location
  ``tabletune_pipelines/definitions.py`` with its ``defs/`` folder, the main command
  ``tabletune_pipelines/embedded.py``, and the top-level ``assets/`` that re-exports the code
  location) imports dagster: the tuner CLI runs on GPU nodes that have vLLM and no Dagster.
* What runs inside vLLM serving processes (core, the documents, the published file, live counters,
  the control protocol, the controller) imports neither dagster, pandas nor duckdb.
* The CLI's ``profile``, ``acceptance``, ``table`` and ``show`` run with Dagster impossible to import.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tabletune_pipelines

from tests.architecture.scan import write_tree

DAGSTER_LAYER = ("tabletune_pipelines.orchestration", "tabletune_pipelines.defs", "tabletune_pipelines.definitions",
                 "tabletune_pipelines.embedded")
SERVING_SIDE = [
    "tabletune_pipelines",
    "tabletune_pipelines.core",
    "tabletune_pipelines.core.goodput",
    "tabletune_pipelines.core.table",
    "tabletune_pipelines.core.acceptance_estimate",
    "tabletune_pipelines.core.steptime",
    "tabletune_pipelines.errors",
    "tabletune_pipelines.vocab",
    "tabletune_pipelines.formats.documents",
    "tabletune_pipelines.formats.document_base",
    "tabletune_pipelines.options",
    "tabletune_pipelines.formats.published",
    "tabletune_pipelines.formats.published_schema",
    "tabletune_pipelines.formats.published_build",
    "tabletune_pipelines.formats.published_files",
    "tabletune_pipelines.formats.live_counters",
    "tabletune_pipelines.formats.control_protocol",
    "tabletune_pipelines.controller",
]
HEAVY = ("dagster", "pandas", "duckdb")

# Makes ``import dagster`` (and dagster_* packages) fail as if Dagster were not installed.
NO_DAGSTER = textwrap.dedent("""
    import importlib.abc, sys

    class _NoDagster(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "dagster" or name.startswith("dagster_"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, _NoDagster())
""")


def _python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300)


def library_modules() -> list[str]:
    """Every module of the package outside the Dagster layer."""
    names = ["tabletune_pipelines"]
    for info in pkgutil.walk_packages(tabletune_pipelines.__path__, "tabletune_pipelines."):
        if not info.name.startswith(DAGSTER_LAYER):
            names.append(info.name)
    return sorted(names)


def test_the_walk_sees_every_layer():
    mods = library_modules()
    for expected in ("tabletune_pipelines.cli", "tabletune_pipelines.formats.fleet", "tabletune_pipelines.store",
                     "tabletune_pipelines.tuning.deployments", "tabletune_pipelines.engine.profiler",
                     "tabletune_pipelines.tuning.derive", "tabletune_pipelines.formats.prompts"):
        assert expected in mods
    assert not any(m.startswith(DAGSTER_LAYER) for m in mods)


def modules_pulling_in(modules: list[str], heavy: tuple[str, ...], path: Path | None = None) -> list[str]:
    """The first of ``modules``, imported one by one in a fresh interpreter (``path`` first on its
    ``sys.path``), after which one of ``heavy`` is loaded (that module, or one it imports, pulled it
    in); empty when none does."""
    code = textwrap.dedent(f"""
        import importlib, json, sys
        if {str(path) if path else None!r}:
            sys.path.insert(0, {str(path)!r})
        culprits = []
        for name in {modules!r}:
            importlib.import_module(name)
            if any(h in sys.modules for h in {heavy!r}):
                culprits.append(name)
                break
        print(json.dumps(culprits))
    """)
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_no_module_outside_the_dagster_layer_imports_dagster():
    assert modules_pulling_in(library_modules(), ("dagster",)) == [], "importing this module pulled in dagster"


@pytest.mark.parametrize("module", SERVING_SIDE)
def test_serving_side_modules_import_without_dagster_pandas_duckdb(module):
    assert modules_pulling_in([module], HEAVY) == [], f"importing {module} pulled in one of {HEAVY}"


def test_the_isolation_check_reports_a_module_that_pulls_in_a_heavy_package(tmp_path):
    """The rule can fail: in a synthetic package, the module that imports (a stand-in for) duckdb
    through another is named, and the clean one before it is not."""
    write_tree(tmp_path, {"fakepkg/__init__.py": "", "fakepkg/clean.py": "import json\n",
                          "fakepkg/store.py": "from fakepkg import db\n", "fakepkg/db.py": "import duckdb\n",
                          "duckdb/__init__.py": ""})
    assert modules_pulling_in(["fakepkg.clean", "fakepkg.store"], ("duckdb",), tmp_path) == ["fakepkg.store"]
    assert modules_pulling_in(["fakepkg.clean"], ("duckdb",), tmp_path) == []


def test_cli_tuner_paths_run_without_dagster(tmp_path):
    """table and show for real; profile and acceptance up to the engine launch (the measurement
    functions are replaced by stubs that import what the real ones import)."""
    home = tmp_path / "home"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "the cat sat on the mat"}\n')
    code = NO_DAGSTER + textwrap.dedent(f"""
        import os
        os.environ["TABLETUNE_HOME"] = {str(home)!r}
        os.environ.pop("TABLETUNE_FLEET", None)
        os.environ.pop("TABLETUNE_DUCKDB", None)

        from tabletune_pipelines import cli
        from tabletune_pipelines.tuning import deployments
        from tabletune_pipelines.formats.documents import AcceptancePrior, DraftLengthTable, EngineIdentity, StepTimeCell
        from tabletune_pipelines.formats.fleet import default_store_path, load_fleet
        from tabletune_pipelines.formats.published_build import published_document
        from tabletune_pipelines.formats.published_files import write_published_table
        from tabletune_pipelines.formats.published_schema import PublishedVersion
        from tabletune_pipelines.store import TableTuneStore

        dep = load_fleet().deployments[0]
        ident = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model=dep.model, drafter=dep.drafter,
                               method=dep.method, max_k=dep.max_k, max_num_seqs=dep.max_num_seqs)
        rows = {{None: (3.0, 3.4, 4.7), 0: (3.2, 3.6, 5.0), 1: (4.4, 5.3, 8.4), 2: (5.0, 5.9, 10.6),
                 3: (5.6, 6.4, 12.8)}}
        cells = [StepTimeCell(k=k, batch_size=b, median_ms=ms, repetitions_ms=(ms,), launch_k=3)
                 for k, row in rows.items() for b, ms in zip((1, 4, 16), row)]
        prior = AcceptancePrior(rates=(0.7, 0.5, 0.3), num_drafts=1000, drafted_per_pos=(1000,) * 3,
                                accepted_per_pos=(700, 500, 300), prompt_fingerprint="0" * 64, prompt_count=1,
                                deployment=dep.name)

        def fake_profile(identity, dep, store, *, log, options=None, **kw):
            from tabletune_pipelines.engine import profiler  # noqa: F401 - what the real one imports
            store.write_profile_cells(identity, cells)
            return store.load_profile(identity.key)

        def fake_acceptance(identity, dep, prompts_file, week, *, log, options=None, **kw):
            from tabletune_pipelines.engine import acceptance  # noqa: F401 - what the real one imports
            return prior

        deployments.current_identity = lambda dep, timeout_s=5.0: ident
        deployments.profile = fake_profile
        deployments.measure_acceptance = fake_acceptance

        assert cli.main(["profile", "--ks", "0,1,2,3"]) == 0
        assert cli.main(["acceptance", "--prompts", {str(prompts)!r}]) == 0
        assert cli.main(["table", "--format", "vllm"]) == 0
        table = DraftLengthTable(ranges=((1, dep.max_num_seqs, 1),), max_num_seqs=dep.max_num_seqs,
                                 max_k=dep.max_k, identity_key=ident.key, prior_id=prior.prior_id,
                                 acceptance_rates=prior.rates)
        write_published_table(dep.published_table, published_document(PublishedVersion(
            deployment=dep.name, version=1, table=table.to_dict(),
            speculative_config=table.speculative_config(dep.base_speculative_config()),
            published_at="2026-11-23T03:00:00Z")))
        assert cli.main(["show"]) == 0

        import sys
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "dagster" or m.startswith("dagster_"))
        assert not loaded, loaded
        print("OK")
    """)
    proc = _python(code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "OK"


def test_run_says_what_to_install_without_dagster(tmp_path):
    code = NO_DAGSTER + "from tabletune_pipelines import cli\nraise SystemExit(cli.main(['run']))\n"
    proc = _python(code, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: `tabletune run` needs the pipeline extra") and "Traceback" not in proc.stderr


def test_engine_lazy_exports_are_listed_in_all():
    """``tabletune_pipelines.engine`` writes ``__all__`` out for linters and type checkers; it names
    exactly the names its ``__getattr__`` loads on first use, and importing the package loads none."""
    code = textwrap.dedent("""
        import json, sys
        import tabletune_pipelines.engine as engine
        loaded = sorted(m for m in sys.modules if m.startswith("tabletune_pipelines.engine."))
        print(json.dumps([engine.__all__, sorted(engine._EXPORTS), loaded]))
    """)
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    listed, exported, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert listed == exported == ["ProfileHooks", "ProfileOptions", "ProfileServers", "ServerConfig", "VLLMServer",
                                  "measure_acceptance", "profile_step_times"]
    assert loaded == []
