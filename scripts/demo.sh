#!/usr/bin/env bash
# Railyard's main job: builds and runs the bandwidth benchmark railyard_bench_ep
# (benchmarks/bench_ep.cpp, docs/benchmarks.md) in its simulator flavour: the seed
# configuration's dispatch, combine and their expert-grouped (permute) variants through
# the public API (railyard::Buffer) on eight simulated GPUs in one NVLink domain, every
# output checked against railyard::reference, every link's bytes against the minimum,
# every operation again in the simulator's timed mode at 1 and 8 SMs (SIMULATED
# times and bandwidths from a cost model of the H100, docs/simulator.md "Timed mode"),
# and a MODEL (roofline) estimate of H100 and B200 from those bytes, an upper bound
# (docs/performance-model.md). The simulator runs 128 tokens per rank by default; the
# model's headline is for the configuration's 4096. No GPU is needed or used, and
# nothing it prints is a GPU measurement. Options after the script's name come after
# its default sweep, so --sms-sweep or --sms replaces it.
#
#   bash scripts/demo.sh [benchmark options, e.g. --preset deepep --json out.json --sim-tokens 64]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${RAILYARD_BUILD_DIR:-$root/build}

bash "$root/scripts/setup.sh"
# The same build directory as scripts/test.sh; options already in its cache are kept.
mkdir -p "$build"
echo "demo.sh: configuring $build (log: $build/configure.log)"
cmake -S "$root" -B "$build" -G Ninja >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; echo "demo.sh: configure failed"; exit 1; }
ninja -C "$build" -j"${RAILYARD_JOBS:-2}" railyard_bench_ep
echo
# In a coverage build (scripts/test.sh), the benchmark's gcov counters go aside so they
# neither mix with the tests' coverage nor clash with stale counters.
GCOV_PREFIX="$build/demo-gcov" "$build/benchmarks/railyard_bench_ep" --sms-sweep 1,8,32 "$@"
