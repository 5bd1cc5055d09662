#!/usr/bin/env bash
# The Megatron drop-in under the newest megatron-core Railyard is tested with (pinned in
# scripts/setup.sh; it needs Python >= 3.12, so it has a venv of its own): runs the
# Megatron and DeepEP-API tests and the torch.compile tests with that interpreter,
# against the extension modules the build made for it (cmake/RailyardPython.cmake,
# RAILYARD_PYTHON_LATEST). Exit 77 (ctest: skipped) when either is missing.
#
#   test_megatron_latest.sh PYTHON EXTENSION_DIR
set -euo pipefail
python=$1
ext=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z $python || ! -x $python ]] || ! "$python" -c "import torch, megatron.core" >/dev/null 2>&1; then
  echo "megatron latest: SKIPPED: '$python' cannot import torch and megatron.core (run scripts/setup.sh)"
  exit 77
fi
if ! compgen -G "$ext/_C_sim*.so" >/dev/null; then
  echo "megatron latest: SKIPPED: no extension built for $python in $ext (reconfigure after scripts/setup.sh)"
  exit 77
fi
"$python" -c 'import sys, torch, megatron.core as m; print(f"megatron latest: Python {sys.version.split()[0]}, torch {torch.__version__}, megatron-core {m.__version__}")' 2>/dev/null
cd "$root"
PYTHONPATH="$root/python" RAILYARD_EXTENSION_DIR="$ext" "$python" -m pytest -q -p no:cacheprovider \
  tests/python/test_megatron.py tests/python/test_deepep_api.py tests/python/test_compile.py
