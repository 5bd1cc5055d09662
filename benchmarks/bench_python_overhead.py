"""Host-side overhead of railyard's Python layer per call, measured on the CPU.

Times Buffer.dispatch_with_permute / combine_with_unpermute / dispatch / combine with
the operators replaced by stubs that return ready-made outputs, so what is measured is
exactly the Python work around torch.ops.railyard.* (argument forms, autograd
decision, result and handle construction) — the part a GPU run pays on top of the
C++ op. The ops themselves run on a simulated GPU here, whose time says nothing
about a GPU, so they are not timed.

    python benchmarks/bench_python_overhead.py [--iters N] [--json FILE]
"""
import argparse
import json
import statistics
import sys
import time

import torch

import railyard
import railyard._buffer as rb
import railyard.sim

H, T, EL = 256, 16, 2


def measure(iters):
    def fn(group):
        buf = railyard.Buffer(group, H, T, EL)
        E = group.size() * EL
        x = torch.randn(T, H).to(torch.bfloat16)
        routing_map = torch.zeros(T, E, dtype=torch.bool)
        routing_map[:, 0] = True
        probs = routing_map.float()
        topk_idx = torch.zeros(T, 1, dtype=torch.int64)
        topk_weights = torch.ones(T, 1)
        # Real outputs once, then stubs that hand them back.
        permuted = buf.dispatch_with_permute(x, routing_map=routing_map, probs=probs)
        received = buf.dispatch(x, topk_idx=topk_idx, topk_weights=topk_weights)
        y = buf.combine_with_unpermute(permuted.hidden, handle=permuted.handle)
        real_dispatch, real_combine = rb._dispatch_op, rb._combine_op
        canned = {}

        def dispatch_stub(buffer_id, hidden, scales, topk_idx, topk_weights, routing_map, probs, token, layout, *rest):
            return canned[layout]

        def combine_stub(*args):
            return y.hidden, torch.empty(0)

        canned[rb.EXPERT_GROUPED] = real_dispatch(buf.id, x, None, None, None, routing_map, probs, None,
                                                  rb.EXPERT_GROUPED, 1, None, 0)
        canned[rb.RECEIVED] = real_dispatch(buf.id, x, None, topk_idx, topk_weights, None, None, None,
                                            rb.RECEIVED, 1, None, 0)
        calls = {
            "dispatch_with_permute": lambda: buf.dispatch_with_permute(x, routing_map=routing_map, probs=probs),
            "combine_with_unpermute": lambda: buf.combine_with_unpermute(permuted.hidden, handle=permuted.handle),
            "dispatch": lambda: buf.dispatch(x, topk_idx=topk_idx, topk_weights=topk_weights),
            "combine": lambda: buf.combine(received.hidden, handle=received.handle),
        }
        rb._dispatch_op, rb._combine_op = dispatch_stub, combine_stub
        try:
            out = {}
            for name, call in calls.items():
                for _ in range(min(iters, 100)):
                    call()
                samples = []
                for _ in range(iters):
                    t0 = time.perf_counter_ns()
                    call()
                    samples.append((time.perf_counter_ns() - t0) / 1000.0)
                samples.sort()
                out[name] = {"median_us": statistics.median(samples), "p10_us": samples[len(samples) // 10],
                             "p90_us": samples[len(samples) * 9 // 10]}
        finally:
            rb._dispatch_op, rb._combine_op = real_dispatch, real_combine
        return out

    return railyard.sim.run(world_size=1, fn=fn)[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = measure(args.iters)
    print("railyard Python-layer overhead per call (CPU, ops stubbed; a host-side cost, not a GPU time)")
    for name, r in results.items():
        print(f"  {name:24s} median {r['median_us']:7.1f} us   p10 {r['p10_us']:7.1f}   p90 {r['p90_us']:7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"what": "python layer overhead per call, ops stubbed", "unit": "microseconds",
                       "torch": torch.__version__, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
