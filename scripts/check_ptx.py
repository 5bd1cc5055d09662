#!/usr/bin/env python3
"""Check that the PTX embedded in CUDA objects contains an instruction, for every arch.

Usage: check_ptx.py --cuobjdump PATH --arch sm_90a [--arch sm_100a ...]
                    --expect cp.async.bulk OBJECT_OR_ARCHIVE...

Runs `cuobjdump -ptx` on each input, splits its output into one PTX module per
embedded arch, and requires that every --arch has at least one module and that the
modules of every --arch contain every --expect string. Exit status 0 on success,
1 on a failed check, 77 (ctest's SKIP_RETURN_CODE) when there is no cuobjdump.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

SKIP = 77


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuobjdump", default="")
    parser.add_argument("--arch", action="append", required=True)
    parser.add_argument("--expect", action="append", required=True)
    parser.add_argument("inputs", nargs="+")
    args = parser.parse_args()

    if not args.cuobjdump or not os.path.exists(args.cuobjdump):
        print("SKIP: cuobjdump not found (scripts/setup.sh installs it from PyPI's "
              "nvidia-cuda-cuobjdump); reconfigure with -DRAILYARD_CUOBJDUMP=/path/to/cuobjdump")
        return SKIP

    ptx_by_arch: dict[str, list[str]] = {}
    for path in args.inputs:
        run = subprocess.run([args.cuobjdump, "-ptx", path], capture_output=True, text=True,
                             check=False)
        if run.returncode != 0:
            print(f"FAIL: cuobjdump -ptx {path} exited {run.returncode}: {run.stderr.strip()}")
            return 1
        for module in run.stdout.split("Fatbin ptx code:")[1:]:
            m = re.search(r"^arch = (\S+)", module, re.MULTILINE)
            if m:
                ptx_by_arch.setdefault(m.group(1), []).append(module)

    failed = False
    for arch in args.arch:
        modules = ptx_by_arch.get(arch, [])
        if not modules:
            print(f"FAIL: no PTX for {arch} in {' '.join(args.inputs)} "
                  f"(found: {' '.join(sorted(ptx_by_arch)) or 'none'})")
            failed = True
            continue
        text = "\n".join(modules)
        for needle in args.expect:
            count = text.count(needle)
            status = "ok  " if count else "FAIL"
            print(f"{status}: {arch}: {count} occurrence(s) of '{needle}' in "
                  f"{len(modules)} PTX module(s)")
            failed |= count == 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
