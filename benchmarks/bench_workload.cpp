// railyard_bench_ep: parameters, presets, inputs and counted bytes. See bench_workload.hpp.
#include "bench_workload.hpp"

#include <algorithm>
#include <fstream>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

namespace railyard::bench {

int64_t Params::dispatch_row_bytes() const {
  if (dtype == DType::FP8_E4M3) return hidden + hidden / 128 * 4;  // e4m3 codes + fp32 scale per 128
  return hidden * 2;
}

bool apply_preset(const std::string& name, Params* p) {
  if (name == "seed") {  // the seed article's test: 8 x H100, BF16
    p->hidden = 8192, p->tokens = 4096, p->experts_per_rank = 2, p->topk = 8, p->dtype = DType::BF16;
  } else if (name == "seed-4x8") {  // the seed article's inter-node test: 4 nodes of 8 x H100
    p->hidden = 8192, p->tokens = 4096, p->experts_per_rank = 2, p->topk = 8, p->dtype = DType::BF16;
  } else if (name == "deepep") {  // DeepEP's usual: 256 experts, FP8 dispatch
    p->hidden = 7168, p->tokens = 4096, p->experts_per_rank = 256 / 8, p->topk = 8, p->dtype = DType::FP8_E4M3;
  } else {
    return false;
  }
  p->preset = name, p->skew = 0;
  p->domains = name == "seed-4x8" ? 4 : 1;
  p->ranks = 8 * p->domains;
  return true;
}

std::vector<Routing> make_routing(const Params& p, int64_t tokens, uint64_t seed) {
  const int E = p.num_experts(), K = p.topk;
  std::vector<double> inv_weight(E);
  for (int e = 0; e < E; ++e) inv_weight[e] = std::pow(static_cast<double>(e + 1), p.skew);
  std::vector<Routing> out(p.ranks);
  std::vector<std::pair<double, int>> keys(E);
  for (int r = 0; r < p.ranks; ++r) {
    std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(r));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::uniform_real_distribution<float> weight(0.0f, 1.0f);
    Routing& ro = out[r];
    ro.topk_idx.resize(static_cast<std::size_t>(tokens * K));
    ro.topk_weights.resize(ro.topk_idx.size());
    for (int64_t t = 0; t < tokens; ++t) {
      // Efraimidis-Spirakis: the K largest u^(1/w), i.e. the K smallest -log(u) / w.
      for (int e = 0; e < E; ++e) keys[e] = {-std::log(1.0 - u(rng)) * inv_weight[e], e};
      std::partial_sort(keys.begin(), keys.begin() + K, keys.end());
      for (int k = 0; k < K; ++k) {
        ro.topk_idx[t * K + k] = keys[k].second;
        ro.topk_weights[t * K + k] = weight(rng);
      }
    }
  }
  return out;
}

std::vector<std::vector<bf16>> make_rows(const Params& p, int64_t tokens, uint64_t seed) {
  std::vector<std::vector<bf16>> out(p.ranks);
  for (int r = 0; r < p.ranks; ++r) {
    std::mt19937_64 rng(seed * 7919u + 17u + static_cast<uint64_t>(r));
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    out[r].resize(static_cast<std::size_t>(tokens * p.hidden));
    for (auto& v : out[r]) v = float_to_bf16(value(rng));
  }
  return out;
}

PairCounts count_pairs(const Params& p, const std::vector<Routing>& routing, int64_t tokens) {
  const int R = p.ranks, K = p.topk, El = p.experts_per_rank, D = p.domains, Rd = p.ranks_per_domain();
  PairCounts c{R, D, std::vector<uint64_t>(static_cast<std::size_t>(R) * R, 0),
               std::vector<uint64_t>(static_cast<std::size_t>(R) * R, 0),
               std::vector<uint64_t>(static_cast<std::size_t>(R) * D, 0)};
  std::vector<int> on(R), in_domain(D);
  for (int s = 0; s < R; ++s) {
    for (int64_t t = 0; t < tokens; ++t) {
      std::fill(on.begin(), on.end(), 0);
      for (int k = 0; k < K; ++k) {
        const int64_t e = routing[s].topk_idx[t * K + k];
        if (e >= 0) ++on[e / El];
      }
      std::fill(in_domain.begin(), in_domain.end(), 0);
      for (int d = 0; d < R; ++d) {
        c.tokens[static_cast<std::size_t>(s) * R + d] += on[d] > 0;
        c.entries[static_cast<std::size_t>(s) * R + d] += on[d];
        in_domain[d / Rd] += on[d];
      }
      for (int e = 0; e < D; ++e) c.to_domain[static_cast<std::size_t>(s) * D + e] += in_domain[e] > 0;
    }
  }
  return c;
}

const char* op_name(Op op) { return op == Op::Dispatch ? "dispatch" : "combine"; }
const char* layout_name(TokenLayout layout) {
  return layout == TokenLayout::ExpertGrouped ? "grouped" : "received";
}
const char* dtype_name(DType dtype) { return dtype == DType::FP8_E4M3 ? "fp8" : "bf16"; }

namespace {
double mean(const std::vector<uint64_t>& v) {
  return v.empty() ? 0.0 : static_cast<double>(std::accumulate(v.begin(), v.end(), uint64_t{0})) / v.size();
}
}  // namespace

double CountedBytes::algbw_mean() const { return mean(algbw); }
double CountedBytes::busbw_mean() const { return mean(busbw); }

CountedBytes counted_bytes(const Params& p, const PairCounts& pairs, Op op) {
  const int R = p.ranks;
  const uint64_t row = static_cast<uint64_t>(op == Op::Dispatch ? p.dispatch_row_bytes() : p.combine_row_bytes());
  CountedBytes b{std::vector<uint64_t>(R, 0), std::vector<uint64_t>(R, 0)};
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < R; ++s) {
      b.algbw[r] += pairs.pair_tokens(s, r) * row;
      if (s != r) b.busbw[r] += pairs.pair_tokens(s, r) * row;
    }
  }
  return b;
}

uint64_t count_row_bytes(const Params& p) {
  layout::IntranodeShape s;
  s.ranks_per_domain = p.ranks;  // the group's count row (domain counts too, across domains)
  s.num_local_experts = p.experts_per_rank;
  s.num_domains = p.domains;
  return static_cast<uint64_t>(layout::IntranodeLayout(s).count_row_ints()) * 4;
}

uint64_t dispatch_minimum(const Params& p, const PairCounts& pairs, int s, int d, bool metadata,
                          uint64_t count_row_bytes) {
  if (!p.same_domain(s, d)) return 0;
  const uint64_t row = static_cast<uint64_t>(p.dispatch_row_bytes());  // scales included for FP8
  uint64_t b = kEntryBarrierBytes;
  for (int q = 0; q < p.ranks; ++q) {  // s's own tokens, and those it forwards
    if (!p.same_rail(s, q)) continue;
    b += pairs.pair_tokens(q, d) * (row + 16) + 12 * pairs.pair_entries(q, d);
    if (metadata) b += count_row_bytes + 4;  // count row and its flag, its own or relayed
  }
  return b;
}

uint64_t combine_minimum(const Params& p, const PairCounts& pairs, int s, int d) {
  if (!p.same_domain(s, d)) return 0;
  uint64_t rows = 0;
  for (int q = 0; q < p.ranks; ++q)  // s's own tokens, and the partials it sums
    if (p.same_rail(s, q)) rows += pairs.pair_tokens(q, d);
  // + the staged row header's seq (8 bytes) and num_entries (2)
  return rows * (static_cast<uint64_t>(p.combine_row_bytes()) + 10);
}

std::vector<std::vector<uint64_t>> nic_minimum(const Params& p, const PairCounts& pairs, Op op, bool metadata,
                                               int64_t tokens) {
  const std::size_t R = static_cast<std::size_t>(p.ranks);
  std::vector<std::vector<uint64_t>> m(R, std::vector<uint64_t>(R, 0));
  if (p.domains == 1) return m;
  layout::HierarchicalShape shape;
  shape.domain = {p.ranks_per_domain(), p.experts_per_rank, static_cast<int>(std::max<int64_t>(tokens, 1)),
                  static_cast<int>(p.hidden), p.topk, p.dtype};
  shape.num_domains = p.domains;
  const layout::HierarchicalLayout H(shape);
  const uint64_t wire = static_cast<uint64_t>(op == Op::Dispatch ? H.wire_dispatch_row_bytes() : H.wire_combine_row_bytes());
  const uint64_t C = static_cast<uint64_t>(op == Op::Dispatch ? shape.dispatch.chunk_tokens : shape.combine.chunk_tokens);
  const int Rd = p.ranks_per_domain();
  for (int g = 0; g < p.ranks; ++g) {
    for (int q = 0; q < p.ranks; ++q) {
      if (!p.same_rail(g, q) || p.same_domain(g, q)) continue;
      const uint64_t rows = op == Op::Dispatch ? pairs.domain_tokens(g, q / Rd) : pairs.domain_tokens(q, g / Rd);
      uint64_t b = rows * wire + 8 * ((rows + C - 1) / C + static_cast<uint64_t>(shape.lanes_per_peer));
      if (metadata) b += count_row_bytes(p) + 8;
      m[static_cast<std::size_t>(g)][static_cast<std::size_t>(q)] = b;
    }
  }
  return m;
}

PairMatrices minimum_matrices(const Params& p, const PairCounts& pairs, Op op, bool metadata,
                              uint64_t count_row_bytes) {
  const std::size_t R = static_cast<std::size_t>(p.ranks);
  PairMatrices m{std::vector<std::vector<uint64_t>>(R, std::vector<uint64_t>(R, 0)),
                 std::vector<std::vector<uint64_t>>(R, std::vector<uint64_t>(R, 0))};
  for (int s = 0; s < p.ranks; ++s) {
    for (int d = 0; d < p.ranks; ++d) {
      if (s == d) continue;
      if (op == Op::Dispatch) {
        m.written[s][d] = dispatch_minimum(p, pairs, s, d, metadata, count_row_bytes);
      } else {
        m.read[s][d] = combine_minimum(p, pairs, s, d);
        m.written[s][d] = p.same_domain(s, d) ? kEntryBarrierBytes : 0;
      }
    }
  }
  return m;
}

Spread spread_of(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) {  // nearest rank
    const std::size_t i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
  };
  s.min = v.front(), s.max = v.back(), s.p10 = at(0.10), s.p90 = at(0.90);
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

int sim_block_limit(int ranks) {
  long maps = 65530;
  std::ifstream("/proc/sys/vm/max_map_count") >> maps;
  return static_cast<int>(std::max(0L, (maps - 2048) / (2L * 224 * std::max(ranks, 1))));
}

std::string with_commas(uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

SimBound sim_bound(double time_us, const std::vector<std::vector<std::pair<std::string, double>>>& busy) {
  SimBound b;
  for (const auto& device : busy) {
    for (const auto& [name, ns] : device) {
      const double f = time_us > 0 ? ns / (time_us * 1e3) : 0.0;
      if (f > b.busiest_fraction) b.busiest = name, b.busiest_fraction = f;
    }
  }
  b.bound = b.busiest_fraction >= kSimBoundBusy ? b.busiest : "latency";
  return b;
}

}  // namespace railyard::bench
