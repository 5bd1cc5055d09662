#!/usr/bin/env python3
"""Where a kernel's time goes, per source line: Nsight Compute's per-instruction samples
attributed to the lines of one source file.

Inputs, both made on (or for) the GPU machine:
  - the profile's SASS page as CSV:
      ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv
    one block per profiled kernel ("Kernel Name", then a header row, then one row per
    instruction with its "Warp Stall Sampling (All Samples)" and "Instructions Executed");
  - the same kernel's SASS with line information, from a cubin built with -lineinfo by
    the same nvcc and host compiler as the profiled binary:
      cuobjdump -xelf all BINARY && nvdisasm -gi -c FILE.cubin > kernel.sass
    (`//## File "...", line N [inlined at ...]` comments before the instructions).

The two instruction lists are aligned by their opcodes (difflib), so a listing from a
slightly different build still attributes what matches and says how much did not.
Each instruction is charged to its innermost line in --file, shown with the chain of
--file lines it was inlined through (innermost first). Output: one row per line,
samples (share of the kernel's), instructions executed, the line and, with
--source, its text.

  ncu_lines.py --csv sass.csv --kernel Dispatch [--occurrence N] --sass kernel.sass \\
               --function Dispatch --file kernels/intranode/dispatch.cuh [--source ROOT] [--top N]

--file is matched as a suffix of the listing's paths; with --source it is also the
file's path under ROOT, whose lines are then printed.

Exit status 0, or 2 when the kernel or the function is not found.
"""

from __future__ import annotations

import argparse
import collections
import csv
import difflib
import os
import re
import sys
from dataclasses import dataclass, field

RE_LINE_INFO = re.compile(r'\s*//## File "([^"]+)", line (\d+)')
RE_INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def opcode(text: str) -> str:
    """The opcode of a SASS instruction, its predicate (@P0, @!PT) dropped."""
    words = text.split()
    return words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "")


@dataclass
class Listing:
    """One function of an nvdisasm -gi listing: per instruction its opcode and the
    (file, line) locations of the comment block before it, innermost first."""
    opcodes: list[str] = field(default_factory=list)
    locations: list[list[tuple[str, int]]] = field(default_factory=list)


def read_listing(lines, function: str) -> Listing | None:
    listing, inside, block, block_done = None, False, [], False
    for line in lines:
        if line.startswith(".text."):
            if inside:
                break
            inside = function in line
            if inside:
                listing = Listing()
            continue
        if not inside:
            continue
        m = RE_LINE_INFO.match(line)
        if m:
            if block_done:
                block, block_done = [], False
            block.append((m.group(1), int(m.group(2))))
            continue
        m = RE_INSTRUCTION.match(line)
        if m:
            listing.opcodes.append(opcode(m.group(1)))
            listing.locations.append(list(block))
            block_done = True
    return listing


@dataclass
class Profile:
    name: str
    opcodes: list[str]
    samples: list[int]
    executed: list[int]


def read_profile(rows, kernel: str, occurrence: int = 1) -> Profile | None:
    """The occurrence-th kernel (from 1) of the CSV whose name contains `kernel`."""
    current, header, seen = None, None, 0
    for row in rows:
        if row and row[0] == "Kernel Name":
            if current is not None:
                return current
            seen += kernel in row[1]
            current = Profile(row[1], [], [], []) if kernel in row[1] and seen == occurrence else None
            header = None
            continue
        if current is None or not row:
            continue
        if row[0] == "Address":
            header = row
            continue
        if header is not None:
            current.opcodes.append(opcode(row[header.index("Source")]))
            current.samples.append(int(float(row[header.index(SAMPLES)] or 0)))
            current.executed.append(int(float(row[header.index(EXECUTED)] or 0)))
    return current


@dataclass
class Attribution:
    rows: list[tuple[int, int, str, int, list[int]]]  # samples, executed, file, line, chain
    total_samples: int
    matched: int
    unmatched_samples: int


def attribute(profile: Profile, listing: Listing, file_suffix: str) -> Attribution:
    match = difflib.SequenceMatcher(None, profile.opcodes, listing.opcodes, autojunk=False)
    to_listing = {}
    for a, b, n in match.get_matching_blocks():
        for i in range(n):
            to_listing[a + i] = b + i
    samples, executed = collections.Counter(), collections.Counter()
    unmatched = 0
    for i, (s, e) in enumerate(zip(profile.samples, profile.executed)):
        if i not in to_listing:
            unmatched += s
            continue
        chain = [line for path, line in listing.locations[to_listing[i]] if path.endswith(file_suffix)]
        key = tuple(dict.fromkeys(chain))  # innermost first, each line once
        samples[key] += s
        executed[key] += e
    rows = [(samples[k], executed[k], file_suffix, k[0] if k else 0, list(k[1:])) for k in samples]
    rows.sort(key=lambda r: (-r[0], -r[1], r[3]))
    return Attribution(rows, sum(profile.samples), len(to_listing), unmatched)


def report(att: Attribution, profile: Profile, total_instructions: int, top: int, source_root: str | None) -> str:
    text = None
    if source_root:
        for r in att.rows:
            path = os.path.join(source_root, r[2])
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    text = f.read().split("\n")
                break
    out = [f"kernel: {profile.name}",
           f"instructions: {att.matched} of {total_instructions} aligned with the listing; "
           f"samples: {att.total_samples}, {att.unmatched_samples} on unaligned instructions",
           f"{'samples':>8} {'share':>6} {'executed':>10}  line (inlined through)"]
    for s, e, path, line, chain in att.rows[:top]:
        share = 100.0 * s / att.total_samples if att.total_samples else 0.0
        where = f"{os.path.basename(path)}:{line}" if line else "(other files)"
        if chain:
            where += " <- " + " <- ".join(str(c) for c in chain)
        if text and line and line <= len(text):
            where += "  | " + text[line - 1].strip()
        out.append(f"{s:>8} {share:>5.1f}% {e:>10}  {where}")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", required=True, help="ncu --page source --csv --print-source sass")
    ap.add_argument("--kernel", required=True, help="a substring of the profiled kernel's name")
    ap.add_argument("--occurrence", type=int, default=1, help="the n-th kernel of that name (launch order)")
    ap.add_argument("--sass", required=True, help="nvdisasm -gi listing")
    ap.add_argument("--function", required=True, help="a substring of the function's .text section name")
    ap.add_argument("--file", required=True, help="the source file to attribute to (a path suffix)")
    ap.add_argument("--source", help="the repository root, to print each line's text")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    with open(a.csv, newline="", encoding="utf-8") as f:
        profile = read_profile(csv.reader(f), a.kernel, a.occurrence)
    if profile is None:
        sys.stderr.write(f"ncu_lines: no kernel #{a.occurrence} whose name contains '{a.kernel}' in {a.csv}\n")
        return 2
    with open(a.sass, encoding="utf-8") as f:
        listing = read_listing(f, a.function)
    if listing is None:
        sys.stderr.write(f"ncu_lines: no function whose section name contains '{a.function}' in {a.sass}\n")
        return 2
    att = attribute(profile, listing, a.file)
    sys.stdout.write(report(att, profile, len(profile.opcodes), a.top, a.source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
