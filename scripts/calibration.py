#!/usr/bin/env python3
"""The timed simulator against a GPU: reference figures and the measured/simulated table.

  calibration.py e2e-args
      the benchmark options of the single-GPU end-to-end comparison, one per line
  calibration.py simulated --gpu h100|b200 --calibrate BIN --bench BIN --out FILE
      runs railyard_calibrate (the microkernels) and railyard_bench_ep (the end-to-end
      run) in the timed simulator and writes the SIMULATED reference (FILE)
  calibration.py check --reference FILE --gpu ... --calibrate BIN --bench BIN
      regenerates the reference and fails when a figure moved by more than 2 %
      (microkernels) or 5 % (end to end: dispatch varies from run to run)
  calibration.py report --simulated FILE --measured FILE [--measured-bench FILE]
                        --doc docs/performance-model.md [--command TEXT]
      writes the table of measured / simulated between the doc's gpu-calibrate markers

The references live in docs/calibration/simulated-<gpu>.json, so that a machine with a
GPU but no simulator (no Boost.Context) still has the simulated side
(scripts/gpu-calibrate.sh).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# The end-to-end comparison: the seed configuration's row size and routing on one GPU
# (its 16 experts all local), every token through the real kernels. Small enough for
# the simulator to run in seconds, large enough for a GPU's events to resolve.
E2E_ARGS = ["--ranks", "1", "--experts-per-rank", "16", "--tokens", "512", "--sim-full",
            "--sms-sweep", "8,16", "--layout", "both", "--host-overhead-iters", "0"]
BEGIN = "<!-- gpu-calibrate: begin"
END = "<!-- gpu-calibrate: end -->"
FIGURE_TOLERANCE, E2E_TOLERANCE = 0.02, 0.05


def run_json(cmd):
    """Runs cmd (which takes --json FILE) and returns the JSON it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        proc = subprocess.run(cmd + ["--json", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            sys.exit(f"calibration.py: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-4000:]}")
        with open(path) as f:
            return json.load(f)


def op_key(op):
    return f"{op['op']} [{op['layout']}]"


def simulated(gpu, calibrate, bench):
    figures = run_json([calibrate, "--gpu", gpu])
    run = run_json([bench, "--sim-gpu", gpu] + E2E_ARGS)
    if not run["ok"]:
        sys.exit("calibration.py: the end-to-end run failed its checks")
    e2e = [{"op": op_key(op), "sms": row["sms"], "sim_time_us": row["sim_time_us"]}
           for op in run["ops"] for row in op["simulated"]]
    return {"kind": figures["kind"], "preset": gpu, "device": figures["device"], "figures": figures["figures"],
            "end_to_end": {"args": E2E_ARGS, "ops": e2e}}


def compare(reference, fresh):
    """The figures of `fresh` that moved from `reference` beyond the tolerance."""
    bad = []
    pairs = [(f"figure {a['name']}", a["value"], b["value"], FIGURE_TOLERANCE)
             for a, b in zip(reference["figures"], fresh["figures"])]
    pairs += [(f"end to end {a['op']} at {a['sms']} SMs", a["sim_time_us"], b["sim_time_us"], E2E_TOLERANCE)
              for a, b in zip(reference["end_to_end"]["ops"], fresh["end_to_end"]["ops"])]
    if [f["name"] for f in reference["figures"]] != [f["name"] for f in fresh["figures"]] or \
            [(o["op"], o["sms"]) for o in reference["end_to_end"]["ops"]] != \
            [(o["op"], o["sms"]) for o in fresh["end_to_end"]["ops"]]:
        bad.append("the list of figures or operations changed")
    for what, ref, now, tol in pairs:
        if abs(now - ref) > tol * abs(ref):
            bad.append(f"{what}: reference {ref:.4g}, now {now:.4g} (tolerance {100 * tol:.0f} %)")
    return bad


def ratio(measured, simulated):
    return f"{measured / simulated:.2f}" if measured is not None and simulated else "-"


def fmt(v):
    return "-" if v is None else (f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}")


def table(sim, measured, bench, command):
    if not measured["kind"].startswith("MEASURED"):
        sys.exit(f"calibration.py: --measured is not a measurement (kind: {measured['kind']!r})")
    got = {f["name"]: f["value"] for f in measured["figures"]}
    lines = [f"{BEGIN} (scripts/gpu-calibrate.sh writes this section; do not edit by hand) -->", "",
             f"MEASURED on {measured['device']} (compute capability {measured['compute_capability']}) by "
             f"`{command}`, against the {sim['preset'].upper()} preset's SIMULATED figures "
             f"(docs/calibration/simulated-{sim['preset']}.json).", "",
             "| figure | unit | preset constant | SIMULATED | MEASURED | measured / simulated |",
             "| --- | --- | --- | --- | --- | --- |"]
    for f in sim["figures"]:
        m = got.get(f["name"])
        lines.append(f"| {f['name']} | {f['unit']} | {fmt(f.get('constant'))} | {fmt(f['value'])} | {fmt(m)} | "
                     f"{ratio(m, f['value'])} |")
    for s in measured.get("skipped", []):
        lines.append(f"\nNot measured: {s}.")
    if bench is not None:
        points = {}
        for op in bench["ops"]:
            for p in op.get("measured", {}).get("points", []):
                points[(op_key(op), p["sms"])] = p["time_us"]["median"]
        lines += ["", f"End to end, one GPU (`railyard_bench_ep_cuda {' '.join(sim['end_to_end']['args'])}`; "
                  "median of the benchmark's iterations):", "",
                  "| operation | SMs | SIMULATED us | MEASURED us | measured / simulated |", "| --- | --- | --- | --- | --- |"]
        for o in sim["end_to_end"]["ops"]:
            m = points.get((o["op"], o["sms"]))
            lines.append(f"| {o['op']} | {o['sms']} | {o['sim_time_us']:.1f} | {fmt(m)} | {ratio(m, o['sim_time_us'])} |")
    lines += ["", END]
    return "\n".join(lines)


def write_report(doc, text):
    with open(doc) as f:
        content = f.read()
    begin, end = content.find(BEGIN), content.find(END)
    if begin < 0 or end < begin:
        sys.exit(f"calibration.py: {doc} has no '{BEGIN} ... {END}' section")
    with open(doc, "w") as f:
        f.write(content[:begin] + text + content[end + len(END):])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("e2e-args")
    for name in ("simulated", "check"):
        s = sub.add_parser(name)
        s.add_argument("--gpu", choices=["h100", "b200"], required=True)
        s.add_argument("--calibrate", required=True)
        s.add_argument("--bench", required=True)
        s.add_argument("--out" if name == "simulated" else "--reference", required=True)
    r = sub.add_parser("report")
    r.add_argument("--simulated", required=True)
    r.add_argument("--measured", required=True)
    r.add_argument("--measured-bench")
    r.add_argument("--doc", required=True)
    r.add_argument("--command", default="bash scripts/gpu-calibrate.sh")
    a = ap.parse_args()

    if a.cmd == "e2e-args":
        print("\n".join(E2E_ARGS))
    elif a.cmd == "simulated":
        with open(a.out, "w") as f:
            json.dump(simulated(a.gpu, a.calibrate, a.bench), f, indent=1)
            f.write("\n")
    elif a.cmd == "check":
        with open(a.reference) as f:
            reference = json.load(f)
        bad = compare(reference, simulated(a.gpu, a.calibrate, a.bench))
        if bad:
            sys.exit(f"calibration.py: {a.reference} is out of date (regenerate it with `calibration.py simulated`):\n  "
                     + "\n  ".join(bad))
        print(f"{a.reference}: current")
    else:
        with open(a.simulated) as f:
            sim = json.load(f)
        with open(a.measured) as f:
            measured = json.load(f)
        bench = None
        if a.measured_bench:
            with open(a.measured_bench) as f:
                bench = json.load(f)
        write_report(a.doc, table(sim, measured, bench, a.command))
        print(f"calibration.py: measured / simulated written into {a.doc}")


if __name__ == "__main__":
    main()
