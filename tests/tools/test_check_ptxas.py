#!/usr/bin/env python3
"""Tests of scripts/check_ptxas.py on canned ptxas -v reports: the spill check must
pass a clean report and fail, naming the function and arch, on one that spills."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "check_ptxas.py")


def check(*reports, options=()):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.txt")
        stamp = os.path.join(tmp, "check.stamp")
        run = subprocess.run(
            [sys.executable, SCRIPT, "--summary", summary, "--stamp", stamp, *options,
             *[os.path.join(HERE, r) for r in reports]],
            capture_output=True, text=True, check=False)
        with open(summary, encoding="utf-8") as f:
            text = f.read()
        return run.returncode, text, os.path.exists(stamp)


class CheckPtxasTest(unittest.TestCase):
    def test_clean_report_passes(self):
        rc, summary, stamped = check("ptxas_clean.txt")
        self.assertEqual(rc, 0, summary)
        self.assertTrue(stamped)
        self.assertIn("4 kernel instantiation(s) x arch", summary)
        self.assertIn("archs sm_90a sm_100a; no spills", summary)
        self.assertIn("void bulk_kernel<8>(uint4 const*, uint4*, int)", summary)

    def test_spilling_report_fails(self):
        rc, summary, stamped = check("ptxas_spill.txt")
        self.assertEqual(rc, 1, summary)
        self.assertFalse(stamped)
        self.assertIn("SPILL ptxas_spill sm_90a: 26236 bytes spill stores, 63596 bytes spill "
                      "loads in spiller(float*, int)", summary)
        # a non-inlined device function that spills is caught too
        self.assertIn("SPILL ptxas_spill sm_100a: 728 bytes spill stores, 812 bytes spill "
                      "loads in helper(float*, int)", summary)

    def test_spill_on_one_arch_fails(self):
        rc, summary, _ = check("ptxas_clean.txt", "ptxas_spill_one_arch.txt")
        self.assertEqual(rc, 1, summary)
        self.assertIn("SPILLS in 1:", summary)
        self.assertIn("SPILL ptxas_spill_one_arch sm_100a: 16 bytes spill stores", summary)

    def test_local_array_fails_the_stack_limit(self):
        # The combine's accumulators in local memory: no spill, a 576-byte frame.
        rc, summary, stamped = check("ptxas_local_array.txt", options=("--max-stack", "384"))
        self.assertEqual(rc, 1, summary)
        self.assertFalse(stamped)
        self.assertIn("no spills", summary)
        self.assertIn("STACK ptxas_local_array sm_90a: 576 bytes stack frame (limit 384) in "
                      "void railyard::kernels::device_kernel<railyard::kernels::intranode::Combine<16384u, 6> >", summary)
        # Within the limit, or without one, it passes.
        self.assertEqual(check("ptxas_local_array.txt", options=("--max-stack", "576"))[0], 0)
        self.assertEqual(check("ptxas_local_array.txt")[0], 0)

    def test_report_without_ptxas_output_is_an_error(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("# compiled without -Xptxas -v\n")
        try:
            rc, summary, stamped = check(f.name)
        finally:
            os.remove(f.name)
        self.assertEqual(rc, 2, summary)
        self.assertFalse(stamped)
        self.assertIn("no ptxas output", summary)


if __name__ == "__main__":
    unittest.main()
