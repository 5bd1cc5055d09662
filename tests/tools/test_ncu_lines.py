#!/usr/bin/env python3
"""Tests of scripts/ncu_lines.py on a canned profile and listing (tests/tools/ncu_lines):
the samples of each instruction go to its innermost line of the chosen file, with the
lines it was inlined through; an instruction the listing lacks is counted as
unaligned; the kernel is chosen by name and occurrence; a missing one exits 2."""

import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "ncu_lines.py")
DATA = os.path.join(HERE, "ncu_lines")


def run(*options):
    return subprocess.run([sys.executable, SCRIPT, "--csv", os.path.join(DATA, "sass.csv"), "--sass",
                           os.path.join(DATA, "kernel.sass"), "--function", "_Z3foo", "--file", "k.cuh",
                           *options], capture_output=True, text=True, check=False)


def table(stdout):
    """(samples, executed, where) per row of the report."""
    rows = []
    for line in stdout.splitlines()[3:]:
        samples, _, executed, where = line.split(None, 3)
        rows.append((int(samples), int(executed), where))
    return rows


class NcuLinesTest(unittest.TestCase):
    def test_samples_go_to_the_innermost_line_of_the_file(self):
        r = run("--kernel", "foo")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("kernel: void foo(int*)", r.stdout)
        # NOP is in the profile only: 5 of 6 instructions aligned, its 7 samples unaligned.
        self.assertIn("instructions: 5 of 6 aligned with the listing; samples: 35, 7 on unaligned", r.stdout)
        # By hand from the two files: LDG and BRA sit at line 20 inlined at 30 (20 + 3
        # samples, 100 + 100 executed); IADD3 at other.h:5 inlined at 30 goes to 30;
        # LDC to 10; EXIT to 40. Sorted by samples.
        self.assertEqual(table(r.stdout), [(23, 200, "k.cuh:20 <- 30"), (4, 50, "k.cuh:30"),
                                           (1, 10, "k.cuh:10"), (0, 10, "k.cuh:40")])

    def test_the_occurrence_picks_a_later_launch(self):
        r = run("--kernel", "foo", "--occurrence", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("samples: 2, 0 on unaligned", r.stdout)
        self.assertEqual(table(r.stdout), [(2, 10, "k.cuh:10")])

    def test_a_missing_kernel_or_function_exits_2(self):
        r = run("--kernel", "baz")
        self.assertEqual(r.returncode, 2)
        self.assertIn("no kernel #1 whose name contains 'baz'", r.stderr)
        r = subprocess.run([sys.executable, SCRIPT, "--csv", os.path.join(DATA, "sass.csv"), "--kernel", "foo",
                            "--sass", os.path.join(DATA, "kernel.sass"), "--function", "_Z3qux", "--file", "k.cuh"],
                           capture_output=True, text=True, check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no function whose section name contains '_Z3qux'", r.stderr)


if __name__ == "__main__":
    unittest.main()
