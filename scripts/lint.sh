#!/usr/bin/env bash
# Lint the package: ruff (pycodestyle, pyflakes, import order, bugbear, pyupgrade) over the package
# and assets/, mypy over the package, and a check that every `# type: ignore[...]` says why on its
# line. Settings live in pyproject.toml ([tool.ruff], [tool.mypy]). Exits non-zero on any finding.
# Needs the test extra installed (bash scripts/setup.sh); .ci/run runs it before the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${TABLETUNE_VENV:-.venv}/bin/python"
if ! "$PY" -m ruff --version >/dev/null 2>&1 || ! "$PY" -m mypy --version >/dev/null 2>&1; then
  echo "[lint] ruff or mypy missing from ${TABLETUNE_VENV:-.venv}: run bash scripts/setup.sh" >&2
  exit 2
fi
status=0
echo "[lint] $("$PY" -m ruff --version): ruff check tabletune_pipelines assets"
"$PY" -m ruff check tabletune_pipelines assets || status=1
echo "[lint] $("$PY" -m mypy --version | cut -d' ' -f1-2): mypy (files from pyproject.toml)"
"$PY" -m mypy || status=1
# A suppression names its error code and gives a reason after it: `# type: ignore[code]  # why`.
bare=$(grep -rnE --include='*.py' '# type: ignore(\[[^]]*\])?[[:space:]]*$' tabletune_pipelines assets)
if [ -n "$bare" ]; then
  echo "$bare"
  echo "[lint] $(echo "$bare" | wc -l) '# type: ignore' without a reason after it on its line"
  status=1
fi
[ "$status" = 0 ] && echo "[lint] clean"
exit "$status"
