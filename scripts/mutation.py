#!/usr/bin/env python3
"""Mutation testing of the kernels' ordering, in the simulator.

Each ordering site of the kernels (a line that calls a release store, an acquire load,
a fence, a bulk-group wait, an mbarrier wait, a block or warp barrier) is weakened on
its own, and the kernel tests must notice. The simulator applies the mutant at run
time (RAILYARD_SIM_MUTANT=<file>:<line>:<kind>, src/sim/mutation.hpp), so one build
serves every mutant:

1. record the sites the kernel tests execute (RAILYARD_SIM_SITES);
2. run the tests unmutated (they must pass);
3. per site, run them with that site's mutant, stopping at the first failure: a failing
   test kills the mutant, a mutant every test survives is reported;
4. write the report (Markdown) and exit 1 if a mutant survived that
   tests/tools/mutation_explained.txt does not explain.

Every run is in the simulator's weak-memory mode (RAILYARD_SIM_MEMORY_MODEL=weak), where
a release weakened to relaxed, an acquire weakened to relaxed and a deleted fence are
observable, as are deleted proxy fences (async-proxy tracking).

    python3 scripts/mutation.py --build build
    python3 scripts/mutation.py --build build --sites 'combine.cuh' --kinds bulk_wait,mbarrier_wait
    python3 scripts/mutation.py --build build --suite hierarchical    # across domains

Two suites: `intranode` (the default) mutates every site the intra-node kernel tests
execute; `hierarchical` the sites of kernels/hierarchical/, under the hierarchical
kernel tests (the intra-node sites they also execute are the intranode suite's).
Each has its file of explained survivors.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Per suite: the kernel tests (small shapes, many seeds) that must kill the mutants, the
# sites mutated (all that the tests execute where empty) and the explained survivors.
SUITES = {
    "intranode": (r"^(IntranodeEndToEnd|IntranodeDispatch|IntranodeCombine|IntranodeMetadata|Pipeline)\.", "",
                  "mutation_explained.txt"),
    "hierarchical": (r"^(HierarchicalDispatchRdma|HierarchicalDispatch|HierarchicalCombine|HierarchicalMetadata)\.",
                     r"^kernels/hierarchical/", "mutation_explained_hierarchical.txt"),
}
KINDS = ["release", "acquire", "fence", "proxy_fence", "bulk_wait", "bulk_wait_read", "mbarrier_wait", "bar_sync",
         "syncwarp"]
# The tests run in the weak-memory mode, which observes every kind.
WEAK = {"RAILYARD_SIM_MEMORY_MODEL": "weak"}
# Where the ordering sites of the kernels are (a site's line is the kernel-side call).
SITE_FILES = re.compile(r"^(kernels/|include/railyard/(arch|pipeline)/)")


def ctest(build, tests, env_extra, timeout, stop_on_failure):
    cmd = ["ctest", "--test-dir", str(build), "-R", tests, "-j", str(os.cpu_count() or 2), "--timeout", str(timeout),
           "--output-on-failure"]
    if stop_on_failure:
        cmd.append("--stop-on-failure")
    env = dict(os.environ, **env_extra)
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    failed = re.findall(r"\d+ - (\S+) \((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)", proc.stdout)
    return proc.returncode, failed, time.monotonic() - start, proc.stdout


def record_sites(build, tests, timeout):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sites.txt"
        rc, failed, secs, out = ctest(build, tests, dict(WEAK, RAILYARD_SIM_SITES=str(path)), timeout, False)
        if rc != 0:
            sys.exit(f"mutation.py: the unmutated tests fail ({failed}); fix them first\n{out[-4000:]}")
        lines = path.read_text().split() if path.exists() else []
    sites = sorted({l for l in lines if SITE_FILES.match(l)}, key=lambda s: (s.rsplit(":", 2)[0],
                                                                             int(s.rsplit(":", 2)[1]), s))
    return sites, secs


def load_explained(path):
    explained = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                site, _, why = line.partition(" ")
                explained[site] = why.strip()
    return explained


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"), help="a simulator-flavour build with the tests built")
    ap.add_argument("--suite", default="intranode", choices=sorted(SUITES), help="which kernels' sites and tests")
    ap.add_argument("--tests", default=None, help="ctest -R regex of the tests that must kill mutants (default: the suite's)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds to run (default: all)")
    ap.add_argument("--sites", default=None, help="only sites whose 'file:line:kind' matches this regex (default: the suite's)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per test before it counts as failing")
    ap.add_argument("--report", default=None, help="Markdown report (default: <build>/mutation/report.md)")
    args = ap.parse_args()
    suite_tests, suite_sites, explained_file = SUITES[args.suite]
    partial = args.sites is not None or args.tests is not None  # not the suite's whole run
    args.tests = args.tests or suite_tests
    args.sites = suite_sites if args.sites is None else args.sites

    build = Path(args.build).resolve()
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            sys.exit(f"mutation.py: --kinds has '{k}'; expected some of {', '.join(KINDS)}")
    report = Path(args.report) if args.report else build / "mutation" / "report.md"
    explained_path = ROOT / "tests" / "tools" / explained_file
    explained = load_explained(explained_path)

    sites, baseline_secs = record_sites(build, args.tests, args.timeout)
    if not sites:
        sys.exit("mutation.py: the tests executed no ordering site; is the build the simulator flavour?")
    print(f"mutation.py: {len(sites)} ordering sites executed by the tests (unmutated run {baseline_secs:.0f} s)")

    rows, survivors, unexplained = [], [], []
    for site in sites:
        kind = site.rsplit(":", 1)[1]
        if args.sites and not re.search(args.sites, site):
            continue
        if kind not in kinds:
            rows.append((site, "not run", "", 0.0))
            continue
        rc, failed, secs, _ = ctest(build, args.tests, dict(WEAK, RAILYARD_SIM_MUTANT=site), args.timeout, True)
        if rc != 0:
            rows.append((site, "killed", failed[0][0] if failed else "(ctest failed)", secs))
        else:
            why = explained.get(site, "")
            rows.append((site, "survived", why or "UNEXPLAINED", secs))
            survivors.append(site)
            if not why:
                unexplained.append(site)
        print(f"  {site}: {rows[-1][1]} ({secs:.0f} s) {rows[-1][2]}", flush=True)

    report.parent.mkdir(parents=True, exist_ok=True)
    run = [r for r in rows if r[1] != "not run"]
    killed = sum(1 for r in run if r[1] == "killed")
    with report.open("w") as f:
        f.write("# Mutation report (simulator)\n\n")
        f.write(f"Tests: `{args.tests}`. Kinds run: {', '.join(kinds)}.\n\n")
        f.write(f"{len(sites)} sites executed; {len(run)} mutants run: {killed} killed, {len(survivors)} survived "
                f"({len(unexplained)} unexplained); {len(rows) - len(run)} not run.\n\n")
        f.write("| site | kind | result | first failing test, or why it survives |\n| --- | --- | --- | --- |\n")
        for site, result, detail, _ in rows:
            where, kind = site.rsplit(":", 1)
            f.write(f"| {where} | {kind} | {result} | {detail} |\n")
    print(f"mutation.py: {len(run)} mutants run, {killed} killed, {len(survivors)} survived "
          f"({len(unexplained)} unexplained); report {report}")
    # An explanation must name a surviving site: one for a site that is killed or no
    # longer executed (lines move) is stale. Only a suite's whole run can tell.
    stale = []
    if not partial and set(kinds) == set(KINDS):
        stale = sorted(s for s in explained if s not in survivors)
        for s in stale:
            print(f"mutation.py: stale explanation in {explained_path.relative_to(ROOT)}: {s} "
                  f"({'killed' if s in sites else 'not an executed site'})")
    return 1 if unexplained or stale else 0


if __name__ == "__main__":
    sys.exit(main())
