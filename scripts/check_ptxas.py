#!/usr/bin/env python3
"""Summarise ptxas resource reports and fail on any register spill.

Each input is one translation unit's report, as scripts/ptxas_tee.sh writes it from
`nvcc -Xptxas -v`: for every architecture ptxas prints a section that starts with
"N bytes gmem", then for every kernel instantiation ("entry function") and every
non-inlined device function its stack frame, spill stores and spill loads, and for
kernels the registers, barriers and shared memory they use.

Writes a table of every (function, arch) to --summary (or to stdout without it)
and the verdict, with every spill, to stdout. With --max-stack BYTES a kernel whose
stack frame is larger fails too: ptxas reports no spill when the compiler put a
per-thread array in local memory from the start (an array indexed at run time, or
one whose address escapes), yet every access to it is then a local-memory access.
Exit status: 0 when nothing spills (and no stack frame is too large), 1 otherwise,
2 when a report is missing or holds no ptxas output at all (the -Xptxas -v flag was
lost: nothing would be checked).

Usage: check_ptxas.py [--summary FILE] [--stamp FILE] [--max-stack BYTES] REPORT...
--stamp FILE is touched on success and removed otherwise, so a build rule that
outputs it reruns until the spill is gone.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

RE_GMEM = re.compile(r"ptxas info\s*:\s*\d+ bytes gmem")
RE_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
RE_PROPS = re.compile(r"Function properties for (\S+)")
RE_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
RE_USED = re.compile(r"Used (\d+) registers")
RE_SMEM = re.compile(r"(\d+) bytes smem")
RE_BARRIERS = re.compile(r"used (\d+) barriers")


@dataclass
class Function:
    tu: str
    name: str  # mangled
    entry: bool
    arch: str = "?"
    registers: int | None = None
    barriers: int | None = None
    smem_bytes: int | None = None
    stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


def parse_report(tu: str, text: str) -> tuple[list[Function], int]:
    """Returns the functions of one report and how many ptxas lines it held."""
    functions: list[Function] = []
    section: list[Function] = []
    section_arch = "?"
    current: Function | None = None
    ptxas_lines = 0

    def close_section() -> None:
        # Device-function properties may be printed before the section's first entry
        # names the arch, so the arch is assigned when the section ends.
        for f in section:
            f.arch = section_arch
        functions.extend(section)
        section.clear()

    def find(name: str) -> Function | None:
        for f in section:
            if f.name == name:
                return f
        return None

    for line in text.splitlines():
        if line.startswith("ptxas"):
            ptxas_lines += 1
        if RE_GMEM.search(line):
            close_section()
            section_arch, current = "?", None
            continue
        m = RE_ENTRY.search(line)
        if m:
            section_arch = m.group(2)
            current = find(m.group(1)) or Function(tu, m.group(1), entry=True)
            current.entry = True
            if current not in section:
                section.append(current)
            continue
        m = RE_PROPS.search(line)
        if m:
            current = find(m.group(1))
            if current is None:
                current = Function(tu, m.group(1), entry=False)
                section.append(current)
            continue
        if current is None:
            continue
        m = RE_FRAME.search(line)
        if m:
            current.stack_bytes, current.spill_store_bytes, current.spill_load_bytes = (
                int(g) for g in m.groups())
            continue
        m = RE_USED.search(line)
        if m:
            current.registers = int(m.group(1))
            # ptxas leaves out "bytes smem" when a kernel uses none.
            s = RE_SMEM.search(line)
            current.smem_bytes = int(s.group(1)) if s else 0
            if (b := RE_BARRIERS.search(line)):
                current.barriers = int(b.group(1))
    close_section()
    return functions, ptxas_lines


def demangle(names: list[str]) -> dict[str, str]:
    """Itanium names are demangled with c++filt when it is on PATH."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True,
                         check=False).stdout.splitlines()
    if len(out) != len(names):
        return {n: n for n in names}
    return dict(zip(names, out))


def arch_key(arch: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", arch)
    return (int(digits) if digits else 0, arch)


def fmt(value: int | None) -> str:
    return "-" if value is None else str(value)


def summarise(functions: list[Function], max_stack: int | None = None) -> str:
    pretty = demangle(sorted({f.name for f in functions}))
    header = ("tu", "arch", "kind", "regs", "bar", "smem", "stack", "spill_st", "spill_ld",
              "function")
    rows = [header]
    for f in sorted(functions, key=lambda f: (f.tu, f.name, arch_key(f.arch))):
        rows.append((f.tu, f.arch, "kernel" if f.entry else "device", fmt(f.registers),
                     fmt(f.barriers), fmt(f.smem_bytes), str(f.stack_bytes),
                     str(f.spill_store_bytes), str(f.spill_load_bytes), pretty[f.name]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
    kernels = sum(1 for f in functions if f.entry)
    archs = sorted({f.arch for f in functions}, key=arch_key)
    spilling = [f for f in functions if f.spills]
    lines.append("")
    lines.append(f"ptxas: {kernels} kernel instantiation(s) x arch, {len(functions) - kernels} "
                 f"device function(s), archs {' '.join(archs) or '-'}; "
                 + (f"SPILLS in {len(spilling)}:" if spilling else "no spills"))
    for f in sorted(spilling, key=lambda f: (f.tu, f.name, arch_key(f.arch))):
        lines.append(f"  SPILL {f.tu} {f.arch}: {f.spill_store_bytes} bytes spill stores, "
                     f"{f.spill_load_bytes} bytes spill loads in {pretty[f.name]}")
    for f in sorted(too_deep(functions, max_stack), key=lambda f: (f.tu, f.name, arch_key(f.arch))):
        lines.append(f"  STACK {f.tu} {f.arch}: {f.stack_bytes} bytes stack frame (limit {max_stack}) "
                     f"in {pretty[f.name]}")
    return "\n".join(lines) + "\n"


def too_deep(functions: list[Function], max_stack: int | None) -> list[Function]:
    """The kernels whose stack frame exceeds max_stack (none without a limit)."""
    if max_stack is None:
        return []
    return [f for f in functions if f.entry and f.stack_bytes > max_stack]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--summary")
    parser.add_argument("--stamp")
    parser.add_argument("--max-stack", type=int)
    args = parser.parse_args()
    if args.stamp and os.path.exists(args.stamp):
        os.remove(args.stamp)

    functions: list[Function] = []
    problems: list[str] = []
    for path in args.reports:
        tu = os.path.basename(path).removesuffix(".txt")
        if not os.path.exists(path):
            problems.append(f"{path}: missing: the object was built without scripts/ptxas_tee.sh, "
                            f"or the report was deleted; rebuild the object "
                            f"(ninja -t clean railyard_cuda && ninja)")
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            found, ptxas_lines = parse_report(tu, f.read())
        if ptxas_lines == 0:
            problems.append(f"{path}: no ptxas output (was -Xptxas -v dropped?)")
        functions.extend(found)

    text = summarise(functions, args.max_stack)
    for p in problems:
        text += f"ERROR {p}\n"
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as f:
            f.write(text)
    # The full table goes to the summary file; stdout (the build log) gets the verdict.
    sys.stdout.write(text if not args.summary else
                     text[text.index("\nptxas: ") + 1:] + f"(table: {args.summary})\n")
    if problems:
        return 2
    if any(f.spills for f in functions):
        sys.stderr.write("check_ptxas: register spills are not allowed (see above); reduce "
                         "register pressure or change the template parameters\n")
        return 1
    if too_deep(functions, args.max_stack):
        sys.stderr.write(f"check_ptxas: a kernel's stack frame exceeds {args.max_stack} bytes (see above): a "
                         "per-thread array lives in local memory; index it with constants only (unrolled "
                         "loops) and keep its address from escaping\n")
        return 1
    if args.stamp:
        with open(args.stamp, "w", encoding="utf-8") as f:
            f.write("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
