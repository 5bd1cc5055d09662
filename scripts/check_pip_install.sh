#!/usr/bin/env bash
# Checks `pip install --no-build-isolation .` (README, docs/python-api.md): builds the
# wheel of this repository with the given interpreter (simulator flavour only, to keep
# it short), installs it into a scratch directory and runs a 2-rank dispatch and
# combine from the installed package.
#
#   check_pip_install.sh PYTHON SCRATCH_DIR
set -euo pipefail
python=$1
scratch=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rm -rf "$scratch"
mkdir -p "$scratch"
"$python" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps \
  --target "$scratch/site" -C cmake.define.RAILYARD_BUILD_CUDA=OFF -C build-dir="$scratch/build" "$root"
cd "$scratch"  # away from the source tree: the installed package must stand alone
PYTHONPATH="$scratch/site" RAILYARD_EXTENSION_DIR= "$python" - <<'PY'
import torch
import railyard
import railyard.sim

assert railyard.__file__.startswith(__import__("os").getcwd()), railyard.__file__

def fn(group):
    buf = railyard.Buffer(group, hidden_dim=128, max_num_of_tokens_per_rank=4, num_local_experts=1)
    x = torch.full((2, 128), float(group.rank() + 1), dtype=torch.bfloat16)
    d = buf.dispatch(x, topk_idx=torch.tensor([[0], [1]]), topk_weights=torch.ones(2, 1))
    return buf.combine(d.hidden, handle=d.handle).hidden

out = railyard.sim.run(world_size=2, fn=fn)
for rank, y in enumerate(out):
    assert torch.equal(y, torch.full((2, 128), float(rank + 1), dtype=torch.bfloat16)), (rank, y)
print("pip install: OK", railyard.__file__)
PY
