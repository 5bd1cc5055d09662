#!/usr/bin/env bash
# Railyard's main job. Until the bandwidth benchmark exists: builds and runs the
# simulator demo (benchmarks/sim_demo.cpp), dispatch then combine through the public
# API (railyard::Buffer) on eight simulated GPUs in one NVLink domain, checked against
# closed forms, with the NVLink bytes against the minimum. Runs on the CPU simulator:
# no GPU is needed or used, and no time it prints is a GPU figure.
#
#   bash scripts/demo.sh [demo options, e.g. --tokens 512 --layout grouped --seed 3]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${RAILYARD_BUILD_DIR:-$root/build}

bash "$root/scripts/setup.sh"
# The same build directory as scripts/test.sh; options already in its cache are kept.
mkdir -p "$build"
echo "demo.sh: configuring $build (log: $build/configure.log)"
cmake -S "$root" -B "$build" -G Ninja >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; echo "demo.sh: configure failed"; exit 1; }
ninja -C "$build" -j"${RAILYARD_JOBS:-2}" railyard_sim_demo
echo
# In a coverage build (scripts/test.sh), the demo's gcov counters go aside so they
# neither mix with the tests' coverage nor clash with stale counters.
GCOV_PREFIX="$build/demo-gcov" "$build/benchmarks/railyard_sim_demo" "$@"
