#!/usr/bin/env bash
# Tests of scripts/gpu-smoke.sh on a machine without a GPU (ctest tools.gpu_smoke,
# label host): with no nvidia-smi every step is skipped with the reason, the report is
# written and the exit code is 0; with a fake nvidia-smi, --plan derives the arch from
# the compute capability and lists the commands, --only selects steps, and a
# pre-Hopper GPU is skipped.
#
#   bash tests/tools/test_gpu_smoke.sh <scratch dir>
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
scratch=${1:?usage: test_gpu_smoke.sh <scratch dir>}
rm -rf "$scratch" && mkdir -p "$scratch"
smoke="$root/scripts/gpu-smoke.sh"
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect_line() {  # FILE REGEX WHAT
  grep -qE "$2" "$1" || fail "$3: no line matching '$2' in $1"
}

# A fake nvidia-smi reporting one GPU of compute capability $1.
fake_smi() {
  local dir="$scratch/smi-$1"
  mkdir -p "$dir"
  printf '#!/bin/sh\necho "NVIDIA Test GPU, 999.1, %s"\n' "$1" >"$dir/nvidia-smi"
  chmod +x "$dir/nvidia-smi"
  echo "$dir/nvidia-smi"
}

# 1. No GPU: every step skipped with the reason, the report written, exit 0.
rc=0
RAILYARD_SMOKE_NVIDIA_SMI="$scratch/no-such-nvidia-smi" bash "$smoke" --out "$scratch/none" >"$scratch/none.out" 2>&1 || rc=$?
report="$scratch/none/report.txt"
[[ $rc == 0 ]] || fail "no GPU: exit $rc, expected 0"
[[ -f $report ]] || fail "no GPU: no report at $report"
for step in build ctest_gpu sanitize_memcheck sanitize_synccheck sanitize_racecheck e2e_r2 e2e_r4 e2e_r8 \
            bench_bf16_r1 bench_fp8_r1 bench_memcheck bench_synccheck metadata_nsys calibrate profile_ncu; do
  expect_line "$report" "^STEP $step: SKIPPED \(0 s\) no nvidia-smi" "no GPU, step $step"
done
expect_line "$report" "^RESULT: SKIPPED: nothing could run here" "no GPU, result"
if grep -qE ': (PASS|FAIL) \(' "$report"; then fail "no GPU: a step claims to have run"; fi

# 2. A fake H100 (9.0), --plan: arch 90a, the commands listed, nothing run.
rc=0
RAILYARD_SMOKE_NVIDIA_SMI=$(fake_smi 9.0) bash "$smoke" --plan --quick --out "$scratch/h100" \
  --build-dir "$scratch/h100-build" --gtest-src "$scratch/googletest" >"$scratch/h100.out" 2>&1 || rc=$?
report="$scratch/h100/report.txt"
[[ $rc == 0 ]] || fail "plan: exit $rc"
expect_line "$report" "^GPU 0: NVIDIA Test GPU; driver 999.1; compute capability 9.0$" "plan, GPU line"
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  expect_line "$report" "^CUDA architecture: 90a$" "plan, arch"
  expect_line "$report" "^PLAN build: .*-DRAILYARD_BUILD_SIM=OFF .*-DCMAKE_CUDA_ARCHITECTURES=90a " "plan, build"
  expect_line "$report" "^PLAN e2e_r2: .*multi_process_e2e_cuda --ranks 2 --calls 100 --long-calls 500" "plan, e2e"
  expect_line "$report" "^PLAN bench_fp8_r1: .*railyard_bench_ep_cuda.* --ranks 1 .*--dtype fp8" "plan, bench"
  expect_line "$report" "^PLAN build: .*cmake -S '$scratch/googletest' .*ninja -C .*_gtest/build.* install.*-DCMAKE_PREFIX_PATH='$scratch/h100-build/_gtest'" "plan, GoogleTest from --gtest-src"
  expect_line "$report" "^PLAN build: .*-DCMAKE_CUDA_FLAGS=-lineinfo" "plan, line information"
  expect_line "$report" "^PLAN calibrate: env RAILYARD_CALIBRATE_NVIDIA_SMI=.* .*/scripts/gpu-calibrate.sh --build-dir $scratch/h100-build --no-build --no-doc --out $scratch/h100/calibrate" "plan, calibrate"
  expect_line "$report" "^PLAN profile_ncu: .*--set full .*railyard_bench_ep_cuda.* --sms 1 .*--page source --csv --print-source sass" "plan, profile"
fi
expect_line "$report" "^RESULT: PLAN only" "plan, result"
[[ ! -d $scratch/h100-build ]] || fail "plan: the build directory was created"

# 3. Blackwell (10.0) -> 100a; a pre-Hopper GPU (8.0) is skipped with the reason.
RAILYARD_SMOKE_NVIDIA_SMI=$(fake_smi 10.0) bash "$smoke" --plan --out "$scratch/b200" >/dev/null 2>&1
expect_line "$scratch/b200/report.txt" "^CUDA architecture: 100a$" "compute capability 10.0"
RAILYARD_SMOKE_NVIDIA_SMI=$(fake_smi 8.0) bash "$smoke" --out "$scratch/a100" >/dev/null 2>&1 || fail "8.0: exit $?"
expect_line "$scratch/a100/report.txt" "^STEP build: SKIPPED .*need sm_90 or newer" "compute capability 8.0"

# 4. --only: the other steps are reported as not selected.
RAILYARD_SMOKE_NVIDIA_SMI=$(fake_smi 9.0) bash "$smoke" --plan --only e2e_r4,bench_fp8 --out "$scratch/only" >/dev/null 2>&1
expect_line "$scratch/only/report.txt" "^STEP build: SKIPPED \(0 s\) not selected \(--only e2e_r4,bench_fp8\)" "--only, build"
expect_line "$scratch/only/report.txt" "^STEP e2e_r2: SKIPPED \(0 s\) not selected" "--only, e2e_r2"
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  expect_line "$scratch/only/report.txt" "^PLAN e2e_r4: " "--only, e2e_r4"
  expect_line "$scratch/only/report.txt" "^PLAN bench_fp8_r1: " "--only, bench_fp8_r1"
fi

# 5. A bad option: exit 2.
rc=0
bash "$smoke" --no-such-option >/dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "bad option: exit $rc, expected 2"

if [[ $failures -gt 0 ]]; then echo "test_gpu_smoke: $failures FAILED"; exit 1; fi
echo "test_gpu_smoke: all passed"
