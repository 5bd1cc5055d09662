// Validation of the world and of each rank's input, and routing normalisation:
// top-k slots and routing maps both become, per token, its chosen experts ascending
// with a prob each.
#include <algorithm>

#include "internal.hpp"

namespace railyard::reference::detail {

void validate_world(const World& world) {
  if (world.num_ranks < 1) fail("world.num_ranks = ", world.num_ranks, ": expected >= 1");
  if (world.ranks_per_domain < 1 || world.num_ranks % world.ranks_per_domain != 0) {
    fail("world.ranks_per_domain = ", world.ranks_per_domain,
         ": expected a positive divisor of world.num_ranks = ", world.num_ranks);
  }
  if (world.num_experts < 1 || world.num_experts % world.num_ranks != 0) {
    fail("world.num_experts = ", world.num_experts,
         ": expected a positive multiple of world.num_ranks = ", world.num_ranks);
  }
  if (world.hidden < 1) fail("world.hidden = ", world.hidden, ": expected >= 1");
  if (world.max_tokens < 0) fail("world.max_tokens = ", world.max_tokens, ": expected >= 0");
}

namespace {

TokenRoutes route_topk(const World& world, const TopkRouting& routing, int num_tokens, int rank) {
  const int64_t k = routing.num_topk;
  if (k < 1) fail("inputs[", rank, "].routing.num_topk = ", k, ": expected >= 1");
  const size_t slots = static_cast<size_t>(num_tokens) * k;
  if (routing.topk_idx.size() != slots) {
    fail("inputs[", rank, "].routing.topk_idx.size() = ", routing.topk_idx.size(),
         ": expected num_tokens * num_topk = ", slots);
  }
  if (routing.topk_weights.size() != slots) {
    fail("inputs[", rank, "].routing.topk_weights.size() = ", routing.topk_weights.size(),
         ": expected num_tokens * num_topk = ", slots);
  }
  TokenRoutes routes(num_tokens);
  for (int t = 0; t < num_tokens; ++t) {
    for (int64_t slot = 0; slot < k; ++slot) {
      const int64_t expert = routing.topk_idx[t * k + slot];
      if (expert < -1 || expert >= world.num_experts) {
        fail("inputs[", rank, "].routing.topk_idx[", t, "][", slot, "] = ", expert,
             ": expected an expert id in [-1, ", world.num_experts, ")");
      }
      if (expert == -1) continue;
      for (const Choice& earlier : routes[t]) {
        if (earlier.expert == expert) {
          fail("inputs[", rank, "].routing.topk_idx[", t, "][", slot, "] = ", expert,
               ": expected experts distinct within a token, but an earlier slot holds it too");
        }
      }
      routes[t].push_back({static_cast<int>(expert), routing.topk_weights[t * k + slot]});
    }
    std::sort(routes[t].begin(), routes[t].end(),
              [](const Choice& a, const Choice& b) { return a.expert < b.expert; });
  }
  return routes;
}

TokenRoutes route_map(const World& world, const MapRouting& routing, int num_tokens, int rank) {
  const int64_t e = world.num_experts;
  const size_t cells = static_cast<size_t>(num_tokens) * e;
  if (routing.routing_map.size() != cells) {
    fail("inputs[", rank, "].routing.routing_map.size() = ", routing.routing_map.size(),
         ": expected num_tokens * num_experts = ", cells);
  }
  if (routing.probs.size() != cells) {
    fail("inputs[", rank, "].routing.probs.size() = ", routing.probs.size(),
         ": expected num_tokens * num_experts = ", cells);
  }
  TokenRoutes routes(num_tokens);
  for (int t = 0; t < num_tokens; ++t) {
    for (int expert = 0; expert < e; ++expert) {
      const uint8_t chosen = routing.routing_map[t * e + expert];
      if (chosen > 1) {
        fail("inputs[", rank, "].routing.routing_map[", t, "][", expert, "] = ", int{chosen},
             ": expected 0 or 1");
      }
      if (chosen == 1) routes[t].push_back({expert, routing.probs[t * e + expert]});
    }
  }
  return routes;
}

}  // namespace

TokenRoutes validate_and_route(const World& world, const RankInput& input, int rank) {
  if (input.num_tokens < 0 || input.num_tokens > world.max_tokens) {
    fail("inputs[", rank, "].num_tokens = ", input.num_tokens,
         ": expected in [0, world.max_tokens = ", world.max_tokens, "]");
  }
  const HiddenRows& hidden = input.hidden;
  if (hidden.dtype != DType::BF16 && hidden.dtype != DType::FP8_E4M3) {
    fail("inputs[", rank, "].hidden.dtype: expected BF16 or FP8_E4M3");
  }
  if (hidden.dtype == DType::FP8_E4M3 && world.hidden % kFp8ScaleBlockElems != 0) {
    fail("world.hidden = ", world.hidden, ": expected a multiple of ", kFp8ScaleBlockElems,
         " for FP8 rows (inputs[", rank, "].hidden.dtype)");
  }
  const size_t bytes = static_cast<size_t>(input.num_tokens) * row_bytes(world, hidden.dtype);
  if (hidden.bytes.size() != bytes) {
    fail("inputs[", rank, "].hidden.bytes.size() = ", hidden.bytes.size(),
         ": expected num_tokens * hidden * element bytes = ", bytes);
  }
  const size_t scales = static_cast<size_t>(input.num_tokens) * scales_per_row(world, hidden.dtype);
  if (hidden.scales.size() != scales) {
    fail("inputs[", rank, "].hidden.scales.size() = ", hidden.scales.size(),
         ": expected num_tokens * hidden / ", kFp8ScaleBlockElems,
         " for FP8, 0 for BF16, = ", scales);
  }
  if (const auto* topk = std::get_if<TopkRouting>(&input.routing)) {
    return route_topk(world, *topk, input.num_tokens, rank);
  }
  return route_map(world, std::get<MapRouting>(input.routing), input.num_tokens, rank);
}

}  // namespace railyard::reference::detail
