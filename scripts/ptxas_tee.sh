#!/usr/bin/env bash
# Compiler launcher for nvcc that keeps ptxas's resource report (-Xptxas -v) of one
# translation unit in <report_dir>/<tu>.txt, then passes the compiler's stderr on.
#
#   ptxas_tee.sh <report_dir> <compiler command ...>
#
# Why a launcher and not cuobjdump --dump-resource-usage on the object: only ptxas -v
# reports spill stores and spill loads (cuobjdump shows LOCAL bytes, which mixes
# spills with local arrays), and cuobjdump is not part of every toolkit install.
# Why it still works with ccache: this script runs in front of ccache
# (ptxas_tee.sh dir ccache nvcc ...), and ccache stores a compilation's stderr and
# replays it on a cache hit, so the report is the same whether the object was
# compiled or served from the cache.
set -u
report_dir=$1
shift

object=""
prev=""
for arg in "$@"; do
  [[ $prev == "-o" ]] && object=$arg
  prev=$arg
done

stderr_file=$(mktemp)
"$@" 2>"$stderr_file"
rc=$?
# ptxas's info lines go to the report (and the build's summary.txt), not the build
# log; warnings and errors pass on unchanged.
grep -vE '^ptxas info|^ +[0-9]+ bytes stack frame' "$stderr_file" >&2

if [[ $rc -eq 0 && -n $object ]]; then
  # CMake names objects <source>.o, e.g. row_gather.cu.o -> row_gather
  tu=$(basename "$object")
  tu=${tu%.o}
  tu=${tu%.*}
  mkdir -p "$report_dir"
  {
    echo "# ptxas -v report for ${tu} (object ${object})"
    grep -E '^ptxas|^ +[0-9]+ bytes stack frame' "$stderr_file"
  } >"$report_dir/$tu.txt.tmp" && mv "$report_dir/$tu.txt.tmp" "$report_dir/$tu.txt"
fi
rm -f "$stderr_file"
exit $rc
