#!/usr/bin/env bash
# Railyard's calibration run: the timed simulator's cost model against the GPU of this
# machine (docs/performance-model.md, "Calibration against a GPU"). Needs the CUDA
# toolkit, CMake, Ninja and python3; never the network.
#   1. nvidia-smi: GPU 0's name and compute capability -> the preset (9.0: h100,
#      10.0: b200) and the CUDA architecture (90a, 100a)
#   2. build, Release, for that architecture only: railyard_calibrate_cuda and
#      railyard_bench_ep_cuda; with Boost.Context also the simulator flavours
#   3. railyard_calibrate_cuda: the microkernels of benchmarks/calibrate/microkernels.cuh
#      on GPU 0 (and GPU 1 for the NVLink figures, where it is a peer)
#   4. railyard_bench_ep_cuda with one rank (calibration.py e2e-args): a single-GPU
#      end-to-end run of dispatch and combine
#   5. the SIMULATED side: the simulator flavours run now where they were built, else
#      docs/calibration/simulated-<preset>.json (which CI keeps current)
#   6. calibration.py report: measured / simulated per figure, written into
#      docs/performance-model.md between its gpu-calibrate markers (--no-doc: only
#      into OUT/performance-model.md)
#
#   bash scripts/gpu-calibrate.sh [--build-dir DIR] [--out DIR] [--jobs N] [--no-doc] [--no-build]
#
# --no-build skips step 2 and uses the CUDA flavour already built in DIR (any build type;
# scripts/gpu-smoke.sh's calibrate step runs it so on its own build).
#
# Every result file lands in OUT (default BUILD/gpu-calibrate): measured.json,
# bench-measured.json, simulated.json, and the logs. Exit code: 0 done, 1 a step
# failed, 2 a bad command line or a GPU without a preset, 3 no usable GPU.
# RAILYARD_CALIBRATE_NVIDIA_SMI names the nvidia-smi to use (the tests pass a fake one).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-calibrate"
out=""
jobs=$(nproc 2>/dev/null || echo 4)
write_doc=1
do_build=1

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --no-doc) write_doc=0; shift ;;
    --no-build) do_build=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-calibrate.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
build=$(realpath -m "$build")
out=$(realpath -m "${out:-$build/gpu-calibrate}")
mkdir -p "$out"
say() { echo "gpu-calibrate.sh: $*"; }
fail() { say "FAILED: $*"; exit 1; }

# ---- 1. the GPU ------------------------------------------------------------------------
nvidia_smi=${RAILYARD_CALIBRATE_NVIDIA_SMI:-$(command -v nvidia-smi || true)}
if [[ -z $nvidia_smi || ! -x $nvidia_smi ]]; then
  say "no GPU found: no nvidia-smi (no NVIDIA driver on this machine); nothing to calibrate against"
  exit 3
fi
if ! line=$("$nvidia_smi" --query-gpu=name,compute_cap --format=csv,noheader 2>&1 | head -n 1) ||
   [[ -z $line || $line != *,* ]]; then
  say "no GPU found: nvidia-smi says: ${line:-nothing}"
  exit 3
fi
IFS=, read -r gpu_name cap <<<"$line"
gpu_name=$(echo "$gpu_name" | xargs); cap=$(echo "$cap" | xargs)
case $cap in
  9.0) preset=h100; arch=90a ;;
  10.0) preset=b200; arch=100a ;;
  *) say "GPU 0 is $gpu_name, compute capability '$cap': the simulator has presets for 9.0 (h100) and 10.0 (b200) only"
     exit 2 ;;
esac
say "GPU 0: $gpu_name, compute capability $cap -> preset $preset, architecture $arch"

# ---- 2. the build ----------------------------------------------------------------------
bin="$build/benchmarks"
built_by="bash scripts/gpu-calibrate.sh"
if [[ $do_build == 0 ]]; then
  for t in railyard_calibrate_cuda railyard_bench_ep_cuda; do
    [[ -x $bin/$t ]] || fail "--no-build: $bin/$t does not exist (build the CUDA flavour in $build first)"
  done
  built_by+=" --no-build (the build in $build)"
else
nvcc=$(command -v nvcc || true)
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n $nvcc ]] || fail "no nvcc (CUDA toolkit) on PATH or in /usr/local/cuda/bin"
say "building into $build (log: $out/build.log)"
{
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DRAILYARD_BUILD_CUDA=ON -DRAILYARD_BUILD_TESTS=OFF -DRAILYARD_BUILD_PYTHON=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="$arch"
  targets=(railyard_calibrate_cuda railyard_bench_ep_cuda)
  # The simulator flavours exist where CMake found Boost.Context.
  for t in railyard_calibrate railyard_bench_ep; do
    if ninja -C "$build" -t targets all | grep -q "^$t:"; then targets+=("$t"); fi
  done
  ninja -C "$build" -j"$jobs" "${targets[@]}"
} >"$out/build.log" 2>&1 || fail "the build (tail of $out/build.log:)$(echo; tail -n 30 "$out/build.log")"
fi

# ---- 3. and 4. on the GPU --------------------------------------------------------------
say "microkernels on the GPU"
rc=0
"$bin/railyard_calibrate_cuda" --json "$out/measured.json" 2>&1 | tee "$out/calibrate.log" || rc=${PIPESTATUS[0]}
if [[ $rc == 3 ]]; then say "no usable GPU (see $out/calibrate.log)"; exit 3; fi
[[ $rc == 0 ]] || fail "railyard_calibrate_cuda exited $rc"
mapfile -t e2e_args < <(python3 "$root/scripts/calibration.py" e2e-args)
say "end to end on one GPU: railyard_bench_ep_cuda ${e2e_args[*]}"
"$bin/railyard_bench_ep_cuda" "${e2e_args[@]}" --json "$out/bench-measured.json" >"$out/bench.log" 2>&1 ||
  fail "railyard_bench_ep_cuda (tail of $out/bench.log:)$(echo; tail -n 30 "$out/bench.log")"

# ---- 5. the simulated side -------------------------------------------------------------
if [[ -x $bin/railyard_calibrate && -x $bin/railyard_bench_ep ]]; then
  say "the same in the timed simulator ($preset preset)"
  python3 "$root/scripts/calibration.py" simulated --gpu "$preset" --calibrate "$bin/railyard_calibrate" \
    --bench "$bin/railyard_bench_ep" --out "$out/simulated.json" || fail "the simulated run"
else
  say "no simulator in this build (no Boost.Context): using docs/calibration/simulated-$preset.json"
  cp "$root/docs/calibration/simulated-$preset.json" "$out/simulated.json"
fi

# ---- 6. the report ---------------------------------------------------------------------
doc="$root/docs/performance-model.md"
if [[ $write_doc == 0 ]]; then
  cp "$doc" "$out/performance-model.md"
  doc="$out/performance-model.md"
fi
python3 "$root/scripts/calibration.py" report --simulated "$out/simulated.json" --measured "$out/measured.json" \
  --measured-bench "$out/bench-measured.json" --doc "$doc" \
  --command "$built_by on $gpu_name, $(date -u +%Y-%m-%d)"
say "done: $doc; results in $out"
