#!/usr/bin/env bash
# Builds the simulator flavour and its tests with AddressSanitizer and
# UndefinedBehaviorSanitizer (-DRAILYARD_SANITIZE=address,undefined, in build-sanitize/)
# and runs the `sim` and `host` tests under them (not `sim_large`). A finding fails the
# test that made it; each phase's time is printed at the end. Not part of scripts/test.sh
# or CI: from cold it takes about 35 minutes on a 2-core machine (docs/simulator.md,
# "Sanitizers": what it covers, measured times, what it found).
#
#   bash scripts/sanitize.sh
#   RAILYARD_SANITIZE=address bash scripts/sanitize.sh          # another -fsanitize= list
#   RAILYARD_BUILD_DIR=dir RAILYARD_JOBS=4 bash scripts/sanitize.sh
#   CTEST_ARGS="-R sim_engine" bash scripts/sanitize.sh
# sim_large is left out: under the sanitizers the seed configuration runs past its
# 30-minute ctest timeout (11 GB). After a build, it runs without that limit as
#   build-sanitize/tests/kernels/intranode_e2e_test --gtest_filter='IntranodeEndToEndLarge.*'
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${RAILYARD_BUILD_DIR:-$root/build-sanitize}
jobs=${RAILYARD_JOBS:-2}
sanitizers=${RAILYARD_SANITIZE:-address,undefined}

timings=()
phase_start=0
phase() {
  phase_start=$(date +%s)
  echo
  echo "==== $1"
}
phase_done() { timings+=("$1 $(($(date +%s) - phase_start))s"); }

phase "configure ($build, -fsanitize=$sanitizers)"
# The Python extension is left out: loading an ASan-built module into an uninstrumented
# interpreter needs the runtime preloaded.
cmake -S "$root" -B "$build" -G Ninja \
  -DRAILYARD_BUILD_CUDA=OFF -DRAILYARD_BUILD_PYTHON=OFF -DRAILYARD_BUILD_TESTS=ON \
  -DRAILYARD_SANITIZE="$sanitizers" || { echo "sanitize.sh: configure failed"; exit 1; }
phase_done configure

phase "build (ninja -j$jobs)"
ninja -C "$build" -j"$jobs" -k 0 || { echo "sanitize.sh: build failed"; exit 1; }
phase_done build

phase "test (ctest -L 'sim|host|rdma' -LE sim_large)"
# detect_leaks: every test frees what it allocates. The simulator's engine thread and
# its condition variable are leaked on purpose at exit (Engine::get), which LSan does
# not count: they stay reachable from a static.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# shellcheck disable=SC2086
ctest --test-dir "$build" -j"$jobs" --output-on-failure --timeout 1800 -L 'sim|host|rdma' -LE sim_large ${CTEST_ARGS:-}
rc=$?
phase_done test

echo
echo "==== times"
printf '  %s\n' "${timings[@]}"
exit $rc
