// railyard_bench_ep: the expert-parallel dispatch/combine bandwidth benchmark through
// the public C++ API (railyard::Buffer). docs/benchmarks.md says how to run it and
// what every number means; docs/performance-model.md is the model.
//
// Two builds of this one source:
//  - railyard_bench_ep (simulator flavour): runs every operation once on Railyard's
//    CPU simulator, checks every output against railyard::reference, compares the
//    NVLink bytes of every rank pair with the minimum, and turns those bytes into a
//    MODEL estimate of H100 and B200 times and bandwidths. Nothing it prints is a GPU
//    measurement; its first line says so.
//  - railyard_bench_ep_cuda (CUDA flavour): times the operations on real GPUs with CUDA
//    events. Without enough GPUs it runs railyard_bench_ep from its own directory.
#include <railyard/railyard.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_json.hpp"
#include "bench_model.hpp"
#include "bench_run.hpp"
#include "bench_workload.hpp"

namespace {

using namespace railyard::bench;
using railyard::DType;
using railyard::TokenLayout;

constexpr bool kSim = RAILYARD_IS_SIM;

const char* const kUsage =
    "usage: %s [--preset seed|seed-4x8|deepep] [--hidden H] [--tokens T] [--ranks R] [--domains D]\n"
    "          [--experts-per-rank E]\n"
    "          [--topk K] [--dtype bf16|fp8] [--skew S] [--sms N | --sms-sweep 1,2,4,...]\n"
    "          [--layout received|grouped|both] [--pad-multiple P] [--rows-in-buffer] [--iters N] [--warmup N]\n"
    "          [--seed S]\n"
    "          [--json FILE] [--sim-tokens T] [--sim-full] [--no-sim-timed] [--sim-gpu h100|b200] [--preemption P]\n"
    "          [--sim-waits N]\n"
    "          [--host-overhead-iters N]\n"
    "          [--model-fixed-us U] [--model-token-latency-us U]\n"
    "  presets: seed   = hidden 8192, BF16, 4096 tokens/rank, 2 experts/rank, top-8, uniform, 8 ranks (default)\n"
    "           seed-4x8 = the same on 32 ranks in 4 NVLink domains of 8 (4 nodes x 8 H100), RDMA between them\n"
    "           deepep = hidden 7168, FP8, 4096 tokens/rank, 256 experts (32/rank), top-8, uniform, 8 ranks\n"
    "  simulator: runs --sim-tokens (default 128) tokens per rank, or --tokens with --sim-full (slow),\n"
    "             checked; then once per SM count in its timed mode (SIMULATED times; --no-sim-timed skips);\n"
    "             the roofline model's upper bound is for --tokens from the routing's closed-form bytes;\n"
    "             --sim-gpu picks the simulated GPUs' preset (h100, the default, or b200);\n"
    "             --sim-waits N lists under each timed row the N waits that took the most thread time.\n"
    "  --domains D: the ranks form D NVLink domains (R / D ranks each), joined by RDMA between rail peers;\n"
    "             the simulator gives each GPU a simulated 400 Gb/s NIC and counts its bytes too.\n"
    "  --rows-in-buffer: the received layout's rows stay in the buffer (no copy-out) and the combine\n"
    "             reads its input there, in place (DispatchArgs::rows_in_buffer).\n";

bool parse_int_list(const std::string& s, std::vector<int>* out) {
  out->clear();
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) return false;
    out->push_back(std::atoi(item.c_str()));
    if (out->back() < 1) return false;
  }
  return !out->empty();
}

bool parse(int argc, char** argv, Params* p) {
  // The preset first, so that every other option overrides it.
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--preset" && !apply_preset(argv[i + 1], p)) return false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--sim-full") {
      p->sim_full = true;
      continue;
    }
    if (arg == "--no-sim-timed") {
      p->sim_timed = false;
      continue;
    }
    if (arg == "--rows-in-buffer") {
      p->rows_in_buffer = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    if (arg == "--preset") continue;
    else if (arg == "--hidden") p->hidden = std::atoll(v.c_str());
    else if (arg == "--tokens") p->tokens = std::atoll(v.c_str());
    else if (arg == "--ranks") p->ranks = std::atoi(v.c_str());
    else if (arg == "--domains") p->domains = std::atoi(v.c_str());
    else if (arg == "--experts-per-rank") p->experts_per_rank = std::atoi(v.c_str());
    else if (arg == "--topk") p->topk = std::atoi(v.c_str());
    else if (arg == "--dtype" && (v == "bf16" || v == "fp8")) p->dtype = v == "fp8" ? DType::FP8_E4M3 : DType::BF16;
    else if (arg == "--skew") p->skew = std::atof(v.c_str());
    else if (arg == "--sms") {
      p->sms = {std::atoi(v.c_str())}, p->sim_sms = p->sms.front();
      if (p->sim_sms < 1) return false;
    } else if (arg == "--sms-sweep") {
      if (!parse_int_list(v, &p->sms)) return false;
    } else if (arg == "--layout" && v == "received") p->layouts = {TokenLayout::Received};
    else if (arg == "--layout" && v == "grouped") p->layouts = {TokenLayout::ExpertGrouped};
    else if (arg == "--layout" && v == "both") p->layouts = {TokenLayout::Received, TokenLayout::ExpertGrouped};
    else if (arg == "--pad-multiple") p->pad_multiple = std::atoi(v.c_str());
    else if (arg == "--iters") p->iters = std::atoi(v.c_str());
    else if (arg == "--warmup") p->warmup = std::atoi(v.c_str());
    else if (arg == "--seed") p->seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (arg == "--json") p->json = v;
    else if (arg == "--sim-tokens") p->sim_tokens = std::atoll(v.c_str());
    else if (arg == "--sim-gpu" && (v == "h100" || v == "b200")) p->sim_gpu = v;
    else if (arg == "--preemption") p->preemption = std::atof(v.c_str());
    else if (arg == "--sim-waits") p->sim_waits = std::atoi(v.c_str());
    else if (arg == "--host-overhead-iters") p->host_overhead_iters = std::atoi(v.c_str());
    else if (arg == "--model-fixed-us") p->model_fixed_us = std::atof(v.c_str());
    else if (arg == "--model-token-latency-us") p->model_token_latency_us = std::atof(v.c_str());
    else return false;
  }
  const bool fp8 = p->dtype == DType::FP8_E4M3;
  return p->hidden > 0 && p->hidden % 8 == 0 && (!fp8 || p->hidden % 128 == 0) && p->tokens >= 0 &&
         p->sim_tokens >= 0 && p->ranks >= 1 && p->ranks <= 72 && p->domains >= 1 && p->domains <= 64 &&
         p->ranks % p->domains == 0 && p->experts_per_rank >= 1 && p->topk >= 1 &&
         p->topk <= p->num_experts() && p->skew >= 0 && p->pad_multiple >= 1 && p->iters >= 1 && p->warmup >= 0 &&
         p->preemption > 0 && p->preemption <= 1 && p->sim_waits >= 0 && p->model_fixed_us >= 0 &&
         p->model_token_latency_us >= 0;
}

std::string sms_list(const std::vector<int>& sms) {
  std::string s;
  for (int n : sms) s += (s.empty() ? "" : ",") + std::to_string(n);
  return s;
}

std::string config_line(const Params& p, int64_t tokens) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "preset %s: %d ranks (%d NVLink domain%s of %d), hidden %lld, %s dispatch, %lld tokens/rank, %d experts "
                "(%d/rank), top-%d, routing %s (skew %.3g), pad multiple %d%s",
                p.preset.c_str(), p.ranks, p.domains, p.domains > 1 ? "s" : "", p.ranks_per_domain(),
                static_cast<long long>(p.hidden), p.dtype == DType::FP8_E4M3 ? "FP8" : "BF16",
                static_cast<long long>(tokens), p.num_experts(), p.experts_per_rank, p.topk,
                p.skew == 0 ? "uniform random" : "Zipf over experts", p.skew, p.pad_multiple,
                p.rows_in_buffer ? ", received rows in the buffer (combined in place)" : "");
  return buf;
}

void print_definitions() {
  std::printf("\ndefinitions (docs/benchmarks.md):\n  %s\n  %s\n  %s\n", kDefAlgbw, kDefBusbw, kDefTime);
}

std::string op_label(const OpResult& op) {
  return std::string(op.name) + " [" + layout_name(op.layout) + "]";
}

uint64_t matrix_sum(const std::vector<std::vector<uint64_t>>& m) {
  uint64_t s = 0;
  for (const auto& row : m)
    for (uint64_t v : row) s += v;
  return s;
}

// Per-link tables of one layout: dispatch kernel bytes written s -> d, combine bytes
// home s read from d, each against its minimum.
void print_links(const Params& p, const OpResult& dispatch, const OpResult& combine, const PairCounts& pairs) {
  const int R = p.ranks;
  std::printf("  NVLink bytes per link (sim::traffic(), one window per operation) against the minimum:\n");
  std::printf("  %-7s %7s %14s %14s %14s %14s %6s\n", "s -> d", "tokens", "dispatch wrote", "minimum",
              "combine read", "minimum", "polls");
  for (int s = 0; s < R; ++s) {
    for (int d = 0; d < R; ++d) {
      if (s == d || !p.same_domain(s, d)) continue;  // across domains: no NVLink (checked, 0 bytes)
      const uint64_t dw = dispatch.traffic.written[s][d], dm = dispatch.minimum.written[s][d];
      const uint64_t cr = combine.traffic.read[s][d], cm = combine.minimum.read[s][d];
      const bool ok = dw == dm && dispatch.traffic.read[s][d] == 0 && cr >= cm && (cr - cm) % 8 == 0 &&
                      combine.traffic.written[s][d] == combine.minimum.written[s][d];
      std::printf("  %2d -> %-2d %7llu %14s %14s %14s %14s %6llu%s\n", s, d,
                  static_cast<unsigned long long>(pairs.pair_tokens(s, d)), with_commas(dw).c_str(),
                  with_commas(dm).c_str(), with_commas(cr).c_str(), with_commas(cm).c_str(),
                  static_cast<unsigned long long>(cr >= cm ? (cr - cm) / 8 : 0), ok ? "" : "  <-- not the minimum");
    }
  }
}

struct Modelled {  // one op's model, per GPU and SM count
  std::string gpu;
  int fill = 0;
  std::vector<ModelPoint> points;
};

std::vector<Modelled> model_op(const Params& p, const LinkBytes& bytes, const CountedBytes& counted, int64_t tokens) {
  std::vector<Modelled> out;
  for (GpuModel g : {h100_model(), b200_model()}) {
    g.fixed_us = p.model_fixed_us;
    g.token_latency_us = p.model_token_latency_us;
    Modelled m{g.name, sms_to_fill(g, bytes, tokens), {}};
    for (int s : p.sms)
      m.points.push_back(model_point(g, bytes, s, counted.algbw_mean(), counted.busbw_mean(), tokens));
    out.push_back(m);
  }
  return out;
}

void print_model(const std::string& title, const std::vector<Modelled>& models) {
  std::printf("  %s\n", title.c_str());
  std::printf("    %5s", "SMs");
  for (const auto& m : models) std::printf(" | %-9s %9s %9s %9s %5s", m.gpu.c_str(), "time us", "algbw", "busbw", "bound");
  std::printf("\n");
  for (std::size_t i = 0; i < models.front().points.size(); ++i) {
    std::printf("    %5d", models.front().points[i].sms);
    for (const auto& m : models) {
      const ModelPoint& pt = m.points[i];
      std::printf(" | %-9s %9.1f %9.1f %9.1f %5s", "MODEL", pt.time_us, pt.algbw_gbps, pt.busbw_gbps, pt.bound);
    }
    std::printf("\n");
  }
  std::printf("    SMs at which the link bounds the model:");
  for (const auto& m : models) std::printf(" %s %d;", m.gpu.c_str(), m.fill);
  std::printf(" (bandwidths in GB/s)\n");
}

void json_spread(Json& j, const char* key, const Spread& s) {
  j.begin_object(key).num("median", s.median).num("min", s.min).num("p10", s.p10).num("p90", s.p90).num("max", s.max);
  j.end_object();
}

void json_model(Json& j, const char* key, const Params& p, const std::vector<Modelled>& models,
                const std::string& basis) {
  j.begin_object(key).str("kind", "MODEL estimate (not a measurement), docs/performance-model.md");
  j.str("bytes_basis", basis).begin_array("gpus");
  for (const auto& m : models) {
    const GpuModel g = m.gpu == "H100" ? h100_model() : b200_model();
    j.begin_object().str("gpu", m.gpu).num("link_gbps_per_direction", g.link_gbps).integer("fill_sms", g.fill_sms);
    j.num("per_sm_gbps", g.per_sm_gbps()).integer("sms_to_fill_link", m.fill);
    j.num("fixed_us", p.model_fixed_us).num("token_latency_us", p.model_token_latency_us).begin_array("points");
    for (const auto& pt : m.points)
      j.begin_object().integer("sms", pt.sms).num("model_time_us", pt.time_us).num("model_link_us", pt.link_us)
          .num("model_sm_us", pt.sm_us).num("model_algbw_gbps", pt.algbw_gbps).num("model_busbw_gbps", pt.busbw_gbps)
          .str("bound", pt.bound).end_object();
    j.end_array().end_object();
  }
  j.end_array().end_object();
}

// Several domains: each NIC's bytes against the minimum (docs/design-internode.md),
// printed per NIC and in the JSON as nic_bytes and nic_minimum_bytes (per NIC, the
// bytes it sent; each (token, remote domain) pair once, with the stated signals).
void print_nic(Json& j, const Params& p, const OpResult& op) {
  std::vector<uint64_t> sent, minimum;
  uint64_t total = 0, total_min = 0;
  for (int g = 0; g < p.ranks; ++g) {
    sent.push_back(op.nic_sent(g));
    uint64_t m = 0;
    for (uint64_t b : op.nic_minimum[static_cast<std::size_t>(g)]) m += b;
    minimum.push_back(m);
    total += sent.back(), total_min += m;
  }
  std::printf("  NIC bytes (%d NICs, one per GPU, simulator count): %s; minimum %s; NICs off their minimum: %d%s\n",
              p.ranks, with_commas(total).c_str(), with_commas(total_min).c_str(), op.bad_nics,
              op.bad_nics ? "  <-- FAIL" : " (OK)");
  const auto [lo, hi] = std::minmax_element(sent.begin(), sent.end());
  std::printf("    per NIC: %s .. %s bytes sent, each to its %d rail peers\n", with_commas(*lo).c_str(),
              with_commas(*hi).c_str(), p.domains - 1);
  j.uint_array("nic_bytes", sent).uint_array("nic_minimum_bytes", minimum).integer("nics_off_minimum", op.bad_nics);
}

// The timed runs' rows of one operation: printed, and the JSON's `simulated` list.
void print_simulated(Json& j, const OpResult& op, int64_t tokens, const std::string& gpu) {
  std::printf("  SIMULATED on simulated %ss (timed mode, %lld tokens/rank; NOT a measurement; us, GB/s%s):\n",
              gpu == "b200" ? "B200" : "H100", static_cast<long long>(tokens),
              op.has_nic ? "; NIC busbw = mean bytes a NIC sent / time, against a 50 GB/s (400 Gb/s) port" : "");
  std::printf("    %5s %10s %9s %9s %10s  %-10s %s\n", "SMs", "time", "algbw", "busbw", op.has_nic ? "NIC busbw" : "",
              "bound", "busiest resource");
  j.begin_array("simulated");
  for (const Simulated& s : op.simulated) {
    const std::string nic = op.has_nic ? std::to_string(s.nic_busbw_gbps).substr(0, 5) : "";
    std::printf("    %5d %10.1f %9.1f %9.1f %10s  %-10s %s %.0f%%%s\n", s.sms, s.time_us, s.algbw_gbps, s.busbw_gbps,
                nic.c_str(), s.bound.bound.c_str(), s.bound.busiest.c_str(), 100 * s.bound.busiest_fraction,
                s.mismatches ? "  <-- outputs MISMATCH" : "");
    j.begin_object().str("kind", simulated_kind(gpu));
    j.integer("sms", s.sms).integer("tokens_per_rank", tokens).num("sim_time_us", s.time_us);
    if (op.has_nic) j.num("sim_nic_busbw_gbps", s.nic_busbw_gbps);
    j.num("sim_algbw_gbps", s.algbw_gbps).num("sim_busbw_gbps", s.busbw_gbps).str("sim_bound", s.bound.bound);
    j.str("sim_busiest", s.bound.busiest).num("sim_busiest_fraction", s.bound.busiest_fraction);
    if (!s.waits.empty()) {
      std::printf("          waited on (SIMULATED; us summed over threads, longest one):\n");
      j.begin_array("sim_waits");
      for (const SimWait& w : s.waits) {
        std::printf("            %12.1f us in %8llu waits, longest %9.1f us (rank %d, index %lld, value %lld): %s (%s)\n",
                    w.total_us, static_cast<unsigned long long>(w.waits), w.max_us, w.longest_rank,
                    static_cast<long long>(w.longest_index), static_cast<long long>(w.longest_value), w.what.c_str(),
                    w.where.c_str());
        j.begin_object().str("what", w.what).str("where", w.where).uinteger("waits", w.waits).num("total_us", w.total_us);
        j.num("max_us", w.max_us).integer("longest_rank", w.longest_rank).integer("longest_index", w.longest_index);
        j.integer("longest_value", w.longest_value).end_object();
      }
      j.end_array();
    }
    j.uinteger("mismatches", s.mismatches).end_object();
  }
  j.end_array();
}

// Runs the simulator build when this CUDA build finds too few GPUs.
[[noreturn]] void run_simulator_instead(char** argv, const std::string& why) {
  std::string self(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size() - 1);
  std::string sim = n > 0 ? self.substr(0, static_cast<std::size_t>(n)) : std::string(argv[0]);
  sim = sim.substr(0, sim.find_last_of('/') + 1) + "railyard_bench_ep";
  std::fprintf(stderr, "railyard_bench_ep_cuda: %s; running the simulator build %s instead\n", why.c_str(),
               sim.c_str());
  std::fflush(stderr);
  argv[0] = sim.data();
  execv(sim.c_str(), argv);
  std::printf("railyard_bench_ep_cuda: %s, and the simulator build %s could not be started (%s); build the "
              "target railyard_bench_ep\n", why.c_str(), sim.c_str(), std::strerror(errno));
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Params p;
  if (!parse(argc, argv, &p)) {
    std::fprintf(stderr, kUsage, argv[0]);
    return 2;
  }
  if constexpr (!kSim) {
    int gpus = 0;
    try {
      gpus = railyard::runtime::gpu::count();
    } catch (const std::exception& e) {
      run_simulator_instead(argv, std::string("no usable CUDA driver (") + e.what() + ")");
    }
    if (gpus < p.ranks)
      run_simulator_instead(argv, "found " + std::to_string(gpus) + " GPUs for " + std::to_string(p.ranks) + " ranks");
    std::printf("railyard_bench_ep: MEASURED on %d GPUs (CUDA flavour), one host thread per GPU.\n", p.ranks);
  } else {
    std::printf("railyard_bench_ep: SIMULATOR run on Railyard's CPU simulator (no GPU here): results are checked and "
                "NVLink bytes counted; every time and bandwidth below is SIMULATED (the simulator's timed mode, "
                "docs/simulator.md) or a MODEL estimate (a roofline upper bound), never a measurement.\n");
  }
  std::fflush(stdout);
  const int64_t run_tokens = kSim ? (p.sim_full ? p.tokens : std::min(p.sim_tokens, p.tokens)) : p.tokens;
  std::printf("  %s\n", config_line(p, p.tokens).c_str());
  if (kSim && run_tokens != p.tokens)
    std::printf("  NOTE: the simulator runs %lld tokens/rank (--sim-tokens; --sim-full runs all %lld, slowly); the "
                "model's headline below is for %lld tokens/rank, from the closed-form bytes of that routing, which "
                "the simulated run verifies at its size.\n",
                static_cast<long long>(run_tokens), static_cast<long long>(p.tokens), static_cast<long long>(p.tokens));
  std::printf("  layouts: %s; SM counts: %s%s\n",
              p.layouts.size() == 2 ? "received and expert-grouped (permute variants)" : layout_name(p.layouts.front()),
              sms_list(p.sms).c_str(),
              kSim ? (" (the simulator runs its kernels with " + std::to_string(p.sim_sms) +
                          " blocks; the model is applied at every count: NVLink bytes do not depend on it)").c_str()
                     : "");
  const int sim_rows_up_to = std::min(kSimTimedMaxSms, sim_block_limit(p.ranks));
  if (kSim && p.sim_timed && *std::max_element(p.sms.begin(), p.sms.end()) > sim_rows_up_to)
    std::printf("  NOTE: SIMULATED rows stop at %d SMs (the simulator's threads each hold a stack mapping; more, on "
                "%d ranks, exceed the kernel's vm.max_map_count)%s.\n", sim_rows_up_to, p.ranks,
                p.domains == 1 ? "; the MODEL covers every count" : "");
  print_definitions();
  std::fflush(stdout);

  const RunResult res = run(p);
  if (!res.error.empty()) {
    std::printf("\nFAILED: %s\nbench_ep: FAILED\n", res.error.c_str());
    return 1;
  }
  bool ok = true;
  Json j;
  j.begin_object().str("benchmark", "railyard_bench_ep").str("flavour", res.flavour).str("device", res.device);
  j.boolean("gpu_measurement", !kSim);
  j.begin_object("parameters").str("preset", p.preset).integer("hidden", p.hidden).integer("tokens_per_rank", p.tokens);
  j.integer("tokens_per_rank_run", res.tokens).integer("ranks", p.ranks).integer("domains", p.domains);
  j.integer("experts_per_rank", p.experts_per_rank);
  j.integer("experts", p.num_experts()).integer("topk", p.topk).str("dtype", dtype_name(p.dtype)).num("skew", p.skew);
  j.boolean("rows_in_buffer", p.rows_in_buffer).integer("pad_multiple", p.pad_multiple).integer("iters", p.iters).integer("warmup", p.warmup);
  j.uinteger("seed", p.seed).integer("dispatch_row_bytes", p.dispatch_row_bytes());
  if (kSim) j.integer("sim_blocks", p.sim_sms).num("sim_preemption", p.preemption).boolean("sim_timed", p.sim_timed).str("sim_gpu", p.sim_gpu);
  j.integer("combine_row_bytes", p.combine_row_bytes()).begin_array("sms");
  for (int s : p.sms) j.integer(nullptr, s);
  j.end_array().end_object();
  j.begin_object("definitions").str("algbw", kDefAlgbw).str("busbw", kDefBusbw).str("time", kDefTime);
  j.str("model", "docs/performance-model.md").end_object();

  // The model's headline: the configured token count, from the closed-form bytes.
  const auto full_pairs = count_pairs(p, make_routing(p, p.tokens, p.seed), p.tokens);
  const auto run_pairs = count_pairs(p, make_routing(p, res.tokens, p.seed), res.tokens);

  j.begin_array("ops");
  for (std::size_t i = 0; i < res.ops.size(); ++i) {
    const OpResult& op = res.ops[i];
    std::printf("\n== %s, %s ==\n", op_label(op).c_str(),
                op.op == Op::Dispatch ? (p.dtype == DType::FP8_E4M3 ? "FP8" : "BF16") : "BF16");
    j.begin_object().str("op", op.name).str("layout", layout_name(op.layout));
    j.str("dtype", op.op == Op::Dispatch ? dtype_name(p.dtype) : "bf16").boolean("modelled", op.modelled);
    j.begin_object("counted_bytes_per_rank").str("tokens_per_rank", std::to_string(res.tokens));
    j.uint_array("algbw", op.counted.algbw).uint_array("busbw", op.counted.busbw).end_object();
    if (op.checked) {
      ok &= op.mismatches == 0;
      std::printf("  check: %s: %s\n", op.checked_what.c_str(),
                  op.mismatches == 0 ? "OK" : ("MISMATCH (" + with_commas(op.mismatches) + " elements)").c_str());
      j.begin_object("check").str("what", op.checked_what).uinteger("mismatches", op.mismatches).end_object();
    }
    if (op.has_traffic) {
      const uint64_t moved = matrix_sum(op.traffic.written) + matrix_sum(op.traffic.read);
      const uint64_t minimum = matrix_sum(op.minimum.written) + matrix_sum(op.minimum.read);
      ok &= op.bad_pairs == 0;
      std::printf("  NVLink bytes (all %d links, simulator count): %s; minimum %s; excess %.4f%% (%s 8-byte header "
                  "re-polls); links off their minimum: %d%s\n",
                  p.ranks * (p.ranks_per_domain() - 1), with_commas(moved).c_str(), with_commas(minimum).c_str(),
                  minimum ? 100.0 * static_cast<double>(moved - std::min(moved, minimum)) / static_cast<double>(minimum) : 0.0,
                  with_commas(op.polls).c_str(), op.bad_pairs, op.bad_pairs ? "  <-- FAIL" : " (OK)");
      std::printf("  simulator: %.2f s CPU wall time, %s scheduler steps (NOT GPU time)\n", op.sim_seconds,
                  with_commas(op.sim_steps).c_str());
      j.begin_object("simulator_traffic").str("kind", "bytes counted by the simulator (sim::traffic())");
      j.uinteger("nvlink_bytes", moved).uinteger("minimum_bytes", minimum).uinteger("header_repolls", op.polls);
      j.integer("links_off_minimum", op.bad_pairs).num("simulator_cpu_seconds", op.sim_seconds);
      j.begin_array("links");
      for (int s = 0; s < p.ranks; ++s)
        for (int d = 0; d < p.ranks; ++d)
          if (s != d)
            j.begin_object().integer("executing", s).integer("owner", d).uinteger("written", op.traffic.written[s][d])
                .uinteger("read", op.traffic.read[s][d]).uinteger("min_written", op.minimum.written[s][d])
                .uinteger("min_read", op.minimum.read[s][d]).end_object();
      j.end_array().end_object();
      if (op.has_nic) print_nic(j, p, op);
      ok &= op.bad_nics == 0;
      if (op.op == Op::Combine && i >= 1 && res.ops[i - 1].has_traffic) print_links(p, res.ops[i - 1], op, run_pairs);
    }
    if (!op.simulated.empty()) print_simulated(j, op, res.tokens, p.sim_gpu);
    if (!op.measured.empty()) {
      std::printf("  MEASURED (%d iterations after %d warm-up; us; GB/s):\n", p.iters, p.warmup);
      std::printf("    %5s %10s %10s %10s %10s %10s %9s %9s\n", "SMs", "median", "min", "p10", "p90", "max", "algbw",
                  "busbw");
      j.begin_object("measured").str("kind", "MEASURED on GPUs with CUDA events").begin_array("points");
      for (const Timed& t : op.measured) {
        std::printf("    %5d %10.1f %10.1f %10.1f %10.1f %10.1f %9.1f %9.1f\n", t.sms, t.time_us.median, t.time_us.min,
                    t.time_us.p10, t.time_us.p90, t.time_us.max, t.algbw_gbps, t.busbw_gbps);
        j.begin_object().integer("sms", t.sms);
        json_spread(j, "time_us", t.time_us);
        j.num("algbw_gbps", t.algbw_gbps).num("busbw_gbps", t.busbw_gbps).end_object();
      }
      j.end_array().end_object();
    }
    if (kSim && op.modelled && p.domains > 1 && i == 1)
      std::printf("  (no MODEL across domains: the roofline model is NVLink's; the SIMULATED rows include the NIC)\n");
    if (kSim && op.modelled && p.domains == 1) {
      const LinkBytes sim_bytes = link_bytes_from_pairs(op.traffic.written, op.traffic.read);
      const PairMatrices full_min = minimum_matrices(p, full_pairs, op.op, false, res.count_row_bytes);
      const LinkBytes full_bytes = link_bytes_from_pairs(full_min.written, full_min.read);
      const CountedBytes full_counted = counted_bytes(p, full_pairs, op.op);
      const auto headline = model_op(p, full_bytes, full_counted, p.tokens);
      print_model("MODEL estimate (not a measurement) for " + std::to_string(p.tokens) +
                      " tokens/rank, from the closed-form minimum bytes of that routing:",
                  headline);
      json_model(j, "model", p, headline, "closed-form minimum NVLink bytes of the routing at tokens_per_rank");
      const auto at_sim = model_op(p, sim_bytes, op.counted, res.tokens);
      if (res.tokens != p.tokens) {
        // Quoted at the simulated block count when the sweep has it, else at its first.
        std::size_t k = 0;
        while (k + 1 < p.sms.size() && p.sms[k] != p.sim_sms) ++k;
        if (p.sms[k] != p.sim_sms) k = 0;
        std::printf("  (the same model on the bytes the simulator counted at %lld tokens/rank: %s %.1f us, %s %.1f us "
                    "at %d SMs)\n",
                    static_cast<long long>(res.tokens), at_sim[0].gpu.c_str(), at_sim[0].points[k].time_us,
                    at_sim[1].gpu.c_str(), at_sim[1].points[k].time_us, p.sms[k]);
      }
      json_model(j, "model_at_simulated_size", p, at_sim, "NVLink bytes the simulator counted at tokens_per_rank_run");
    }
    j.end_object();
  }
  j.end_array();

  if (res.host.measured) {
    std::printf("\nhost overhead per call (%s; %d calls):\n  %s\n", kSim ? "CPU time, simulator flavour" : "CPU time",
                res.host.calls, res.host.what.c_str());
    std::printf("  Buffer::dispatch: median %.2f us (p10 %.2f, p90 %.2f); Buffer::combine: median %.2f us (p10 %.2f, "
                "p90 %.2f)\n",
                res.host.dispatch_us.median, res.host.dispatch_us.p10, res.host.dispatch_us.p90,
                res.host.combine_us.median, res.host.combine_us.p10, res.host.combine_us.p90);
    j.begin_object("host_overhead").str("kind", "MEASURED CPU time on this host").str("what", res.host.what);
    j.integer("calls", res.host.calls);
    json_spread(j, "dispatch_us", res.host.dispatch_us);
    json_spread(j, "combine_us", res.host.combine_us);
    j.end_object();
  }
  j.num("run_seconds", res.seconds).boolean("ok", ok).end_object();
  if (!p.json.empty()) {
    std::ofstream f(p.json);
    f << j.text() << '\n';
    if (!f) {
      std::printf("could not write %s\n", p.json.c_str());
      ok = false;
    } else {
      std::printf("\nresults: %s\n", p.json.c_str());
    }
  }
  std::printf("%s run: %.1f s wall time\n", kSim ? "simulator" : "GPU", res.seconds);
  std::printf("%s\n", ok ? "bench_ep: OK" : "bench_ep: FAILED");
  return ok ? 0 : 1;
}
