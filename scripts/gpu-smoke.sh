#!/usr/bin/env bash
# Railyard's GPU smoke run, for the first machine with a GPU (docs/gpu-smoke.md).
# Needs the CUDA toolkit, CMake and Ninja; never the network (GoogleTest and Boost are
# optional: without them the GoogleTest suites, hence the `gpu` ctest label, are left
# out and said so). Steps, each skipped with its reason when it cannot run:
#   gpu          nvidia-smi: name, driver, compute capability (-> the arch, 9.0 -> 90a),
#                fabric/IMEX lines and the topology matrix
#   build        the CUDA flavour for that arch only, simulator off
#   ctest_gpu    ctest -L gpu
#   sanitize_*   each gpu-labelled test binary under compute-sanitizer memcheck,
#                synccheck and racecheck
#   e2e_r*       multi_process_e2e_cuda: R ranks as R processes on GPU 0, bitwise
#                against railyard::reference (BF16, FP8, both layouts, many sources
#                per row, a long run)
#   bench_*      railyard_bench_ep_cuda with one rank (BF16 and FP8), JSON results
#   bench_memcheck, bench_synccheck   a small benchmark run under compute-sanitizer
#   metadata_nsys   the metadata kernel's time under nsys, where nsys is installed
#   calibrate    scripts/gpu-calibrate.sh --no-build --no-doc on this build: the
#                microkernels and the one-GPU end to end against the simulator's
#                preset, the table in OUT/calibrate/performance-model.md
#   profile_ncu  dispatch and combine at one SM under Nsight Compute; their SASS page
#                (OUT/ncu-sass.csv) for scripts/ncu_lines.py, and the details page
# One report file (text) says what ran, PASS / FAIL / TIMEOUT / SKIPPED with the
# reason, the time of each step and the GPU, driver and toolkit.
#
#   bash scripts/gpu-smoke.sh [--build-dir DIR] [--out DIR] [--jobs N] [--quick] [--only STEPS]
#                             [--e2e-calls N] [--e2e-long-calls N] [--step-timeout S] [--plan]
#                             [--gtest-src DIR]
#
# --gtest-src DIR builds GoogleTest from its sources in DIR (Debian's /usr/src/googletest,
# carried to a machine without network) into BUILD/_gtest first, for the gtest suites.
#
# --only build,e2e,... runs the steps whose names start with one of these (the others
# are reported as not selected; later steps use what an earlier run built), so a run
# can be split into commands of a few minutes each. --quick makes 10x fewer e2e calls.
# --plan detects and prints the steps with their commands, running none of them.
# Exit code: 0 when no step failed (skipped steps included, e.g. on a machine without
# a GPU), 1 when a step failed or timed out, 2 for a bad command line.
# RAILYARD_SMOKE_NVIDIA_SMI names the nvidia-smi to use (the tests pass a fake one).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-gpu"
out=""
jobs=$(nproc 2>/dev/null || echo 4)
quick=0
plan=0
only=""
step_timeout=540
e2e_calls=1000
e2e_long_calls=5000
gtest_src=""

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --plan) plan=1; shift ;;
    --only) only=$2; shift 2 ;;
    --step-timeout) step_timeout=$2; shift 2 ;;
    --e2e-calls) e2e_calls=$2; shift 2 ;;
    --e2e-long-calls) e2e_long_calls=$2; shift 2 ;;
    --gtest-src) gtest_src=$(realpath -m "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-smoke.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
build=$(realpath -m "$build")
if [[ $quick == 1 ]]; then e2e_calls=100; e2e_long_calls=500; fi
out=${out:-$build/gpu-smoke}
report="$out/report.txt"
logs="$out/logs"
mkdir -p "$logs"
: >"$report"
failed=0

say() { echo "gpu-smoke.sh: $*"; }
report_line() { echo "$*" >>"$report"; say "$*"; }

# record NAME STATUS SECONDS DETAIL: one result line in the report.
record() {
  local name=$1 status=$2 seconds=$3 detail=$4
  report_line "STEP $name: $status (${seconds} s) $detail"
  if [[ $status == FAIL || $status == TIMEOUT ]]; then failed=1; fi
}
# skip NAME REASON (a step not selected by --only says so instead).
skip() {
  if selected "$1"; then record "$1" SKIPPED 0 "$2"; else record "$1" SKIPPED 0 "not selected (--only $only)"; fi
}

# selected NAME: whether --only (if given) names a prefix of NAME.
selected() {
  [[ -z $only ]] && return 0
  local prefix
  for prefix in ${only//,/ }; do [[ $1 == "$prefix"* ]] && return 0; done
  return 1
}

# run_step NAME DETAIL CMD...: runs CMD under the step timeout, its output in
# logs/NAME.log; exit 77 counts as skipped (the program said why in its log).
run_step() {
  local name=$1 detail=$2; shift 2
  local log="$logs/$name.log" start status rc=0
  if ! selected "$name"; then
    skip "$name" "not selected (--only $only)"
    return 0
  fi
  if [[ $plan == 1 ]]; then
    report_line "PLAN $name: $*"
    return 0
  fi
  say "running $name: $*"
  start=$(date +%s)
  timeout --kill-after=30 "$step_timeout" "$@" >"$log" 2>&1 || rc=$?
  case $rc in
    0) status=PASS ;;
    77) status=SKIPPED; detail="$detail; $(grep -m1 -i skip "$log" || echo 'the program skipped')" ;;
    124|137) status=TIMEOUT; detail="$detail; killed after ${step_timeout} s" ;;
    *) status=FAIL; detail="$detail; exit $rc" ;;
  esac
  record "$name" "$status" "$(($(date +%s) - start))" "$detail (log: $log)"
  if [[ $status != PASS ]]; then
    { echo "----- last 40 lines of $log"; tail -n 40 "$log"; echo "-----"; } >>"$report"
  fi
  return 0
}

# ---- the GPU --------------------------------------------------------------------------
nvidia_smi=${RAILYARD_SMOKE_NVIDIA_SMI:-$(command -v nvidia-smi || true)}
gpu_reason=""
arch=""
detect_gpu() {
  if [[ -z $nvidia_smi || ! -x $nvidia_smi ]]; then
    gpu_reason="no nvidia-smi (no NVIDIA driver on this machine), so no GPU to run on"
    return
  fi
  local line
  if ! line=$("$nvidia_smi" --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1 | head -n 1) ||
     [[ -z $line || $line != *,*,* ]]; then
    gpu_reason="nvidia-smi found no usable GPU: ${line:-no output}"
    return
  fi
  local name driver cap
  IFS=, read -r name driver cap <<<"$line"
  name=$(echo "$name" | xargs); driver=$(echo "$driver" | xargs); cap=$(echo "$cap" | xargs)
  report_line "GPU 0: $name; driver $driver; compute capability $cap"
  if [[ ! $cap =~ ^([0-9]+)\.([0-9]+)$ ]]; then
    gpu_reason="unreadable compute capability '$cap'"
  elif ((BASH_REMATCH[1] < 9)); then
    gpu_reason="compute capability $cap: Railyard's kernels need sm_90 or newer (TMA, mbarrier)"
  else
    arch="${BASH_REMATCH[1]}${BASH_REMATCH[2]}a"
    report_line "CUDA architecture: $arch"
  fi
}

# Fabric / IMEX lines and the topology matrix, for the record (gpu-review.md, finding 8).
gpu_details() {
  [[ $plan == 1 || -n $gpu_reason ]] && return 0
  {
    echo "----- nvidia-smi -q | grep -iE 'fabric|imex'"
    "$nvidia_smi" -q 2>&1 | grep -iE 'fabric|imex' || echo "(no fabric or IMEX lines)"
    echo "----- nvidia-smi topo -m"
    "$nvidia_smi" topo -m 2>&1 || true
    echo "-----"
  } >>"$report"
}

# ---- the build ------------------------------------------------------------------------
nvcc=""
build_reason=""
find_toolchain() {
  nvcc=$(command -v nvcc || true)
  [[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
  if [[ -n $gpu_reason ]]; then build_reason="$gpu_reason"
  elif [[ -z $nvcc ]]; then build_reason="no nvcc (CUDA toolkit) on PATH or in /usr/local/cuda/bin"
  elif ! command -v cmake >/dev/null; then build_reason="no cmake"
  elif ! command -v ninja >/dev/null; then build_reason="no ninja"
  fi
  if [[ -n $nvcc ]]; then report_line "CUDA toolkit: $("$nvcc" --version | grep -m1 -o 'release [0-9.]*') ($nvcc)"; fi
  return 0
}

build_cuda_flavour() {
  if [[ -n $build_reason ]]; then skip build "$build_reason"; return; fi
  # -k 0: every target that can be built is (a missing GoogleTest only removes its suites).
  # -lineinfo: line tables for the profile step; it changes no instruction.
  local configure="cmake -S '$root' -B '$build' -G Ninja -DCMAKE_CUDA_COMPILER='$nvcc' -DRAILYARD_BUILD_CUDA=ON"
  configure+=" -DRAILYARD_BUILD_SIM=OFF -DRAILYARD_BUILD_PYTHON=OFF -DCMAKE_CUDA_ARCHITECTURES=$arch"
  configure+=" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_FLAGS=-lineinfo"
  local gtest=""
  if [[ -n $gtest_src ]]; then
    gtest="cmake -S '$gtest_src' -B '$build/_gtest/build' -G Ninja -DCMAKE_INSTALL_PREFIX='$build/_gtest' >/dev/null"
    gtest+=" && ninja -C '$build/_gtest/build' -j$jobs install >/dev/null && "
    configure+=" -DCMAKE_PREFIX_PATH='$build/_gtest'"
  fi
  run_step build "the CUDA flavour for $arch into $build" bash -c "$gtest$configure && ninja -C '$build' -j$jobs -k 0"
  # A failed build may still have produced the programs the next steps need.
  if [[ $plan == 0 ]]; then grep -E '^CMake Warning' -A3 "$logs/build.log" >>"$report" 2>/dev/null || true; fi
}

# ---- tests ----------------------------------------------------------------------------
# The gpu-labelled test binaries ctest knows (one per line).
gpu_test_binaries() {
  if command -v python3 >/dev/null && [[ -f $build/CTestTestfile.cmake ]]; then
    ctest --test-dir "$build" -L '^gpu$' --show-only=json-v1 2>/dev/null | python3 -c '
import json, sys
seen = []
for t in json.load(sys.stdin).get("tests", []):
    cmd = t.get("command") or []
    if cmd and cmd[0] not in seen:
        seen.append(cmd[0])
print("\n".join(seen))'
  else
    find "$build/tests" -type f -perm -u+x -name '*gpu_test*' 2>/dev/null || true
  fi
}

run_gpu_tests() {
  if [[ -n $build_reason ]]; then skip ctest_gpu "$build_reason"; return; fi
  local count=0
  if [[ $plan == 0 ]] && selected ctest_gpu; then
    count=$(ctest --test-dir "$build" -N -L '^gpu$' 2>/dev/null | sed -n 's/^Total Tests: //p')
    if [[ ${count:-0} == 0 ]]; then
      if grep -q 'GoogleTest not found' "$logs/build.log" 2>/dev/null; then
        skip ctest_gpu "GoogleTest was not found, and the gpu tests are GoogleTest suites"
      else
        skip ctest_gpu "no gpu-labelled tests were built (see the build step)"
      fi
      return
    fi
  fi
  run_step ctest_gpu "ctest -L gpu (${count} tests)" \
    ctest --test-dir "$build" -L '^gpu$' --output-on-failure --no-tests=error --timeout 300
}

sanitizer=""
find_sanitizer() {
  sanitizer=$(command -v compute-sanitizer || true)
  local candidate
  for candidate in ${nvcc:+"$(dirname "$nvcc")/compute-sanitizer" "$(dirname "$nvcc")/../compute-sanitizer/compute-sanitizer"}; do
    if [[ -z $sanitizer && -x $candidate ]]; then sanitizer=$candidate; fi
  done
  return 0
}

run_sanitized_tests() {
  local tool binaries
  for tool in memcheck synccheck racecheck; do
    if [[ -n $build_reason ]]; then skip "sanitize_$tool" "$build_reason"; continue; fi
    if [[ -z $sanitizer ]]; then skip "sanitize_$tool" "no compute-sanitizer in the CUDA toolkit"; continue; fi
    binaries=$(gpu_test_binaries)
    if [[ $plan == 1 ]]; then binaries=${binaries:-$build/tests/gpu/railyard_gpu_tests}; fi
    if [[ -z $binaries ]]; then skip "sanitize_$tool" "no gpu-labelled test binaries were built"; continue; fi
    local cmd="" b
    for b in $binaries; do cmd+="'$sanitizer' --tool $tool --error-exitcode 1 '$b' && "; done
    run_step "sanitize_$tool" "compute-sanitizer --tool $tool on $(echo $binaries | wc -w) gpu test binaries" \
      bash -c "${cmd}true"
  done
}

# R processes on GPU 0 (multi_process_e2e_cuda), three group sizes; the larger groups
# make fewer calls (each call is a handshake of R time-sliced contexts).
run_e2e() {
  local bin="$build/tests/gpu/multi_process_e2e_cuda" ranks calls long
  for ranks in 2 4 8; do
    calls=$((e2e_calls * 2 / ranks)); long=$((e2e_long_calls * 2 / ranks))
    if [[ -n $build_reason ]]; then skip "e2e_r$ranks" "$build_reason"; continue; fi
    if [[ $plan == 0 && ! -x $bin ]]; then skip "e2e_r$ranks" "multi_process_e2e_cuda was not built (see the build step)"; continue; fi
    run_step "e2e_r$ranks" "$ranks processes on GPU 0, $calls calls per case, $long in the long run" \
      "$bin" --ranks "$ranks" --calls "$calls" --long-calls "$long" --timeout-s "$step_timeout"
  done
}

# ---- the benchmark --------------------------------------------------------------------
bench_bin="$build/benchmarks/railyard_bench_ep_cuda"
bench_args=(--ranks 1 --experts-per-rank 16 --topk 8 --tokens 4096 --hidden 7168)

# A benchmark step passes only if the benchmark says its figures were MEASURED (with
# too few GPUs it would fall back to the simulator flavour, which this build lacks).
run_bench() {
  local dtype
  for dtype in bf16 fp8; do
    if [[ -n $build_reason ]]; then skip "bench_${dtype}_r1" "$build_reason"; continue; fi
    if [[ $plan == 0 && ! -x $bench_bin ]]; then skip "bench_${dtype}_r1" "railyard_bench_ep_cuda was not built"; continue; fi
    run_step "bench_${dtype}_r1" "railyard_bench_ep_cuda, one rank, $dtype, JSON in $out/bench_${dtype}_r1.json" \
      bash -c "'$bench_bin' ${bench_args[*]} --dtype $dtype --layout both --sms-sweep 1,2,4,8,16,32 --iters 20 \
--json '$out/bench_${dtype}_r1.json' | tee '$out/bench_${dtype}_r1.txt'; rc=\${PIPESTATUS[0]}; \
[[ \$rc == 0 ]] && grep -q 'MEASURED on' '$out/bench_${dtype}_r1.txt'"
  done
  local tool
  for tool in memcheck synccheck; do
    if [[ -n $build_reason ]]; then skip "bench_$tool" "$build_reason"; continue; fi
    if [[ -z $sanitizer ]]; then skip "bench_$tool" "no compute-sanitizer in the CUDA toolkit"; continue; fi
    run_step "bench_$tool" "a small one-rank benchmark under compute-sanitizer --tool $tool" \
      "$sanitizer" --tool "$tool" --error-exitcode 1 "$bench_bin" "${bench_args[@]}" --tokens 256 --iters 1 \
      --warmup 0 --sms 2
  done
  local nsys
  nsys=$(command -v nsys || true)
  if [[ -n $build_reason ]]; then skip metadata_nsys "$build_reason"
  elif [[ -z $nsys ]]; then skip metadata_nsys "no nsys (Nsight Systems) installed"
  else
    run_step metadata_nsys "the metadata kernel's time, 256 experts, under nsys (report $out/metadata.nsys-rep)" \
      "$nsys" profile --stats=true --force-overwrite true -o "$out/metadata" "$bench_bin" --ranks 1 \
      --experts-per-rank 256 --topk 8 --tokens 4096 --hidden 7168 --sms 8 --iters 5
  fi
}

# ---- calibration and profile ----------------------------------------------------------
run_calibrate() {
  if [[ -n $build_reason ]]; then skip calibrate "$build_reason"; return; fi
  case $arch in
    90a|100a) ;;  # the simulator's presets (gpu-calibrate.sh: h100, b200)
    *) skip calibrate "the simulator has no preset for $arch (h100: 90a, b200: 100a)"; return ;;
  esac
  run_step calibrate "scripts/gpu-calibrate.sh on this build; its table in $out/calibrate/performance-model.md" \
    env RAILYARD_CALIBRATE_NVIDIA_SMI="$nvidia_smi" bash "$root/scripts/gpu-calibrate.sh" --build-dir "$build" \
    --no-build --no-doc --out "$out/calibrate"
}

run_profile() {
  local ncu
  ncu=$(command -v ncu || true)
  if [[ -n $build_reason ]]; then skip profile_ncu "$build_reason"; return; fi
  if [[ -z $ncu && $plan == 0 ]]; then skip profile_ncu "no ncu (Nsight Compute) installed"; return; fi
  run_step profile_ncu "dispatch and combine at one SM under ncu; $out/ncu-sass.csv for scripts/ncu_lines.py" \
    bash -c "'${ncu:-ncu}' --set full --import-source yes --kernel-name-base demangled -k 'regex:Dispatch|Combine' \
--launch-count 3 -f -o '$out/prof' '$bench_bin' ${bench_args[*]} --tokens 256 --sms 1 --iters 1 --warmup 0 \
--layout received --host-overhead-iters 0 && '${ncu:-ncu}' -i '$out/prof.ncu-rep' --page source --csv --print-source sass \
>'$out/ncu-sass.csv' && '${ncu:-ncu}' -i '$out/prof.ncu-rep' --page details >'$out/ncu-details.txt'"
}

# ---- the run --------------------------------------------------------------------------
report_line "Railyard GPU smoke run, $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
report_line "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown); build: $build; logs: $logs"
detect_gpu
gpu_details
find_toolchain
find_sanitizer
if [[ -n $gpu_reason ]]; then report_line "No GPU: $gpu_reason"; fi
build_cuda_flavour
run_gpu_tests
run_sanitized_tests
run_e2e
run_bench
run_calibrate
run_profile

passed=$(grep -c ': PASS (' "$report" || true)
failures=$(grep -cE ': (FAIL|TIMEOUT) \(' "$report" || true)
skipped=$(grep -c ': SKIPPED (' "$report" || true)
if [[ $plan == 1 ]]; then
  report_line "RESULT: PLAN only, nothing ran ($skipped steps would be skipped)"
elif [[ $failed == 0 && $passed == 0 ]]; then
  report_line "RESULT: SKIPPED: nothing could run here ($skipped steps skipped, reasons above)"
else
  report_line "RESULT: $([[ $failed == 0 ]] && echo PASS || echo FAIL): $passed passed, $failures failed, $skipped skipped"
fi
say "report: $report"
exit "$failed"
