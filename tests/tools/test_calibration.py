#!/usr/bin/env python3
"""Tests of scripts/calibration.py's report and scripts/gpu-calibrate.sh's GPU detection
(ctest tools.calibration, label host).

The report is checked against ratios known by construction: a measured file whose every
figure is twice the reference's, a benchmark whose every median is three times its
simulated time; the doc outside the markers must not change, and a file that is not a
measurement must be refused. gpu-calibrate.sh must exit 3 without a GPU and 2 for a GPU
the simulator has no preset for, before it builds anything; with --no-build it must use
the programs already built (here fakes that write such fixtures) and name a missing one.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "calibration.py")
REFERENCE = os.path.join(ROOT, "docs", "calibration", "simulated-h100.json")
DOC = os.path.join(ROOT, "docs", "performance-model.md")


class Report(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        with open(REFERENCE) as f:
            self.sim = json.load(f)

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def write(self, name, obj):
        with open(self.path(name), "w") as f:
            json.dump(obj, f)
        return self.path(name)

    def measured(self, kind="MEASURED on a GPU (test fixture)"):
        figures = [dict(f, value=2 * f["value"]) for f in self.sim["figures"] if f["name"] != "nvlink_gbps"]
        return self.write("measured.json", {"kind": kind, "device": "Test GPU", "compute_capability": "9.0",
                                            "figures": figures, "skipped": ["NVLink figures: one GPU"]})

    def bench(self):
        ops = {}
        for o in self.sim["end_to_end"]["ops"]:
            name, layout = re.match(r"(.*) \[(\w+)\]$", o["op"]).groups()
            ops.setdefault((name, layout), []).append({"sms": o["sms"], "time_us": {"median": 3 * o["sim_time_us"]}})
        return self.write("bench.json", {"ops": [{"op": n, "layout": l, "measured": {"points": p}}
                                                 for (n, l), p in ops.items()]})

    def report(self, measured, doc):
        return subprocess.run([sys.executable, SCRIPT, "report", "--simulated", REFERENCE, "--measured", measured,
                               "--measured-bench", self.bench(), "--doc", doc, "--command", "test"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def test_ratios_are_written_between_the_markers(self):
        doc = self.path("doc.md")
        with open(DOC) as f:
            original = f.read()
        with open(doc, "w") as f:
            f.write(original)
        proc = self.report(self.measured(), doc)
        self.assertEqual(proc.returncode, 0, proc.stdout)
        with open(doc) as f:
            text = f.read()
        begin, end = text.index("<!-- gpu-calibrate: begin"), text.index("<!-- gpu-calibrate: end -->")
        self.assertEqual(text[:begin], original[:original.index("<!-- gpu-calibrate: begin")])
        self.assertEqual(text[end:], original[original.index("<!-- gpu-calibrate: end -->"):])
        section = text[begin:end]
        rows = {r[0]: r for r in (line.strip("| ").split(" | ") for line in section.splitlines()
                                  if line.startswith("| ") and "---" not in line)}
        for f in self.sim["figures"]:
            want = "-" if f["name"] == "nvlink_gbps" else "2.00"
            self.assertEqual(rows[f["name"]][-1], want, f["name"])
        e2e = [line for line in section.splitlines() if line.startswith("| dispatch") or line.startswith("| combine")]
        self.assertEqual(len(e2e), len(self.sim["end_to_end"]["ops"]))
        self.assertTrue(all(line.rstrip(" |").endswith("3.00") for line in e2e), e2e)
        self.assertIn("Not measured: NVLink figures: one GPU.", section)
        self.assertIn("MEASURED on Test GPU", section)

    def test_a_simulated_file_is_not_a_measurement(self):
        doc = self.path("doc.md")
        with open(DOC) as f, open(doc, "w") as g:
            g.write(f.read())
        proc = self.report(self.measured(kind=self.sim["kind"]), doc)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("is not a measurement", proc.stdout)

    def test_a_doc_without_markers_is_an_error(self):
        doc = self.path("doc.md")
        with open(doc, "w") as f:
            f.write("# no markers\n")
        proc = self.report(self.measured(), doc)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("has no", proc.stdout)


def executable(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def fake_h100(tmp):
    return executable(os.path.join(tmp, "nvidia-smi"), '#!/bin/sh\necho "NVIDIA H100 80GB HBM3, 9.0"\n')


class GpuCalibrateScript(unittest.TestCase):
    def run_script(self, smi, *options, prepare=None):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, RAILYARD_CALIBRATE_NVIDIA_SMI=smi(tmp) if callable(smi) else smi)
            build = os.path.join(tmp, "build")
            if prepare:
                prepare(build)
            proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu-calibrate.sh"), "--build-dir", build,
                                   "--out", os.path.join(tmp, "out"), *options], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            doc = os.path.join(tmp, "out", "performance-model.md")
            proc.doc = open(doc).read() if os.path.exists(doc) else None
            return proc

    def test_no_gpu_exits_3(self):
        proc = self.run_script("/no/such/nvidia-smi")
        self.assertEqual(proc.returncode, 3, proc.stdout)
        self.assertIn("no GPU found", proc.stdout)

    def test_a_gpu_without_a_preset_exits_2(self):
        def fake(tmp):
            path = os.path.join(tmp, "nvidia-smi")
            with open(path, "w") as f:
                f.write('#!/bin/sh\necho "NVIDIA A100-SXM4-80GB, 8.0"\n')
            os.chmod(path, 0o755)
            return path
        proc = self.run_script(fake)
        self.assertEqual(proc.returncode, 2, proc.stdout)
        self.assertIn("compute capability '8.0'", proc.stdout)

    def test_no_build_names_a_program_that_was_not_built(self):
        proc = self.run_script(fake_h100, "--no-build", "--no-doc")
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertRegex(proc.stdout, r"--no-build: .*/build/benchmarks/railyard_calibrate_cuda does not exist")

    def test_no_build_runs_the_programs_of_the_build_given(self):
        # Fakes of the two CUDA programs: every figure twice the reference's, every
        # median three times its simulated time (as Report's fixtures).
        report = Report("test_ratios_are_written_between_the_markers")
        report.setUp()
        measured, bench = report.measured(), report.bench()

        def prepare(build):
            bin_dir = os.path.join(build, "benchmarks")
            os.makedirs(bin_dir)
            executable(os.path.join(bin_dir, "railyard_calibrate_cuda"), f'#!/bin/sh\ncp {measured} "$2"\n')
            executable(os.path.join(bin_dir, "railyard_bench_ep_cuda"),
                       f'#!/bin/bash\nwhile [ $# -gt 0 ]; do [ "$1" = --json ] && cp {bench} "$2"; shift; done\n')
        try:
            proc = self.run_script(fake_h100, "--no-build", "--no-doc", prepare=prepare)
        finally:
            report.tearDown()
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertIn("using docs/calibration/simulated-h100.json", proc.stdout)
        self.assertIn("by `bash scripts/gpu-calibrate.sh --no-build (the build in ", proc.doc)
        self.assertIn("| launch_us | us | 2.5 | 2.5 | 5 | 2.00 |", proc.doc)
        self.assertRegex(proc.doc, r"\| dispatch \[received\] \| 8 \| [\d.]+ \| [\d.]+ \| 3\.00 \|")


if __name__ == "__main__":
    unittest.main()
