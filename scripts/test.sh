#!/usr/bin/env bash
# Sets up the machine, builds both flavours in build/ and runs every test (labels sim,
# host, gpu, rdma, python; gpu tests skip without a device; not the labels `slow` (the
# seed configurations, the weak-mode seed sweeps after the first, the largest groups of
# the across-domain matrix: `ctest --test-dir build -L slow -j2`) and `mutation`
# (`ctest --test-dir build -L mutation`)), then reports the line coverage that the
# simulator tests give the device code (kernels/, include/railyard/{arch,pipeline,layout,transport,common}).
#
#   bash scripts/test.sh            # everything
#   RAILYARD_BUILD_DIR=dir bash scripts/test.sh
#   CTEST_ARGS="-L sim" bash scripts/test.sh
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${RAILYARD_BUILD_DIR:-$root/build}
jobs=${RAILYARD_JOBS:-2}

phase_start=0
phase() {
  phase_start=$(date +%s)
  echo
  echo "==== $1"
}
phase_done() {
  local secs=$(($(date +%s) - phase_start))
  timings+=("$1 ${secs}s")
}
timings=()

phase "setup"
bash "$root/scripts/setup.sh" || { echo "test.sh: setup failed"; exit 1; }
phase_done setup

phase "configure ($build)"
cmake -S "$root" -B "$build" -G Ninja \
  -DPython3_EXECUTABLE="${RAILYARD_VENV:-$HOME/.cache/railyard/venv}/bin/python" \
  -DRAILYARD_BUILD_CUDA="${RAILYARD_BUILD_CUDA:-AUTO}" \
  -DRAILYARD_COVERAGE=ON \
  -DRAILYARD_BUILD_TESTS=ON || { echo "test.sh: configure failed"; exit 1; }
phase_done configure

phase "build (ninja -j$jobs)"
# -k 0: one run shows every broken target, not just the first.
ninja -C "$build" -j"$jobs" -k 0 || { echo "test.sh: build failed"; exit 1; }
phase_done build
if [[ -f $build/ptxas/summary.txt ]]; then
  echo "ptxas resource reports: $build/ptxas/summary.txt"
fi

phase "test (ctest, all labels but slow and mutation)"
# Coverage counters start from zero for this run.
find "$build" -name '*.gcda' -delete
ctest_log=$build/ctest.log
# shellcheck disable=SC2086
ctest --test-dir "$build" -j"$jobs" --output-on-failure --timeout 900 -LE 'slow|mutation' ${CTEST_ARGS:-} 2>&1 |
  tee "$ctest_log"
ctest_rc=${PIPESTATUS[0]}
phase_done test

passed=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' "$ctest_log")
skipped=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*(Skipped|Not Run)' "$ctest_log")
total=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$ctest_log")
failed=$((total - passed - skipped))
if ((ctest_rc != 0 && failed == 0)); then
  failed=1  # ctest failed without a failing test line
fi
if ((total == 0)); then
  echo "test.sh: ctest ran no test"
  ctest_rc=1
fi

phase "coverage (gcovr, simulator flavour)"
coverage_dir=$build/coverage
mkdir -p "$coverage_dir"
coverage_ok=1
if grep -q 'RAILYARD_COVERAGE:BOOL=ON' "$build/CMakeCache.txt" && command -v gcovr >/dev/null; then
  # Bounded: a gcovr that meets a bad record must not stall CI.
  timeout 900 gcovr --root "$root" --object-directory "$build" -j "$jobs" --gcov-ignore-parse-errors \
    --filter "$root/kernels/" \
    --filter "$root/include/railyard/arch/" \
    --filter "$root/include/railyard/pipeline/" \
    --filter "$root/include/railyard/layout/" \
    --filter "$root/include/railyard/transport/" \
    --filter "$root/include/railyard/common/" \
    --txt "$coverage_dir/summary.txt" \
    --html-details "$coverage_dir/index.html" \
    --print-summary >"$coverage_dir/gcovr.log" 2>&1 || coverage_ok=0
  if ((coverage_ok)); then
    cat "$coverage_dir/summary.txt"
    grep -E '^(lines|functions):' "$coverage_dir/gcovr.log" || true
    echo "coverage report: $coverage_dir/index.html"
  else
    echo "test.sh: WARNING: gcovr failed, see $coverage_dir/gcovr.log"
    tail -20 "$coverage_dir/gcovr.log"
  fi
else
  echo "coverage: not instrumented (RAILYARD_COVERAGE=OFF) or gcovr missing; skipped"
fi
phase_done coverage

echo
echo "==== summary"
echo "timings: ${timings[*]}"
echo "tests: $passed passed, $failed failed, $skipped skipped"
if ((ctest_rc != 0)); then
  echo "test.sh: FAILED (ctest exit $ctest_rc)"
  exit 1
fi
echo "test.sh: OK"
