#!/usr/bin/env python3
"""Tests of benchmarks/bench_ep.py (ctest label python; docs/benchmarks.md "Tests").

    python benchmarks/bench_ep_test.py                       counted bytes, minimum and model of a
                                                              tiny hand-made workload against values
                                                              worked out by hand; a wrong expectation
                                                              makes the benchmark fail
    python benchmarks/bench_ep_test.py --json PY [--like CPP] the JSON bench_ep.py wrote has the
                                                              expected keys (and every key of
                                                              railyard_bench_ep's JSON CPP)
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_ep  # noqa: E402
from bench_ep import rb  # noqa: E402  (railyard._bench)


def tiny(dtype="bf16"):
    # 3 ranks, 2 experts each (0, 1 on rank 0; 2, 3 on rank 1; 4, 5 on rank 2), top-2,
    # 2 tokens per rank, hidden 128.
    p = rb.Params()
    p.ranks, p.experts_per_rank, p.topk, p.hidden, p.dtype = 3, 2, 2, 128, dtype
    return p


# rank 0: t0 {0, 1} -> rank 0 (2 entries); t1 {1, 4} -> ranks 0 and 2
# rank 1: t0 {2, 5} -> ranks 1 and 2;     t1 {0, 3} -> ranks 0 and 1
# rank 2: t0 {4, 5} -> rank 2 (2 entries); t1 {-1, 2} -> rank 1
ROUTING = [[0, 1, 1, 4], [2, 5, 0, 3], [4, 5, -1, 2]]


def routing():
    return [rb.Routing(idx, [0.5] * len(idx)) for idx in ROUTING]


def expect_eq(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, expected {want!r}")


def test_counted_bytes():
    p = tiny()
    pairs, counted = bench_ep.counted_from_routing(p, routing(), 2)
    # tokens [s][d]: 0->0 t0, t1; 0->2 t1; 1->0 t1; 1->1 t0, t1; 1->2 t0; 2->1 t1; 2->2 t0
    expect_eq(list(pairs.tokens), [2, 0, 1, 1, 2, 1, 0, 1, 1], "pair tokens")
    # entries: 0->0 2 + 1; 0->2 1; 1->0 1; 1->1 1 + 1; 1->2 1; 2->1 1; 2->2 2
    expect_eq(list(pairs.entries), [3, 0, 1, 1, 2, 1, 0, 1, 2], "pair entries")
    # Rows received: rank 0 2 + 1 (1 from another rank), rank 1 2 + 1 (1), rank 2 1 + 1 + 1 (2).
    # BF16 row 256 B.
    expect_eq(list(counted["dispatch"].algbw), [768, 768, 768], "dispatch algbw bytes")
    expect_eq(list(counted["dispatch"].busbw), [256, 256, 512], "dispatch busbw bytes")
    expect_eq(counted["dispatch"].busbw_mean(), 1024 / 3, "dispatch busbw mean")
    expect_eq(list(counted["combine"].busbw), [256, 256, 512], "combine busbw bytes")
    # FP8 dispatch row: 128 codes + 1 scale x 4 B = 132 B; combine stays BF16.
    _, c8 = bench_ep.counted_from_routing(tiny("fp8"), routing(), 2)
    expect_eq(list(c8["dispatch"].algbw), [396, 396, 396], "fp8 dispatch algbw bytes")
    expect_eq(list(c8["dispatch"].busbw), [132, 132, 264], "fp8 dispatch busbw bytes")
    expect_eq(list(c8["combine"].algbw), [768, 768, 768], "fp8 run's combine algbw bytes")


def test_minimum_and_model():
    p = tiny()
    pairs, counted = bench_ep.counted_from_routing(p, routing(), 2)
    # count row: 4 header ints + 3 ranks x (1 + 2 experts) = 13 ints = 52 B
    expect_eq(rb.count_row_bytes(p), 52, "count row bytes")
    m = rb.minimum_matrices(p, pairs, "dispatch", False, 52)
    # s -> d: tokens x (256 + 16) + 12 x entries + 20 (barrier flag and operation
    # descriptor); 0 tokens: those 20 only
    expect_eq(m.written, [[0, 20, 304], [304, 0, 304], [20, 304, 0]], "dispatch minimum")
    first = rb.minimum_matrices(p, pairs, "dispatch", True, 52)
    expect_eq(first.written[0][2], 304 + 52 + 4, "first call: + count row and its flag")
    c = rb.minimum_matrices(p, pairs, "combine", False, 52)
    # home s reads from d: tokens(s -> d) x (256 + 10); every rank writes the entry barrier's
    # 20 bytes to each peer
    expect_eq(c.read, [[0, 0, 266], [266, 0, 266], [0, 266, 0]], "combine minimum reads")
    expect_eq(c.written, [[0, 20, 20], [20, 0, 20], [20, 20, 0]], "combine flags")
    # Model, H100: busiest direction 608 B (rank 1 out, rank 2 in) / 450 GB/s = 0.00135111 us;
    # 1 SM: rank 1 issues 608 B / 56.25 GB/s = 0.01080889 us -> algbw 768 B / 0.01080889 us
    # = 71.052632 GB/s.
    p.sms = [1, 8]
    h100 = bench_ep.model_op(p, m.written, m.read, counted["dispatch"], 2)[0]
    one, eight = h100["points"]
    expect_eq((round(one.time_us, 8), one.bound, round(one.algbw_gbps, 6)), (0.01080889, "SMs", 71.052632), "1 SM")
    expect_eq((round(eight.time_us, 8), eight.bound), (0.00135111, "link"), "8 SMs")
    expect_eq(h100["fill"], 8, "SMs to fill the link")


def test_nic_minimum():
    # Three domains of one rank each (every rank is every other's rail peer).
    p = tiny()
    p.domains = 3
    pairs, _ = bench_ep.counted_from_routing(p, routing(), 2)
    zero = [[0] * 3 for _ in range(3)]
    one_domain = tiny()
    expect_eq(rb.nic_minimum(one_domain, bench_ep.counted_from_routing(one_domain, routing(), 2)[0], "dispatch", True, 2),
              zero, "one domain: no NIC bytes")
    d = rb.nic_minimum(p, pairs, "dispatch", False, 2)
    # g -> q: rows = tokens of g with an expert on q; each row once, a signal per chunk
    # of 64 (one here) and a rail entry of 8 bytes on each of the two lanes per rail
    # peer; no rows: the rail entries alone.
    entries = 2 * 8
    wire = d[1][0] - 8 - entries  # rank 1's t1 goes to rank 0: one wire row
    assert wire >= 256, wire  # at least the BF16 payload
    one = wire + 8 + entries
    expect_eq([row[:] for row in d], [[0, entries, one], [one, 0, one], [entries, one, 0]], "dispatch NIC minimum")
    first = rb.nic_minimum(p, pairs, "dispatch", True, 2)
    expect_eq(first[0][1], entries + rb.count_row_bytes(p) + 8, "first call: + the count row and its signal")
    c = rb.nic_minimum(p, pairs, "combine", False, 2)
    # g -> q: the partials of q's tokens with an expert on g
    wc = c[0][1] - 8 - entries  # rank 1's t1 has an expert on rank 0
    assert wc >= 256, wc
    onec = wc + 8 + entries
    expect_eq([row[:] for row in c], [[0, onec, entries], [entries, 0, onec], [onec, onec, 0]], "combine NIC minimum")


def test_mismatch_fails():
    # A wrong expectation (one bit of one combined output) must make the run fail.
    real = bench_ep.expected_outputs

    def wrong(p, inputs, layout):
        out, combined = real(p, inputs, layout)
        combined[1].view(-1).view(bench_ep.torch.int16)[0] ^= 1
        return out, combined

    bench_ep.expected_outputs = wrong
    print("bench_ep_test: the run below must FAIL (its expectation is wrong on purpose)", flush=True)
    try:
        rc = bench_ep.main(["--ranks", "2", "--tokens", "4", "--hidden", "128", "--topk", "2", "--layout",
                            "received", "--no-overhead", "--sim"])
    finally:
        bench_ep.expected_outputs = real
    expect_eq(rc, 1, "exit code of a run with a wrong expectation")


TOP = {"benchmark", "flavour", "device", "gpu_measurement", "parameters", "definitions", "ops", "run_seconds", "ok"}
OP = {"op", "layout", "dtype", "modelled", "counted_bytes_per_rank", "check", "simulator_traffic"}


def check_json(path, like=None):
    d = json.load(open(path))
    missing = TOP - set(d)
    assert not missing, f"missing keys {missing}"
    assert d["ok"] and d["flavour"] == "simulator" and not d["gpu_measurement"], d
    assert {"algbw", "busbw", "time", "model"} <= set(d["definitions"])
    assert d["ops"] and all(OP <= set(o) for o in d["ops"]), "an op misses a key"
    modelled = [o for o in d["ops"] if o["modelled"]]
    domains = d["parameters"]["domains"]
    assert modelled and (domains > 1 or all(o["model"]["kind"].startswith("MODEL") and
                                            o["model_at_simulated_size"]["kind"].startswith("MODEL") for o in modelled))
    if domains > 1:  # every NIC at its minimum, and the SIMULATED NIC bandwidth its bytes over its time
        for o in d["ops"]:
            assert o["nic_bytes"] == o["nic_minimum_bytes"] and min(o["nic_bytes"]) > 0, o
            for r in o.get("simulated", []):
                sent = sum(o["nic_bytes"]) / len(o["nic_bytes"])
                assert abs(r["sim_nic_busbw_gbps"] * r["sim_time_us"] * 1e3 - sent) <= 1e-6 * sent, r
    assert all(o["check"]["mismatches"] == 0 and o["simulator_traffic"]["links_off_minimum"] == 0 for o in d["ops"])
    assert all(len(o["counted_bytes_per_rank"]["algbw"]) == d["parameters"]["ranks"] for o in d["ops"])
    if d["parameters"]["sim_timed"]:  # a SIMULATED row per SM count up to 16, its bandwidth its bytes over its time
        up_to = min(rb.SIM_TIMED_MAX_SMS, rb.sim_block_limit(d["parameters"]["ranks"]))
        timed_sms = [s for s in d["parameters"]["sms"] if s <= up_to]
        for o in d["ops"]:
            assert [r["sms"] for r in o["simulated"]] == timed_sms, o["simulated"]
            busbw = o["counted_bytes_per_rank"]["busbw"]
            for r in o["simulated"]:
                assert r["kind"].startswith("SIMULATED") and r["sim_time_us"] > 0 and r["mismatches"] == 0, r
                assert abs(r["sim_busbw_gbps"] * r["sim_time_us"] * 1e3 - sum(busbw) / len(busbw)) <= 1e-6 * sum(busbw)
                assert r["sim_bound"] in ("latency", r["sim_busiest"]), r
    if like:  # every key railyard_bench_ep writes, at every level that both have
        c = json.load(open(like))

        def keys_of(a, b, where):
            if isinstance(a, dict):
                lost = set(a) - set(b)
                assert not lost, f"{where}: keys of {like} missing in {path}: {sorted(lost)}"
                for k in a:
                    keys_of(a[k], b[k], f"{where}.{k}")
            elif isinstance(a, list) and a and isinstance(a[0], dict) and b:
                keys_of(a[0], b[0], f"{where}[0]")

        # host_overhead is another quantity (the Python layer's work per call, not the C++ op's)
        c.pop("host_overhead", None)
        keys_of(c, d, "$")
    print(f"bench_ep.py JSON OK: {len(d['ops'])} ops" + (f", every key of {os.path.basename(like)}" if like else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--like")
    a = ap.parse_args()
    if a.json:
        check_json(a.json, a.like)
        return 0
    test_counted_bytes()
    test_minimum_and_model()
    test_nic_minimum()
    test_mismatch_fails()
    print("bench_ep_test: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
