#!/usr/bin/env bash
# Runs the GPU-in-the-loop NIC emulator's test on GPU 0 (tests/emulator/
# nic_emulator_gpu_test.cpp; docs/design-internode.md, "The NIC emulator"): builds it in
# the CUDA flavour for that GPU's architecture, runs it, then runs it under
# compute-sanitizer memcheck and synccheck. Needs the CUDA toolkit, CMake, Ninja and
# GoogleTest; never a NIC or the network.
#
#   bash scripts/nic-emulator.sh [--build-dir DIR] [--jobs N]
#
# Exit code: 0 when every run passed, 1 when one failed, 2 for a bad command line, 77
# when there is nothing to run it on (no GPU, no toolkit), with the reason.
# RAILYARD_SMOKE_NVIDIA_SMI names the nvidia-smi to use (the tests pass a missing one).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-emulator"
jobs=$(nproc 2>/dev/null || echo 4)

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "nic-emulator.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

skip() { echo "nic-emulator.sh: skipped: $*"; exit 77; }

nvidia_smi=${RAILYARD_SMOKE_NVIDIA_SMI:-$(command -v nvidia-smi || true)}
[[ -n $nvidia_smi && -x $nvidia_smi ]] || skip "no nvidia-smi (no NVIDIA driver on this machine), so no GPU to run on"
line=$("$nvidia_smi" --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>/dev/null | head -n 1 || true)
cap=$(echo "${line##*,}" | xargs)
[[ $cap =~ ^([0-9]+)\.([0-9]+)$ ]] || skip "nvidia-smi found no usable GPU (compute capability '${cap}')"
((BASH_REMATCH[1] >= 9)) || skip "compute capability $cap: the lane needs sm_90 or newer"
arch="${BASH_REMATCH[1]}${BASH_REMATCH[2]}a"
nvcc=$(command -v nvcc || true)
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n $nvcc ]] || skip "no nvcc (CUDA toolkit) on PATH or in /usr/local/cuda/bin"
sanitizer=$(command -v compute-sanitizer || true)
[[ -z $sanitizer && -x "$(dirname "$nvcc")/compute-sanitizer" ]] && sanitizer="$(dirname "$nvcc")/compute-sanitizer"

echo "nic-emulator.sh: GPU 0 is sm_$arch; building into $build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CUDA_COMPILER="$nvcc" -DRAILYARD_BUILD_CUDA=ON \
  -DRAILYARD_BUILD_SIM=OFF -DRAILYARD_BUILD_PYTHON=OFF -DRAILYARD_BUILD_TESTS=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C "$build" -j"$jobs" nic_emulator_gpu_test
test_bin="$build/tests/emulator/nic_emulator_gpu_test"

failed=0
run() {
  local name=$1; shift
  local start=$(date +%s) rc=0
  # Every wait in the test is bounded (a few seconds); the timeout is for the unforeseen.
  timeout --kill-after=30 600 "$@" || rc=$?
  echo "nic-emulator.sh: $name: $([[ $rc == 0 ]] && echo PASS || echo "FAIL (exit $rc)") in $(($(date +%s) - start)) s"
  [[ $rc == 0 ]] || failed=1
}
run plain "$test_bin"
if [[ -n $sanitizer ]]; then
  for tool in memcheck synccheck; do
    run "compute-sanitizer --tool $tool" "$sanitizer" --tool "$tool" --error-exitcode 1 "$test_bin"
  done
else
  echo "nic-emulator.sh: compute-sanitizer: SKIPPED (not in the CUDA toolkit)"
fi
exit $failed
