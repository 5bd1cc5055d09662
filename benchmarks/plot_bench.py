#!/usr/bin/env python3
"""Plot bandwidth against SM count from the JSON of railyard_bench_ep or bench_ep.py (--json FILE).

    python3 benchmarks/plot_bench.py results.json [-o bench.png]

One panel per bandwidth (algbw, NVLink busbw per GPU), one line per operation and
source. MEASURED points (GPU runs) are solid lines with markers; SIMULATED points (the
simulator's timed mode, at the simulated token count) are dash-dotted and labelled
"SIMULATED"; MODEL estimates (docs/performance-model.md) are dashed and labelled "MODEL". The links' per-direction
bandwidths are drawn as horizontal lines on the busbw panel. Needs matplotlib.
"""
import argparse
import json
import sys


def series(results):
    """(label, kind, sms list, algbw list, busbw list) for every measured, simulated or modelled op."""
    out = []
    for op in results["ops"]:
        name = f'{op["op"]} [{op["layout"]}, {op["dtype"]}]'
        measured = op.get("measured")
        if measured:
            pts = measured["points"]
            out.append((f"{name} MEASURED", "measured", [p["sms"] for p in pts],
                        [p["algbw_gbps"] for p in pts], [p["busbw_gbps"] for p in pts]))
        simulated = op.get("simulated")
        if simulated:
            out.append((f'{name} H100 SIMULATED ({simulated[0]["tokens_per_rank"]} tokens/rank)', "simulated",
                        [p["sms"] for p in simulated], [p["sim_algbw_gbps"] for p in simulated],
                        [p["sim_busbw_gbps"] for p in simulated]))
        model = op.get("model")
        if model:
            for gpu in model["gpus"]:
                pts = gpu["points"]
                out.append((f'{name} {gpu["gpu"]} MODEL', "model", [p["sms"] for p in pts],
                            [p["model_algbw_gbps"] for p in pts], [p["model_busbw_gbps"] for p in pts]))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", help="railyard_bench_ep or bench_ep.py --json output")
    parser.add_argument("-o", "--output", default="bench_ep.png", help="PNG to write (default bench_ep.png)")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        results = json.load(f)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = series(results)
    if not lines:
        print("plot_bench.py: no modelled or measured operation in", args.json, file=sys.stderr)
        return 1
    par = results["parameters"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    for ax, idx, title in ((axes[0], 3, "algbw (received rows incl. own / time)"),
                           (axes[1], 4, "NVLink busbw per GPU (rows from other ranks / time)")):
        for label, kind, sms, algbw, busbw in lines:
            ys = algbw if idx == 3 else busbw
            if kind == "measured":
                ax.plot(sms, ys, marker="o", linestyle="-", label=label)
            elif kind == "simulated":
                ax.plot(sms, ys, marker="s", linestyle="-.", label=label)
            else:
                ax.plot(sms, ys, marker=".", linestyle="--", alpha=0.8, label=label)
        if idx == 4:
            for gbps, name in ((450, "H100 NVLink4 450 GB/s"), (900, "B200 NVLink5 900 GB/s")):
                ax.axhline(gbps, color="grey", linewidth=0.8, linestyle=":")
                ax.text(1, gbps, " " + name, va="bottom", fontsize=8, color="grey")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("SMs (blocks) per operation")
        ax.set_ylabel("GB/s")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower right")
    source = ("MEASURED on GPUs" if results.get("gpu_measurement")
              else "SIMULATED (timed simulator) and MODEL (roofline) estimates, no GPU")
    fig.suptitle(f'{results.get("benchmark", "railyard_bench_ep")}, preset {par["preset"]}: {par["ranks"]} ranks, hidden {par["hidden"]}, '
                 f'{par["tokens_per_rank"]} tokens/rank, top-{par["topk"]} of {par["experts"]}, {par["dtype"]} '
                 f'dispatch; {source}', fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print("plot_bench.py: wrote", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
