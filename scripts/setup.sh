#!/usr/bin/env bash
# Installs what Railyard's build and tests need on a Debian 12 machine. Idempotent:
# when everything is present it installs nothing and takes a second.
#
# nvcc is not installed here: machines of this kind have the CUDA toolkit at
# /usr/local/cuda. Without it CMake disables the CUDA flavour (RAILYARD_BUILD_CUDA=AUTO)
# and the simulator flavour still builds and tests everything it can.
set -euo pipefail

# Debian packages: build tools, the simulator's fibers (Boost.Context), tests
# (GoogleTest), compiler cache, coverage (gcovr), the RDMA transport's headers
# (rdma-core), python3 for the build's check scripts, c++filt (binutils).
packages=(
  cmake ninja-build g++ binutils make
  libboost-context-dev
  libgtest-dev googletest
  ccache gcovr
  libibverbs-dev ibverbs-providers
  python3 python3-pip
)

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  sudo_cmd=(sudo)
fi

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
# python3 may come from elsewhere (pyenv) than Debian: accept any python3 on PATH
# that runs, with pip.
if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
  filtered=()
  for pkg in "${missing[@]}"; do
    [[ $pkg == python3 || $pkg == python3-pip ]] || filtered+=("$pkg")
  done
  missing=("${filtered[@]}")
fi

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
else
  echo "setup: Debian packages present"
fi

# cuobjdump, for the test that reads the PTX nvcc embedded: not every toolkit install
# ships it, PyPI's nvidia-cuda-cuobjdump does. Only useful with nvcc.
nvcc=$(command -v nvcc || true)
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
if [[ -n $nvcc ]]; then
  have_cuobjdump=0
  if [[ -x "$(dirname "$nvcc")/cuobjdump" ]] || command -v cuobjdump >/dev/null; then
    have_cuobjdump=1
  elif python3 - <<'EOF' 2>/dev/null
import nvidia, os, sys
sys.exit(0 if any(os.path.exists(os.path.join(p, "cu13", "bin", "cuobjdump"))
                  for p in nvidia.__path__) else 1)
EOF
  then
    have_cuobjdump=1
  fi
  if ((have_cuobjdump)); then
    echo "setup: cuobjdump present"
  else
    echo "setup: installing cuobjdump (PyPI nvidia-cuda-cuobjdump)"
    pip_flags=(--quiet --disable-pip-version-check)
    export PIP_ROOT_USER_ACTION=ignore
    # Debian's own python3 refuses system-wide pip installs without this flag.
    if python3 -m pip install --help 2>/dev/null | grep -q -- --break-system-packages; then
      pip_flags+=(--break-system-packages)
    fi
    python3 -m pip install "${pip_flags[@]}" 'nvidia-cuda-cuobjdump>=13.2,<14' </dev/null ||
      echo "setup: WARNING: could not install cuobjdump; the PTX content test will be skipped"
  fi
  echo "setup: nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') at $nvcc"
else
  echo "setup: no nvcc: the CUDA flavour will be disabled (simulator flavour only)"
fi

# The Linux kernel's include/linux/mlx5/mlx5_ifc.h: the independent reference that the
# mlx5 firmware command layouts (src/runtime/mlx5_prm.hpp) are tested against. Debian
# ships it only inside linux-headers-<version>-common, which is downloaded and unpacked
# (two headers, nothing installed) into RAILYARD_MLX5_IFC (CMake looks there). The 6.12
# series is preferred: the test names the reserved bits of that layout.
ifc=${RAILYARD_MLX5_IFC:-$HOME/.cache/railyard/mlx5-ifc}
if [[ -f $ifc/include/linux/mlx5/mlx5_ifc.h ]]; then
  echo "setup: mlx5_ifc.h present ($ifc)"
else
  newest_headers() {
    apt-cache search --names-only '^linux-headers-[0-9.]+.*-common$' 2>/dev/null | awk '{print $1}' |
      sort -V | { grep '^linux-headers-6\.12\.' || true; } | tail -1
  }
  pkg=$(newest_headers)
  if [[ -z $pkg ]]; then
    "${sudo_cmd[@]}" apt-get update -q >/dev/null
    pkg=$(newest_headers)
  fi
  [[ -n $pkg ]] || { echo "setup: no linux-headers-6.12.*-common package in apt's lists (for mlx5_ifc.h)"; exit 1; }
  echo "setup: unpacking mlx5_ifc.h from $pkg into $ifc"
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>&1 &&
    dpkg-deb --fsys-tarfile ./*.deb | tar -x --wildcards '*/include/linux/mlx5/mlx5_ifc*.h') ||
    { rm -rf "$tmp"; echo "setup: could not download or unpack $pkg"; exit 1; }
  mkdir -p "$ifc/include/linux/mlx5"
  cp "$tmp"/usr/src/*/include/linux/mlx5/mlx5_ifc*.h "$ifc/include/linux/mlx5/"
  echo "$pkg" >"$ifc/PACKAGE"
  rm -rf "$tmp"
fi

# Python: a virtual environment with PyTorch and what the Python package, its tests and
# the benchmarks use, kept outside the clone (RAILYARD_VENV) so that it is made once
# per machine. PyPI's torch wheel carries its CUDA libraries (about 3 GB); without a GPU
# only its CPU side runs (the simulator flavour). scripts/test.sh and demo.sh pass its
# interpreter to CMake.
venv=${RAILYARD_VENV:-$HOME/.cache/railyard/venv}
# nvidia-cuda-cuobjdump: CMake looks for cuobjdump under this interpreter's nvidia/cu13/bin.
python_packages=(torch numpy pytest pybind11 scikit-build-core megatron-core matplotlib 'nvidia-cuda-cuobjdump>=13.2,<14')
python_modules="torch, numpy, pytest, pybind11, scikit_build_core, megatron.core, matplotlib"
have_venv_cuobjdump() {
  "$venv/bin/python" -c "import nvidia, os, sys; sys.exit(0 if any(os.path.exists(os.path.join(p, 'cu13', 'bin', 'cuobjdump')) for p in nvidia.__path__) else 1)"
}
if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c "import $python_modules" >/dev/null 2>&1 &&
  have_venv_cuobjdump >/dev/null 2>&1; then
  echo "setup: Python venv present ($venv)"
else
  echo "setup: making the Python venv $venv (${python_packages[*]})"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${python_packages[@]}" </dev/null
  "$venv/bin/python" -c "import $python_modules" ||
    { echo "setup: the Python venv $venv cannot import: $python_modules"; exit 1; }
fi

# A second venv for the newest megatron-core Railyard's Megatron drop-in is tested with
# (ctest python.megatron_latest): it needs Python >= 3.12. Made once per machine, like
# the first; pinned, so that a new release is a deliberate update.
megatron_latest=0.19.2
venv_latest=${RAILYARD_VENV_MEGATRON_LATEST:-$HOME/.cache/railyard/venv-megatron-latest}
latest_modules="torch, numpy, pytest, pybind11, megatron.core"
if [[ -x $venv_latest/bin/python ]] && "$venv_latest/bin/python" -c "import $latest_modules, sys;
import megatron.core as m; sys.exit(m.__version__ != '$megatron_latest')" >/dev/null 2>&1; then
  echo "setup: Python venv for megatron-core $megatron_latest present ($venv_latest)"
else
  python312=""
  for candidate in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3 python3.13; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c "import sys; sys.exit(sys.version_info < (3, 12))" 2>/dev/null; then
      python312=$(command -v "$candidate")
      break
    fi
  done
  if [[ -z $python312 ]]; then
    echo "setup: WARNING: no Python >= 3.12: the test python.megatron_latest will be skipped"
  else
    echo "setup: making the venv $venv_latest (Python $("$python312" -c 'import platform; print(platform.python_version())'), megatron-core $megatron_latest)"
    "$python312" -m venv "$venv_latest"
    "$venv_latest/bin/python" -m pip install --quiet --disable-pip-version-check torch numpy pytest pybind11 \
      "megatron-core==$megatron_latest" </dev/null
    "$venv_latest/bin/python" -c "import $latest_modules" ||
      { echo "setup: the venv $venv_latest cannot import: $latest_modules"; exit 1; }
  fi
fi
