#!/usr/bin/env python3
"""Checks that the code in the documentation is code CI runs.

Every fenced ```cpp or ```python block in README.md and docs/*.md is preceded by an
HTML comment saying what it is:

  <!-- excerpt: docs/examples/python_quickstart.py -->
      an excerpt of that file: each of the block's lines (stripped; blank lines and
      "..." elisions aside) is a line of the file, in the file's order. The file must
      be one that CI compiles or runs (docs/examples, include, src, kernels, python,
      benchmarks, tests).
  <!-- synopsis -->
      a declaration sketch (a signature, a struct's outline), not an example.

So an example in the docs cannot drift from the programs CI builds and runs.

Usage: check_doc_examples.py ROOT   (exit 1 listing every violation)
"""
import pathlib
import re
import sys

CODE_FENCE = re.compile(r"^```(cpp|c\+\+|python)\s*$")
MARKER = re.compile(r"^<!--\s*(excerpt:\s*(?P<path>\S+)|synopsis)\s*-->$")
RUN_BY_CI = ("docs/examples/", "include/", "src/", "kernels/", "python/", "benchmarks/", "tests/")


def blocks(lines):
    """(fence line index, language, body lines) of each code block."""
    i = 0
    while i < len(lines):
        m = CODE_FENCE.match(lines[i].strip())
        if m:
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            yield i, m.group(1), lines[i + 1 : j]
            i = j
        elif lines[i].strip().startswith("```"):  # another language: skip its body
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            i = j
        i += 1


def is_subsequence(needles, haystack):
    it = iter(haystack)
    return all(any(n == h for h in it) for n in needles)


def check(root: pathlib.Path):
    problems = []
    docs = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    for doc in docs:
        lines = doc.read_text().splitlines()
        for fence, lang, body in blocks(lines):
            where = f"{doc.relative_to(root)}:{fence + 1}"
            k = fence - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            m = MARKER.match(lines[k].strip()) if k >= 0 else None
            if not m:
                problems.append(f"{where}: a {lang} block without <!-- excerpt: FILE --> or <!-- synopsis --> before it")
                continue
            path = m.group("path")
            if path is None:
                continue
            if not path.startswith(RUN_BY_CI):
                problems.append(f"{where}: excerpt of {path}, which CI does not build or run")
                continue
            source = root / path
            if not source.is_file():
                problems.append(f"{where}: excerpt of {path}, which does not exist")
                continue
            wanted = [ln.strip() for ln in body if ln.strip() and ln.strip() != "..."]
            have = [ln.strip() for ln in source.read_text().splitlines()]
            if not is_subsequence(wanted, have):
                missing = next((w for w in wanted if w not in have), None)
                detail = f"line {missing!r} is not in it" if missing else "its lines are out of the file's order"
                problems.append(f"{where}: not an excerpt of {path}: {detail}")
    return problems, len(docs)


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems, count = check(root)
    for p in problems:
        print(p)
    print(f"check_doc_examples: {count} documents, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
