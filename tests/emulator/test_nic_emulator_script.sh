#!/usr/bin/env bash
# scripts/nic-emulator.sh where it cannot run (ctest tools.nic_emulator_script, label
# host): no nvidia-smi, and a GPU older than sm_90 (a fake nvidia-smi), each exit 77
# with the reason; a bad option exits 2.
set -uo pipefail
script="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/nic-emulator.sh"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect RC PATTERN CMD...: CMD exits RC and prints PATTERN.
expect() {
  local want_rc=$1 pattern=$2; shift 2
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  [[ $rc == "$want_rc" ]] || fail "$*: exit $rc, expected $want_rc; output: $out"
  [[ $out == *"$pattern"* ]] || fail "$*: no '$pattern' in: $out"
}

expect 77 "skipped: no nvidia-smi (no NVIDIA driver on this machine)" \
  env RAILYARD_SMOKE_NVIDIA_SMI="$scratch/no-such-nvidia-smi" bash "$script"
printf '#!/bin/sh\necho "NVIDIA Test GPU, 999.1, 8.0"\n' >"$scratch/nvidia-smi"
chmod +x "$scratch/nvidia-smi"
expect 77 "skipped: compute capability 8.0: the lane needs sm_90 or newer" \
  env RAILYARD_SMOKE_NVIDIA_SMI="$scratch/nvidia-smi" bash "$script"
expect 2 "unknown option '--bogus'" bash "$script" --bogus
echo "PASS"
