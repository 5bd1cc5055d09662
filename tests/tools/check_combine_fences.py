#!/usr/bin/env python3
"""Check that combine's PTX keeps every async-proxy fence the protocol needs.

Usage: check_combine_fences.py --cuobjdump PATH --arch sm_90a [--arch ...] combine.cu.o

Combine (kernels/intranode/combine.cuh) has, per arch:
  fence.proxy.async.shared::cta  2: the reducers after reading a load slot (before the
                                    TMA refill) and before the TMA store of a store slot;
  fence.proxy.async.global       2: after the entry barrier, and the gather's lane 0
                                    after the warp barrier that passes it the acquired
                                    headers, before its TMA loads of the rows. (The store
                                    lane releases a row after bulk_wait_group, whose
                                    completion implies the fence.)
The simulator reports a missing .shared::cta fence (a ProxyRace, docs/simulator.md
"Async-proxy separation") and, in its weak-memory mode, a missing .global one (a
DataRace: the bulk copy does not know what its thread acquired); this check guards the
compiled PTX as well. A plain presence check (scripts/check_ptx.py) cannot tell one
fence of a kind from two. Exit 77 (skip) without cuobjdump.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

EXPECTED = {"fence.proxy.async.shared::cta": 2, "fence.proxy.async.global": 2}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuobjdump", default="")
    parser.add_argument("--arch", action="append", required=True)
    parser.add_argument("object")
    args = parser.parse_args()
    if not args.cuobjdump or not os.path.exists(args.cuobjdump):
        print("SKIP: cuobjdump not found")
        return 77
    run = subprocess.run([args.cuobjdump, "-ptx", args.object], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        print(f"FAIL: cuobjdump -ptx {args.object} exited {run.returncode}: {run.stderr.strip()}")
        return 1
    modules: dict[str, str] = {}
    for module in run.stdout.split("Fatbin ptx code:")[1:]:
        m = re.search(r"^arch = (\S+)", module, re.MULTILINE)
        if m:
            modules[m.group(1)] = modules.get(m.group(1), "") + module
    failed = False
    for arch in args.arch:
        text = modules.get(arch)
        if text is None:
            print(f"FAIL: no PTX for {arch} in {args.object} (found: {' '.join(sorted(modules)) or 'none'})")
            failed = True
            continue
        for needle, expected in EXPECTED.items():
            count = text.count(needle)
            ok = count >= expected
            print(f"{'ok  ' if ok else 'FAIL'}: {arch}: {count} '{needle}' (expected at least {expected})")
            failed |= not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
