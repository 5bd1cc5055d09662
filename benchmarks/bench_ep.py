#!/usr/bin/env python3
"""bench_ep.py: Railyard's dispatch/combine bandwidth benchmark through the PyTorch ops.

    torchrun --nproc-per-node 8 benchmarks/bench_ep.py [--preset seed|deepep] [options]   # GPUs
    python benchmarks/bench_ep.py [options]                                               # no GPU

The Python twin of railyard_bench_ep (benchmarks/bench_ep.cpp): the same presets,
options, definitions, JSON layout and kinds (MEASURED / SIMULATED / MODEL), and the same code for
the routing, the counted bytes, the NVLink minimum and the performance model, which it
calls through the binding railyard._bench (benchmarks/bench_bindings.cpp).

- GPUs (CUDA available, Railyard's CUDA flavour installed, launched by torchrun): one
  process per GPU over an NCCL process group, one railyard.Buffer per rank; per layout
  and SM count, --warmup untimed and --iters timed calls of dispatch (on the first
  call's handle) and combine, each bracketed by CUDA events; per iteration the slowest
  rank's time (all_reduce MAX); median and spread; algbw and busbw.
- No GPU: the same entry point runs every operation once on Railyard's CPU simulator
  (railyard.sim.run, --ranks simulated H100s or B200s (--sim-gpu) in this one process), checks every output
  against closed forms computed here from the routing, compares the NVLink bytes of
  every link (railyard.sim.traffic()) with the minimum, runs every operation again in
  the simulator's timed mode per SM count (railyard.sim.run(timed=True): SIMULATED times
  and bandwidths), and prints a roofline MODEL of H100 and B200 as an upper bound. Its
  first line says so.

docs/benchmarks.md says what every number means.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time

import torch

import railyard
import railyard._bench as rb

_HERE = os.path.dirname(os.path.abspath(__file__))
LAYOUTS = {"received": ["received"], "grouped": ["grouped"], "both": ["received", "grouped"]}
API = {("dispatch", "received"): "Buffer.dispatch", ("combine", "received"): "Buffer.combine",
       ("dispatch", "grouped"): "Buffer.dispatch_with_permute",
       ("combine", "grouped"): "Buffer.combine_with_unpermute"}
MODEL_KIND = "MODEL estimate (not a measurement), docs/performance-model.md"
FP8_BLOCK = 128


# ---------------------------------------------------------------------------- options
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=["seed", "seed-4x8", "deepep"], default="seed",
                    help="seed: hidden 8192, BF16, 4096 tokens/rank, 2 experts/rank, top-8, 8 ranks (default); "
                         "deepep: hidden 7168, FP8, 4096 tokens/rank, 256 experts (32/rank), top-8, 8 ranks")
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--tokens", type=int, help="tokens per rank")
    ap.add_argument("--ranks", type=int, help="simulator: simulated GPUs (GPUs: torchrun's WORLD_SIZE)")
    ap.add_argument("--domains", type=int,
                    help="NVLink domains the ranks form (ranks / domains each), joined by RDMA between rail peers")
    ap.add_argument("--experts-per-rank", type=int)
    ap.add_argument("--topk", type=int)
    ap.add_argument("--dtype", choices=["bf16", "fp8"], help="dispatch dtype; combine is always BF16")
    ap.add_argument("--skew", type=float, help="Zipf exponent of expert popularity; 0: uniform")
    ap.add_argument("--sms", type=int, help="one SM (block) count; in the simulator also the blocks it runs with")
    ap.add_argument("--sms-sweep", help="SM counts to time (GPU) or to model (simulator), e.g. 1,2,4,8,16,32")
    ap.add_argument("--layout", choices=list(LAYOUTS), default="both")
    ap.add_argument("--pad-multiple", type=int, default=1)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write every parameter, definition and result here")
    ap.add_argument("--png", help="draw bandwidth against SMs here (benchmarks/plot_bench.py; needs matplotlib)")
    ap.add_argument("--sim-tokens", type=int, default=128, help="simulator: tokens per rank it runs (capped at --tokens)")
    ap.add_argument("--sim-full", action="store_true", help="simulator: run --tokens itself (slow)")
    ap.add_argument("--sim", action="store_true", help="run the simulator even where GPUs are available")
    ap.add_argument("--no-sim-timed", action="store_true",
                    help="simulator: skip the timed runs (SIMULATED time per SM count)")
    ap.add_argument("--sim-gpu", choices=["h100", "b200"], default="h100",
                    help="simulator: the simulated GPUs' preset (the timed mode's cost model)")
    ap.add_argument("--preemption", type=float, default=0.25, help="simulator: the scheduler's switch probability")
    ap.add_argument("--host-overhead-iters", type=int, default=1000,
                    help="calls per method of the Python-layer overhead microbenchmark (0 skips it)")
    ap.add_argument("--no-overhead", action="store_true", help="skip the host-overhead microbenchmark")
    ap.add_argument("--model-fixed-us", type=float, default=0.0)
    ap.add_argument("--model-token-latency-us", type=float, default=0.0)
    return ap.parse_args(argv)


def make_params(a):
    """The preset, then every option over it (as railyard_bench_ep does); None on a bad value."""
    p = rb.preset(a.preset)
    for name in ("hidden", "tokens", "ranks", "domains", "experts_per_rank", "topk", "dtype", "skew"):
        if getattr(a, name) is not None:
            setattr(p, name, getattr(a, name))
    if a.sms is not None:
        p.sms, p.sim_sms = [a.sms], a.sms
    elif a.sms_sweep:
        try:
            p.sms = [int(s) for s in a.sms_sweep.split(",")]
        except ValueError:
            return None
    p.layouts, p.pad_multiple, p.iters, p.warmup, p.seed = LAYOUTS[a.layout], a.pad_multiple, a.iters, a.warmup, a.seed
    p.sim_tokens, p.sim_full, p.preemption, p.sim_timed = a.sim_tokens, a.sim_full, a.preemption, not a.no_sim_timed
    p.sim_gpu = a.sim_gpu
    p.host_overhead_iters = 0 if a.no_overhead else a.host_overhead_iters
    p.model_fixed_us, p.model_token_latency_us = a.model_fixed_us, a.model_token_latency_us
    fp8 = p.dtype == "fp8"
    ok = (p.hidden > 0 and p.hidden % 8 == 0 and (not fp8 or p.hidden % FP8_BLOCK == 0) and p.tokens >= 0 and
          p.sim_tokens >= 0 and 1 <= p.ranks <= 72 and 1 <= p.domains <= 64 and p.ranks % p.domains == 0
          and p.experts_per_rank >= 1 and 1 <= p.topk <= p.num_experts()
          and p.skew >= 0 and p.pad_multiple >= 1 and p.iters >= 1 and p.warmup >= 0 and 0 < p.preemption <= 1
          and p.model_fixed_us >= 0 and p.model_token_latency_us >= 0 and p.sms and min(p.sms) >= 1)
    return p if ok else None


def config_line(p, tokens):
    routing = "uniform random" if p.skew == 0 else "Zipf over experts"
    domains = f" ({p.domains} NVLink domain{'s' if p.domains > 1 else ''} of {p.ranks_per_domain()})"
    return (f"preset {p.preset}: {p.ranks} ranks{domains}, hidden {p.hidden}, {p.dtype.upper()} dispatch, {tokens} tokens/rank, "
            f"{p.num_experts()} experts ({p.experts_per_rank}/rank), top-{p.topk}, routing {routing} "
            f"(skew {p.skew:g}), pad multiple {p.pad_multiple}")


def print_definitions():
    d = rb.definitions
    print(f"\ndefinitions (docs/benchmarks.md):\n  {d['algbw']}\n  {d['busbw']}\n  {d['time']}", flush=True)


# ---------------------------------------------------------------------------- workload
def routing_tensors(routing, tokens, topk, device="cpu"):
    """One rank's routing (railyard._bench.Routing) as (topk_idx int64 [T, K], weights fp32 [T, K])."""
    idx, w = _from_bytes(routing.topk_idx_bytes(), torch.int64), _from_bytes(routing.topk_weights_bytes(), torch.float32)
    return idx.view(tokens, topk).to(device), w.view(tokens, topk).to(device)


def _from_bytes(data, dtype):
    return torch.frombuffer(bytearray(data), dtype=dtype) if data else torch.empty(0, dtype=dtype)


def counted_from_routing(p, routing, tokens):
    """The pair counts of every rank's routing, and the bytes the definitions count per
    rank, by op (docs/benchmarks.md "Definitions"; bench_workload.cpp)."""
    pairs = rb.count_pairs(p, routing, tokens)
    return pairs, {op: rb.counted_bytes(p, pairs, op) for op in ("dispatch", "combine")}


def workload(p, tokens):
    """Every rank's routing (railyard_bench_ep's for this seed) with counted_from_routing's."""
    routing = rb.make_routing(p, tokens, p.seed)
    return (routing,) + counted_from_routing(p, routing, tokens)


def quantize_fp8(x):
    """bf16 [T, H] -> (e4m3 codes [T, H], fp32 scales [T, H/128]): one scale per 128 elements."""
    T, H = x.shape
    xf = x.float().view(T, H // FP8_BLOCK, FP8_BLOCK)
    scale = (xf.abs().amax(-1, keepdim=True) / 448.0).clamp(min=1e-8)
    return (xf / scale).to(torch.float8_e4m3fn).view(T, H), scale.view(T, H // FP8_BLOCK).contiguous()


def dequantize_fp8(codes, scales):
    """What an expert would compute on: code x its block's scale, rounded to BF16."""
    N, H = codes.shape
    return (codes.float().view(N, H // FP8_BLOCK, FP8_BLOCK) * scales.view(N, -1, 1)).view(N, H).to(torch.bfloat16)


# ---------------------------------------------------------------------------- closed forms
def expected_outputs(p, inputs, layout):
    """What every rank's dispatch and combine must return, in closed form from the
    routing (docs/semantics.md), independent of the kernels and of any reference code:
      received: rank d gets one row per (source s, token t) with >= 1 expert on d, in
        (s, t) order: the token's bytes (codes and scales for FP8), its probs at its local
        experts, routing map, src_rank, src_token;
      grouped: for local expert j ascending, the received rows routed to j, zero rows up
        to a multiple of pad_multiple; probs of that expert;
      combine of the expert outputs y (the rows themselves, dequantized for FP8): a
        token's rows summed in fp32, rounded once to BF16 (received). Every row of a token
        holds the same value v, so that is bf16(n v) with n its ranks (exact in fp32 for
        BF16 v); grouped first sums a rank's e copies (its experts there) and rounds:
        bf16(sum over ranks of bf16(e_d v)). Across NVLink domains each domain's partial
        is rounded to BF16 first, and the partials summed in domain order."""
    R, El = p.ranks, p.experts_per_rank
    E, fp8 = p.num_experts(), p.dtype == "fp8"
    dense = []  # per source: chosen [T, E] bool, weight [T, E]
    for x, codes, scales, idx, w in inputs:
        T = idx.shape[0]
        valid = idx >= 0
        chosen = torch.zeros(T, E, dtype=torch.bool)
        weight = torch.zeros(T, E, dtype=torch.float32)
        chosen.scatter_(1, idx.clamp(min=0), valid)
        weight.scatter_(1, idx.clamp(min=0), torch.where(valid, w, torch.zeros_like(w)))
        dense.append((chosen, weight))
    values = [dequantize_fp8(codes, scales) if fp8 else x for x, codes, scales, _, _ in inputs]
    out = []
    for d in range(R):
        cols = slice(d * El, (d + 1) * El)
        parts = {k: [] for k in ("hidden", "scales", "probs", "map", "src_rank", "src_token", "y")}
        for s, (x, codes, scales, idx, w) in enumerate(inputs):
            chosen, weight = dense[s]
            on = chosen[:, cols].any(1)
            parts["hidden"].append((codes.view(torch.uint8) if fp8 else x)[on])  # FP8: the codes' bytes
            parts["scales"].append(scales[on] if fp8 else torch.empty(0, 0))
            parts["probs"].append(weight[on][:, cols])
            parts["map"].append(chosen[on][:, cols])
            parts["src_rank"].append(torch.full((int(on.sum()),), s, dtype=torch.int32))
            parts["src_token"].append(torch.nonzero(on).flatten().to(torch.int32))
            parts["y"].append(values[s][on])
        rc = {k: torch.cat(v) for k, v in parts.items()}
        counts = rc["map"].sum(0).to(torch.int64)
        if layout == "received":
            rc["tokens_per_expert"] = counts
            out.append(rc)
            continue
        order, padded = [], []
        for j in range(El):
            rows = torch.nonzero(rc["map"][:, j]).flatten()
            n = rows.numel()
            pad = -(-n // p.pad_multiple) * p.pad_multiple
            order.append(torch.cat([rows, torch.full((pad - n,), -1, dtype=torch.int64)]))
            padded.append(pad)
        order = torch.cat(order) if order else torch.empty(0, dtype=torch.int64)
        expert = torch.cat([torch.full((n,), j, dtype=torch.int64) for j, n in enumerate(padded)])
        real, src = order >= 0, order.clamp(min=0)
        g = {"tokens_per_expert": torch.tensor(padded, dtype=torch.int64)}
        for key in ("hidden", "y", "scales") if fp8 else ("hidden", "y"):
            t = torch.zeros((order.numel(),) + tuple(rc[key].shape[1:]), dtype=rc[key].dtype)
            t[real] = rc[key][src[real]]
            g[key] = t
        g["probs"] = torch.where(real, rc["probs"][src, expert], torch.zeros(()))
        out.append(g)
    # combine: per source token, over destination ranks in order
    combined = []
    for s, (x, codes, scales, idx, w) in enumerate(inputs):
        chosen, _ = dense[s]
        per_rank = chosen.view(chosen.shape[0], R, El).sum(2)  # [T, R]: the token's experts on each rank
        v = values[s].float()
        # Each NVLink domain's partial is rounded to BF16, then the partials are summed in
        # fp32 in domain order and rounded once (docs/semantics.md 7; one domain: bf16(n v)).
        acc = torch.zeros_like(v)
        Rd = p.ranks_per_domain()
        for dom in range(p.domains):
            ranks = per_rank[:, dom * Rd:(dom + 1) * Rd]
            if layout == "received":
                partial = v * (ranks > 0).sum(1, keepdim=True).float()
            else:
                partial = torch.zeros_like(v)
                for d in range(Rd):
                    partial += (v * ranks[:, d:d + 1].float()).to(torch.bfloat16).float()
            acc += partial.to(torch.bfloat16).float()
        combined.append(acc.to(torch.bfloat16))
    return out, combined


def count_diff(got, want):
    """Elements of `got` that differ bitwise from `want`; a shape difference counts."""
    if got is None or want is None:
        return 0 if got is None and want is None else 1
    got, want = got.detach().cpu().contiguous(), want.contiguous()
    if got.shape != want.shape:
        return 1 + abs(got.numel() - want.numel())
    if got.dtype != want.dtype:
        return got.numel()
    if got.dtype == torch.bool:
        return int((got != want).sum())
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    return int((got.view(bits) != want.view(bits)).sum())


def check_dispatch(p, res, want, layout):
    fp8 = p.dtype == "fp8"
    bad = count_diff(res.hidden.view(torch.uint8) if fp8 else res.hidden, want["hidden"])
    if fp8:
        bad += count_diff(res.scaling_factor, want["scales"])
    bad += count_diff(res.probs, want["probs"])
    bad += count_diff(res.tokens_per_expert, want["tokens_per_expert"])
    if layout == "received":
        bad += count_diff(res.routing_map, want["map"])
        bad += count_diff(res.src_rank, want["src_rank"])
        bad += count_diff(res.src_token, want["src_token"])
    return bad


def checked_what(p, op, layout):
    if op == "combine":
        return ("every rank's [T, H] BF16 output, bit for bit, against the closed form from the routing "
                f"({API[(op, layout)]})")
    fields = "rows" + (", scales" if p.dtype == "fp8" else "") + \
        (", probs, tokens_per_expert" if layout == "grouped" else
         ", probs, routing map, src_rank, src_token, tokens_per_expert")
    return f"every rank's {fields}, bit for bit, against the closed form from the routing ({API[(op, layout)]})"


# ---------------------------------------------------------------------------- simulator run
def _barrier_of(group):
    """A barrier over the simulated ranks: an allgather on a bootstrap of the group (it
    lets the simulator run kernels while a rank waits, which a Python lock would not)."""
    from railyard import _flavours

    boot = group._railyard_bootstrap()
    return lambda: _flavours.sim.bootstrap_allgather(boot, b"\0")


def _pair_matrices(traffic, R):
    n = traffic["num_devices"]
    at = lambda v, x, y: v[x * (n + 1) + y + 1]  # noqa: E731  ([device][owner + 1], owner -1: host)
    written = [[0 if x == y else at(traffic["write_bytes"], x, y) for y in range(R)] for x in range(R)]
    read = [[0 if x == y else at(traffic["read_bytes"], x, y) for y in range(R)] for x in range(R)]
    nic = [[traffic["nic_bytes"][x * n + y] for y in range(R)] for x in range(R)]
    return written, read, nic


def sim_tokens(p):
    """Tokens per rank the simulator runs."""
    return p.tokens if p.sim_full else min(p.sim_tokens, p.tokens)


def _simulate(p, T, inputs, expected, sms, timed):
    """One run of every operation (per layout: dispatch (first call), dispatch on its
    handle, combine) with `sms` blocks, each checked and in its own traffic window; timed:
    in the timed mode, each op from a common start (every rank's stream waits for every
    other's), its SIMULATED time the slowest rank's. Returns (windows, mismatches per rank)."""
    import railyard.sim

    R, H, K, El = p.ranks, p.hidden, p.topk, p.experts_per_rank
    fp8 = p.dtype == "fp8"
    windows = []  # per op, filled by rank 0: dict seconds, written, read, busy, and time_us when timed
    times = [[0.0] * R for _ in range(3 * len(p.layouts))]

    def fn(group):
        rank = group.rank()
        barrier = _barrier_of(group)
        x, codes, scales, idx, w = inputs[rank]
        hidden = codes if fp8 else x
        buf = railyard.Buffer(group, H, max(T, 1), El, use_fp8=fp8, num_sms_dispatch=sms, num_sms_combine=sms,
                              max_top_k=K)
        mismatches = []
        op_index = itertools.count()

        def window(op):
            n = next(op_index)
            barrier()
            if rank == 0:
                railyard.sim.reset_traffic()
                t0 = time.perf_counter()
            barrier()
            if timed:
                for ready in group.all_gather_object(railyard.sim.record_event()):
                    railyard.sim.wait_event(ready)
                start = railyard.sim.record_event()
            result = op()
            if timed:
                stop = railyard.sim.record_event()
                # Every rank's operation is enqueued before any host waits (which runs the
                # simulated devices; a host thread has no clock), as in railyard_bench_ep.
                barrier()
                times[n][rank] = railyard.sim.elapsed_us(start, stop)
            barrier()
            if rank == 0:
                written, read, nic = _pair_matrices(railyard.sim.traffic(), R)
                windows.append({"seconds": time.perf_counter() - t0, "written": written, "read": read, "nic": nic,
                                "busy": railyard.sim.busy_time()})
            barrier()
            return result

        for layout in p.layouts:
            want, combined = expected[layout][0][rank], expected[layout][1][rank]
            if layout == "received":
                first = window(lambda: buf.dispatch(hidden, topk_idx=idx, topk_weights=w, scaling_factor=scales))
                again = window(lambda: buf.dispatch(hidden, scaling_factor=scales, handle=first.handle))
                out = window(lambda: buf.combine(want["y"], handle=first.handle))
            else:
                first = window(lambda: buf.dispatch_with_permute(hidden, topk_idx=idx, topk_weights=w,
                                                                 scaling_factor=scales, pad_multiple=p.pad_multiple))
                again = window(lambda: buf.dispatch_with_permute(hidden, scaling_factor=scales, handle=first.handle))
                out = window(lambda: buf.combine_with_unpermute(want["y"], handle=first.handle))
            mismatches += [check_dispatch(p, first, want, layout), check_dispatch(p, again, want, layout),
                           count_diff(out.hidden, combined)]
        buf.destroy()
        return mismatches

    # timeout: how long a rank may wait at a barrier for the others' operation (--sim-full is slow)
    per_rank = railyard.sim.run(world_size=R, fn=fn, ranks_per_domain=p.ranks_per_domain(), seed=p.seed, device=p.sim_gpu,
                                preemption=p.preemption, timeout=3600.0, timed=timed)
    for i, wnd in enumerate(windows):
        wnd["time_us"] = max(times[i])
    return windows, per_rank


def run_simulator(p):
    """Per layout: dispatch (first call), dispatch on its handle, combine; each checked,
    each in its own traffic window; then, unless --no-sim-timed, each again in the timed
    mode per SM count up to rb.SIM_TIMED_MAX_SMS. Returns (run tokens, pairs, list of op dicts)."""
    R, T, H, K = p.ranks, sim_tokens(p), p.hidden, p.topk
    fp8 = p.dtype == "fp8"
    routing, pairs, counted = workload(p, T)
    inputs = []
    for r, rows in enumerate(rb.make_rows(p, T, p.seed)):
        x = _from_bytes(rows, torch.bfloat16).view(T, H)
        codes, scales = quantize_fp8(x) if fp8 else (None, None)
        idx, w = routing_tensors(routing[r], T, K)
        inputs.append((x, codes, scales, idx, w))
    expected = {layout: expected_outputs(p, inputs, layout) for layout in p.layouts}
    names = ["dispatch (first call)", "dispatch", "combine"]
    windows, per_rank = _simulate(p, T, inputs, expected, p.sim_sms, False)
    count_row = rb.count_row_bytes(p)
    ops = []
    for i, wnd in enumerate(windows):
        written, read = wnd["written"], wnd["read"]
        layout, k = p.layouts[i // 3], i % 3
        op = "combine" if k == 2 else "dispatch"
        minimum = rb.minimum_matrices(p, pairs, op, k == 0, count_row)
        polls = bad = 0
        for x in range(R):
            for y in range(R):
                if x == y:
                    continue
                w_, r_, mw, mr = written[x][y], read[x][y], minimum.written[x][y], minimum.read[x][y]
                # Dispatch writes exactly its minimum and reads nothing remote; combine reads its
                # minimum plus 8-byte re-polls of headers not ready yet, and writes only flags.
                ok = w_ == mw and (r_ == 0 if op == "dispatch" else r_ >= mr and (r_ - mr) % 8 == 0)
                polls += (r_ - mr) // 8 if op == "combine" and r_ >= mr else 0
                bad += not ok
        nic_min = rb.nic_minimum(p, pairs, op, k == 0, T)
        ops.append({"name": names[k], "op": op, "layout": layout, "modelled": k != 0, "counted": counted[op],
                    "mismatches": sum(m[i] for m in per_rank), "what": checked_what(p, op, layout),
                    "written": written, "read": read, "min_written": minimum.written, "min_read": minimum.read,
                    "polls": polls, "bad_pairs": bad, "sim_seconds": wnd["seconds"], "simulated": [],
                    "nic": [sum(row) for row in wnd["nic"]], "nic_min": [sum(row) for row in nic_min],
                    "bad_nics": sum(wnd["nic"][g] != nic_min[g] for g in range(R))})
    for sms in (s for s in p.sms if p.sim_timed and s <= min(rb.SIM_TIMED_MAX_SMS, rb.sim_block_limit(R))):
        timed, timed_per_rank = _simulate(p, T, inputs, expected, sms, True)
        for i, (o, wnd) in enumerate(zip(ops, timed)):
            t = wnd["time_us"]
            bound, busiest, share = rb.sim_bound(t, [list(device.items()) for device in wnd["busy"]])
            bad = sum(m[i] for m in timed_per_rank)
            o["mismatches"] += bad
            o["simulated"].append({
                "kind": rb.simulated_kind(p.sim_gpu), "sms": sms,
                "tokens_per_rank": T, "sim_time_us": t,
                "sim_algbw_gbps": o["counted"].algbw_mean() / (t * 1e3) if t > 0 else 0.0,
                "sim_busbw_gbps": o["counted"].busbw_mean() / (t * 1e3) if t > 0 else 0.0,
                "sim_bound": bound, "sim_busiest": busiest, "sim_busiest_fraction": share, "mismatches": bad})
            if p.domains > 1:
                o["simulated"][-1]["sim_nic_busbw_gbps"] = sum(o["nic"]) / R / (t * 1e3) if t > 0 else 0.0
    return T, pairs, ops


# ---------------------------------------------------------------------------- model
def model_op(p, written, read, counted, tokens):
    """The model (bench_model.cpp) on one op's per-pair bytes, per GPU and SM count."""
    bytes_ = rb.link_bytes_from_pairs(written, read)
    out = []
    for g in (rb.h100_model(), rb.b200_model()):
        g.fixed_us, g.token_latency_us = p.model_fixed_us, p.model_token_latency_us
        points = [rb.model_point(g, bytes_, s, counted.algbw_mean(), counted.busbw_mean(), tokens) for s in p.sms]
        out.append({"gpu": g, "fill": rb.sms_to_fill(g, bytes_, tokens), "points": points})
    return out


def print_model(title, models):
    print(f"  {title}")
    print(f"    {'SMs':>5}" + "".join(f" | {m['gpu'].name:<9} {'time us':>9} {'algbw':>9} {'busbw':>9} {'bound':>5}"
                                       for m in models))
    for i, pt0 in enumerate(models[0]["points"]):
        row = "".join(f" | {'MODEL':<9} {m['points'][i].time_us:9.1f} {m['points'][i].algbw_gbps:9.1f} "
                      f"{m['points'][i].busbw_gbps:9.1f} {m['points'][i].bound:>5}" for m in models)
        print(f"    {pt0.sms:>5}{row}")
    print("    SMs at which the link bounds the model:" + "".join(f" {m['gpu'].name} {m['fill']};" for m in models) +
          " (bandwidths in GB/s)")


def json_model(p, models, basis):
    return {"kind": MODEL_KIND, "bytes_basis": basis, "gpus": [
        {"gpu": m["gpu"].name, "link_gbps_per_direction": m["gpu"].link_gbps, "fill_sms": m["gpu"].fill_sms,
         "per_sm_gbps": m["gpu"].per_sm_gbps(), "sms_to_fill_link": m["fill"], "fixed_us": p.model_fixed_us,
         "token_latency_us": p.model_token_latency_us,
         "points": [{"sms": pt.sms, "model_time_us": pt.time_us, "model_link_us": pt.link_us,
                     "model_sm_us": pt.sm_us, "model_algbw_gbps": pt.algbw_gbps,
                     "model_busbw_gbps": pt.busbw_gbps, "bound": pt.bound} for pt in m["points"]]}
        for m in models]}


def spread_json(s):
    return {"median": s.median, "min": s.min, "p10": s.p10, "p90": s.p90, "max": s.max}


def counted_json(counted, tokens):
    # tokens_per_rank as a string, as railyard_bench_ep writes it
    return {"tokens_per_rank": str(tokens), "algbw": list(counted.algbw), "busbw": list(counted.busbw)}


def report_simulator(p, run_tokens, pairs, ops, doc):
    """Prints every op's check, traffic and model; fills doc['ops']; returns ok."""
    ok = True
    full_pairs = pairs if run_tokens == p.tokens else workload(p, p.tokens)[1]
    R = p.ranks
    for i, o in enumerate(ops):
        dtype = p.dtype if o["op"] == "dispatch" else "bf16"
        print(f"\n== {o['name']} [{o['layout']}], {dtype.upper()} ({API[(o['op'], o['layout'])]}) ==")
        ok &= o["mismatches"] == 0
        verdict = "OK" if o["mismatches"] == 0 else f"MISMATCH ({rb.with_commas(o['mismatches'])} elements)"
        print(f"  check: {o['what']}: {verdict}")
        moved = sum(map(sum, o["written"])) + sum(map(sum, o["read"]))
        minimum = sum(map(sum, o["min_written"])) + sum(map(sum, o["min_read"]))
        ok &= o["bad_pairs"] == 0
        excess = 100.0 * max(moved - minimum, 0) / minimum if minimum else 0.0
        print(f"  NVLink bytes (all {R * (p.ranks_per_domain() - 1)} links, railyard.sim.traffic()): {rb.with_commas(moved)}; minimum "
              f"{rb.with_commas(minimum)}; excess {excess:.4f}% ({rb.with_commas(o['polls'])} 8-byte header "
              f"re-polls); links off their minimum: {o['bad_pairs']}{'  <-- FAIL' if o['bad_pairs'] else ' (OK)'}")
        print(f"  simulator: {o['sim_seconds']:.2f} s CPU wall time (NOT GPU time)")
        entry = {"op": o["name"], "layout": o["layout"], "dtype": dtype, "modelled": o["modelled"],
                 "api": API[(o["op"], o["layout"])], "counted_bytes_per_rank": counted_json(o["counted"], run_tokens),
                 "check": {"what": o["what"], "mismatches": o["mismatches"]},
                 "simulator_traffic": {
                     "kind": "bytes counted by the simulator (railyard.sim.traffic())", "nvlink_bytes": moved,
                     "minimum_bytes": minimum, "header_repolls": o["polls"], "links_off_minimum": o["bad_pairs"],
                     "simulator_cpu_seconds": o["sim_seconds"],
                     "links": [{"executing": s, "owner": d, "written": o["written"][s][d], "read": o["read"][s][d],
                                "min_written": o["min_written"][s][d], "min_read": o["min_read"][s][d]}
                               for s in range(R) for d in range(R) if s != d]}}
        if p.domains > 1:
            ok &= o["bad_nics"] == 0
            print(f"  NIC bytes ({R} NICs, one per GPU, railyard.sim.traffic()): {rb.with_commas(sum(o['nic']))}; minimum "
                  f"{rb.with_commas(sum(o['nic_min']))}; NICs off their minimum: {o['bad_nics']}"
                  f"{'  <-- FAIL' if o['bad_nics'] else ' (OK)'}")
            entry.update({"nic_bytes": o["nic"], "nic_minimum_bytes": o["nic_min"], "nics_off_minimum": o["bad_nics"]})
        if o["op"] == "combine" and i >= 1:
            print_links(p, ops[i - 1], o, pairs)
        if o["simulated"]:
            print(f"  SIMULATED on simulated {p.sim_gpu.upper()}s (timed mode, {run_tokens} tokens/rank; NOT a measurement; us, GB/s):")
            print(f"    {'SMs':>5} {'time':>10} {'algbw':>9} {'busbw':>9} {'NIC busbw' if p.domains > 1 else '':>10}"
                  f"  {'bound':<10} busiest resource")
            for row in o["simulated"]:
                nic = f"{row['sim_nic_busbw_gbps']:10.2f}" if p.domains > 1 else f"{'':>10}"
                print(f"    {row['sms']:5d} {row['sim_time_us']:10.1f} {row['sim_algbw_gbps']:9.1f} "
                      f"{row['sim_busbw_gbps']:9.1f} {nic}  {row['sim_bound']:<10} {row['sim_busiest']} "
                      f"{100 * row['sim_busiest_fraction']:.0f}%" + ("  <-- outputs MISMATCH" if row["mismatches"] else ""))
            entry["simulated"] = o["simulated"]
        if o["modelled"] and p.domains > 1 and i == 1:
            print("  (no MODEL across domains: the roofline model is NVLink's; the SIMULATED rows include the NIC)")
        if o["modelled"] and p.domains == 1:
            m = rb.minimum_matrices(p, full_pairs, o["op"], False, rb.count_row_bytes(p))
            headline = model_op(p, m.written, m.read, rb.counted_bytes(p, full_pairs, o["op"]), p.tokens)
            print_model(f"MODEL estimate (not a measurement) for {p.tokens} tokens/rank, from the closed-form "
                        "minimum bytes of that routing:", headline)
            entry["model"] = json_model(p, headline, "closed-form minimum NVLink bytes of the routing at "
                                                     "tokens_per_rank")
            at_sim = model_op(p, o["written"], o["read"], o["counted"], run_tokens)
            if run_tokens != p.tokens:
                k = p.sms.index(p.sim_sms) if p.sim_sms in p.sms else 0
                print(f"  (the same model on the bytes the simulator counted at {run_tokens} tokens/rank: "
                      f"{at_sim[0]['gpu'].name} {at_sim[0]['points'][k].time_us:.1f} us, {at_sim[1]['gpu'].name} "
                      f"{at_sim[1]['points'][k].time_us:.1f} us at {p.sms[k]} SMs)")
            entry["model_at_simulated_size"] = json_model(p, at_sim, "NVLink bytes the simulator counted at "
                                                                     "tokens_per_rank_run")
        doc["ops"].append(entry)
    return ok


def print_links(p, dispatch, combine, pairs):
    """Every link inside a domain (none crosses one: checked with the others): dispatch
    bytes written s -> d and combine bytes home s read from d, each against its minimum."""
    R = p.ranks
    print("  NVLink bytes per link (railyard.sim.traffic(), one window per operation) against the minimum:")
    print(f"  {'s -> d':<7} {'tokens':>7} {'dispatch wrote':>14} {'minimum':>14} {'combine read':>14} {'minimum':>14} "
          f"{'polls':>6}")
    for s in range(R):
        for d in range(R):
            if s == d or s // p.ranks_per_domain() != d // p.ranks_per_domain():
                continue
            dw, dm = dispatch["written"][s][d], dispatch["min_written"][s][d]
            cr, cm = combine["read"][s][d], combine["min_read"][s][d]
            ok = dw == dm and dispatch["read"][s][d] == 0 and cr >= cm and (cr - cm) % 8 == 0 and \
                combine["written"][s][d] == combine["min_written"][s][d]
            print(f"  {s:2d} -> {d:<2d} {pairs.pair_tokens(s, d):7d} {rb.with_commas(dw):>14} {rb.with_commas(dm):>14} "
                  f"{rb.with_commas(cr):>14} {rb.with_commas(cm):>14} {(cr - cm) // 8 if cr >= cm else 0:6d}"
                  f"{'' if ok else '  <-- not the minimum'}")


# ---------------------------------------------------------------------------- GPU run
def run_gpu(p, rank, world, local_rank):
    """Times every op on the GPUs of this torchrun job (every rank takes part); returns the
    device name and the op dicts, whose times are already the slowest rank's."""
    import torch.distributed as dist

    dev = torch.device("cuda", local_rank)
    T, H, K, El, fp8 = p.tokens, p.hidden, p.topk, p.experts_per_rank, p.dtype == "fp8"
    routing, pairs, counted = workload(p, T)
    idx, w = routing_tensors(routing[rank], T, K, dev)
    # Row values do not change the bytes moved: random rows (FP8: their codes, scales 1).
    gen = torch.Generator(device=dev).manual_seed(p.seed * 7919 + 17 + rank)
    x = torch.empty(T, H, dtype=torch.bfloat16, device=dev).uniform_(-2, 2, generator=gen)
    hidden = x.to(torch.float8_e4m3fn) if fp8 else x
    scales = torch.ones(T, H // FP8_BLOCK, device=dev) if fp8 else None
    buf = railyard.Buffer(dist.group.WORLD, H, max(T, 1), El, use_fp8=fp8, max_top_k=K,
                          ranks_per_domain=p.ranks_per_domain() if p.domains > 1 else None)

    def time_op(call):
        for _ in range(p.warmup):
            call()
        torch.cuda.synchronize(dev)
        dist.barrier()
        start = [torch.cuda.Event(enable_timing=True) for _ in range(p.iters)]
        stop = [torch.cuda.Event(enable_timing=True) for _ in range(p.iters)]
        for i in range(p.iters):
            start[i].record()
            call()
            stop[i].record()
        torch.cuda.synchronize(dev)
        us = torch.tensor([1e3 * a.elapsed_time(b) for a, b in zip(start, stop)], dtype=torch.float64, device=dev)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)  # per iteration, the slowest rank
        return us.tolist()

    ops = []
    for layout in p.layouts:
        # The first call (metadata, count read-back, allocation) makes the handle; untimed.
        if layout == "received":
            first = buf.dispatch(hidden, topk_idx=idx, topk_weights=w, scaling_factor=scales)
            dispatch, combine = buf.dispatch, buf.combine
        else:
            first = buf.dispatch_with_permute(hidden, topk_idx=idx, topk_weights=w, scaling_factor=scales,
                                              pad_multiple=p.pad_multiple)
            dispatch, combine = buf.dispatch_with_permute, buf.combine_with_unpermute
        # Combine's input: BF16 expert outputs, the received rows themselves for BF16 (zeros for FP8).
        y = torch.zeros(first.hidden.shape, dtype=torch.bfloat16, device=dev) if fp8 else first.hidden
        times = {"dispatch": [], "combine": []}
        for s in p.sms:
            times["dispatch"].append(time_op(lambda: dispatch(hidden, scaling_factor=scales, handle=first.handle,
                                                              num_sms=s)))
            times["combine"].append(time_op(lambda: combine(y, handle=first.handle, num_sms=s)))
        for op in ("dispatch", "combine"):
            points = []
            for s, us in zip(p.sms, times[op]):
                t = rb.spread_of(us)
                points.append({"sms": s, "time_us": t,
                               "algbw_gbps": counted[op].algbw_mean() / (t.median * 1e3) if t.median > 0 else 0.0,
                               "busbw_gbps": counted[op].busbw_mean() / (t.median * 1e3) if t.median > 0 else 0.0})
            ops.append({"name": op, "op": op, "layout": layout, "counted": counted[op], "points": points})
    torch.cuda.synchronize(dev)
    buf.destroy()
    return torch.cuda.get_device_name(dev), ops


def report_gpu(p, ops, doc):
    for o in ops:
        dtype = p.dtype if o["op"] == "dispatch" else "bf16"
        print(f"\n== {o['name']} [{o['layout']}], {dtype.upper()} ({API[(o['op'], o['layout'])]}) ==")
        print(f"  MEASURED ({p.iters} iterations after {p.warmup} warm-up; us; GB/s):")
        print(f"    {'SMs':>5} {'median':>10} {'min':>10} {'p10':>10} {'p90':>10} {'max':>10} {'algbw':>9} {'busbw':>9}")
        for pt in o["points"]:
            t = pt["time_us"]
            print(f"    {pt['sms']:5d} {t.median:10.1f} {t.min:10.1f} {t.p10:10.1f} {t.p90:10.1f} {t.max:10.1f} "
                  f"{pt['algbw_gbps']:9.1f} {pt['busbw_gbps']:9.1f}")
        doc["ops"].append({
            "op": o["name"], "layout": o["layout"], "dtype": dtype, "modelled": True,
            "api": API[(o["op"], o["layout"])], "counted_bytes_per_rank": counted_json(o["counted"], p.tokens),
            "measured": {"kind": "MEASURED on GPUs with CUDA events", "points": [
                {"sms": pt["sms"], "time_us": spread_json(pt["time_us"]), "algbw_gbps": pt["algbw_gbps"],
                 "busbw_gbps": pt["busbw_gbps"]} for pt in o["points"]]}})


# ---------------------------------------------------------------------------- host overhead
def host_overhead(iters):
    """The Python layer's overhead per call (benchmarks/bench_python_overhead.py, ops
    stubbed), measured on this host's CPU; None when skipped or impossible."""
    if iters <= 0:
        return None
    if not railyard.has_sim_flavour():
        print("\nhost overhead per call: skipped (bench_python_overhead.py needs the simulator flavour)")
        return None
    sys.path.insert(0, _HERE)
    import bench_python_overhead

    results = bench_python_overhead.measure(iters)
    print(f"\nhost overhead per call of the Python layer (CPU time on this host, ops stubbed, {iters} calls each; "
          "benchmarks/bench_python_overhead.py; not a GPU time; the C++ op comes on top):")
    for name, r in results.items():
        print(f"  Buffer.{name:24s} median {r['median_us']:7.2f} us (p10 {r['p10_us']:.2f}, p90 {r['p90_us']:.2f})")
    return {"kind": "MEASURED CPU time on this host",
            "what": "CPU wall time of the Python layer around torch.ops.railyard.* per Buffer method call, with the "
                    "ops stubbed (benchmarks/bench_python_overhead.py): argument forms, the autograd decision, "
                    "result and handle construction",
            "calls": iters,
            **{f"{name}_us": {"median": r["median_us"], "p10": r["p10_us"], "p90": r["p90_us"]}
               for name, r in results.items()}}


# ---------------------------------------------------------------------------- main
def parameters_json(p, run_tokens, sim):
    d = {"preset": p.preset, "hidden": p.hidden, "tokens_per_rank": p.tokens, "tokens_per_rank_run": run_tokens,
         "ranks": p.ranks, "domains": p.domains, "experts_per_rank": p.experts_per_rank, "experts": p.num_experts(), "topk": p.topk,
         "dtype": p.dtype, "skew": p.skew, "pad_multiple": p.pad_multiple,
         # The PyTorch ops copy received rows out (rows in the buffer are the C++ API's only).
         "rows_in_buffer": p.rows_in_buffer, "iters": p.iters, "warmup": p.warmup,
         "seed": p.seed, "dispatch_row_bytes": p.dispatch_row_bytes()}
    if sim:
        d.update(sim_blocks=p.sim_sms, sim_preemption=p.preemption, sim_timed=p.sim_timed, sim_gpu=p.sim_gpu)
    d.update(combine_row_bytes=p.combine_row_bytes(), sms=list(p.sms), layouts=list(p.layouts))
    return d


def finish(doc, args, ok, start, what):
    doc["run_seconds"] = time.perf_counter() - start
    doc["ok"] = bool(ok)
    json_path = args.json
    if args.png and not json_path:
        json_path = os.path.join(tempfile.mkdtemp(prefix="bench_ep_"), "bench_ep.json")
    if json_path:
        try:
            with open(json_path, "w") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")
            if args.json:
                print(f"\nresults: {json_path}")
        except OSError as e:
            print(f"could not write {json_path}: {e}")
            ok = False
    if args.png and json_path and os.path.exists(json_path):
        sys.path.insert(0, _HERE)
        import plot_bench

        try:
            ok &= plot_bench.main([json_path, "-o", args.png]) == 0
        except ImportError as e:
            print(f"--png: {e} (plot_bench.py needs matplotlib)")
            ok = False
    print(f"{what} run: {doc['run_seconds']:.1f} s wall time")
    print("bench_ep.py: OK" if ok else "bench_ep.py: FAILED", flush=True)
    return 0 if ok else 1


def header(p, run_tokens, sim):
    print(f"  {config_line(p, p.tokens)}")
    if sim and run_tokens != p.tokens:
        print(f"  NOTE: the simulator runs {run_tokens} tokens/rank (--sim-tokens; --sim-full runs all {p.tokens}, "
              f"slowly); the model's headline below is for {p.tokens} tokens/rank, from the closed-form bytes of that "
              "routing, which the simulated run verifies at its size.")
    layouts = "received and expert-grouped (permute variants)" if len(p.layouts) == 2 else p.layouts[0]
    extra = (f" (the simulator runs its kernels with {p.sim_sms} blocks; the model is applied at every count: NVLink "
             "bytes do not depend on it)") if sim else ""
    print(f"  layouts: {layouts}; SM counts: {','.join(map(str, p.sms))}{extra}")
    rows_up_to = min(rb.SIM_TIMED_MAX_SMS, rb.sim_block_limit(p.ranks))
    if sim and p.sim_timed and max(p.sms) > rows_up_to:
        print(f"  NOTE: SIMULATED rows stop at {rows_up_to} SMs (the simulator's threads each hold a stack mapping; "
              f"more, on {p.ranks} ranks, exceed the kernel's vm.max_map_count)"
              + ("; the MODEL covers every count." if p.domains == 1 else "."))

    print_definitions()


def main(argv=None):
    start = time.perf_counter()
    args = parse_args(argv)
    p = make_params(args)
    if p is None:
        print("bench_ep.py: invalid options (see --help)", file=sys.stderr)
        return 2
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torchrun = "LOCAL_RANK" in os.environ
    if args.sim:
        why = "--sim"
    elif not torch.cuda.is_available():
        why = "no GPU here"
    elif not railyard.has_cuda_flavour():
        why = "this installation has no CUDA flavour (_C_cuda)"
    elif not torchrun:
        why = "not launched by torchrun (GPU runs: torchrun --nproc-per-node N benchmarks/bench_ep.py)"
    else:
        why = None
    doc = {"benchmark": "bench_ep.py", "flavour": None, "device": None, "gpu_measurement": why is None,
           "launcher": f"torchrun, {world} processes" if torchrun else "python, one process",
           "parameters": None, "definitions": dict(rb.definitions), "ops": []}

    if why is not None:  # ---- the simulator
        if world > 1 and rank != 0:
            print(f"bench_ep.py: rank {rank} of {world}: {why}; rank 0 runs the simulator alone, in one process, with "
                  f"{p.ranks} simulated GPUs; this rank exits.", flush=True)
            return 0
        print(f"bench_ep.py: SIMULATOR run on Railyard's CPU simulator ({why}): results are checked and NVLink bytes "
              "counted; every time and bandwidth below is SIMULATED (the simulator's timed mode, docs/simulator.md) "
              "or a MODEL estimate (a roofline upper bound), never a measurement.", flush=True)
        if not railyard.has_sim_flavour():
            print("bench_ep.py: this installation has no simulator flavour (_C_sim)\nbench_ep.py: FAILED")
            return 1
        run_tokens = sim_tokens(p)
        header(p, run_tokens, True)
        if p.sim_sms > rb.sim_block_limit(p.ranks):
            print(f"\nFAILED: the simulator runs every rank's blocks at once, and {p.ranks} ranks x {p.sim_sms} blocks "
                  f"exceed this machine's memory mappings (vm.max_map_count: {rb.sim_block_limit(p.ranks)} blocks at "
                  "most); pass --sms with fewer, or raise vm.max_map_count\nbench_ep.py: FAILED", flush=True)
            return 1
        doc.update(flavour="simulator", device=f"simulated {p.sim_gpu.upper()} (Railyard CPU simulator)",
                   parameters=parameters_json(p, run_tokens, True))
        try:
            run_tokens, pairs, ops = run_simulator(p)
        except Exception as e:  # a failed rank: report, do not hide
            print(f"\nFAILED: {type(e).__name__}: {e}\nbench_ep.py: FAILED", flush=True)
            return 1
        ok = report_simulator(p, run_tokens, pairs, ops, doc)
        overhead = host_overhead(p.host_overhead_iters)
        if overhead:
            doc["host_overhead"] = overhead
        return finish(doc, args, ok, start, "simulator")

    # ---- GPUs, one process per GPU (torchrun)
    import torch.distributed as dist

    if args.ranks is not None and args.ranks != world:
        if rank == 0:
            print(f"bench_ep.py: --ranks {args.ranks} but torchrun started {world} processes; expected equal",
                  file=sys.stderr)
        return 2
    p.ranks = world
    if p.topk > p.num_experts():
        print(f"bench_ep.py: top-{p.topk} of {p.num_experts()} experts", file=sys.stderr)
        return 2
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    if rank == 0:
        print(f"bench_ep.py: MEASURED on {world} GPUs (CUDA flavour, torchrun, one process per GPU, NCCL group).",
              flush=True)
        header(p, p.tokens, False)
    try:
        device, ops = run_gpu(p, rank, world, local_rank)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    doc.update(flavour="cuda", device=device, parameters=parameters_json(p, p.tokens, False))
    report_gpu(p, ops, doc)
    overhead = host_overhead(p.host_overhead_iters)
    if overhead:
        doc["host_overhead"] = overhead
    return finish(doc, args, True, start, "GPU")


if __name__ == "__main__":
    sys.exit(main())
