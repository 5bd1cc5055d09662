// Dispatch to the received layout, and permute to the expert-grouped layout.
#include "internal.hpp"

namespace railyard::reference {

using detail::fail;

DispatchResult dispatch(const World& world, std::span<const RankInput> inputs,
                        const DispatchOptions& options) {
  detail::validate_world(world);
  if (inputs.size() != static_cast<size_t>(world.num_ranks)) {
    fail("inputs.size() = ", inputs.size(), ": expected world.num_ranks = ", world.num_ranks);
  }
  if (options.max_recv_rows && *options.max_recv_rows < 0) {
    fail("options.max_recv_rows = ", *options.max_recv_rows, ": expected >= 0");
  }
  std::vector<detail::TokenRoutes> routes;
  for (int r = 0; r < world.num_ranks; ++r) {
    routes.push_back(detail::validate_and_route(world, inputs[r], r));
    if (inputs[r].hidden.dtype != inputs[0].hidden.dtype) {
      fail("inputs[", r, "].hidden.dtype: expected the dtype of inputs[0].hidden");
    }
  }

  const int local_experts = world.num_local_experts();
  DispatchResult result;
  for (const RankInput& input : inputs) result.num_tokens.push_back(input.num_tokens);
  result.ranks.resize(world.num_ranks);
  for (int d = 0; d < world.num_ranks; ++d) {
    ReceivedRows& received = result.ranks[d];
    received.hidden.dtype = inputs[0].hidden.dtype;
    for (int r = 0; r < world.num_ranks; ++r) {
      for (int t = 0; t < inputs[r].num_tokens; ++t) {
        std::vector<float> probs(local_experts, 0.0f);
        std::vector<uint8_t> chosen(local_experts, 0);
        bool any = false;
        for (const detail::Choice& choice : routes[r][t]) {
          if (world.rank_of_expert(choice.expert) != d) continue;
          const int j = choice.expert % local_experts;
          probs[j] = choice.prob;
          chosen[j] = 1;
          any = true;
        }
        if (!any) continue;
        const int64_t row = received.num_recv_tokens++;
        if (options.max_recv_rows && row >= *options.max_recv_rows) continue;
        detail::append_row(world, inputs[r].hidden, t, received.hidden);
        received.probs.insert(received.probs.end(), probs.begin(), probs.end());
        received.routing_map.insert(received.routing_map.end(), chosen.begin(), chosen.end());
        received.src_rank.push_back(r);
        received.src_token.push_back(t);
      }
    }
    received.overflow = options.max_recv_rows && received.num_recv_tokens > *options.max_recv_rows;
  }
  return result;
}

int PermutedRows::local_expert_of_row(int64_t row) const {
  int64_t end = 0;
  for (size_t j = 0; j < tokens_per_expert.size(); ++j) {
    end += tokens_per_expert[j];
    if (row < end) return static_cast<int>(j);
  }
  fail("local_expert_of_row: row = ", row, ": expected in [0, num_permuted_rows = ", end, ")");
}

PermutedRows permute(const World& world, const ReceivedRows& received,
                     const PermuteOptions& options) {
  detail::validate_world(world);
  if (options.pad_multiple < 1) {
    fail("options.pad_multiple = ", options.pad_multiple, ": expected >= 1");
  }
  if (options.max_permuted_rows && *options.max_permuted_rows < 0) {
    fail("options.max_permuted_rows = ", *options.max_permuted_rows, ": expected >= 0");
  }
  if (received.num_rows() != received.num_recv_tokens) {
    fail("received.num_rows() = ", received.num_rows(),
         ": expected all num_recv_tokens = ", received.num_recv_tokens,
         " rows (permute needs a dispatch without capacity bound)");
  }
  const int local_experts = world.num_local_experts();
  PermutedRows permuted;
  permuted.hidden.dtype = received.hidden.dtype;
  const auto keep = [&](int64_t row) {
    return !options.max_permuted_rows || row < *options.max_permuted_rows;
  };
  for (int j = 0; j < local_experts; ++j) {
    int64_t count = 0;
    for (int64_t r = 0; r < received.num_rows(); ++r) {
      if (!received.routing_map[r * local_experts + j]) continue;
      ++count;
      if (!keep(permuted.num_permuted_rows++)) continue;
      detail::append_row(world, received.hidden, r, permuted.hidden);
      permuted.probs.push_back(received.probs[r * local_experts + j]);
      permuted.recv_row.push_back(r);
    }
    const int64_t padded =
        (count + options.pad_multiple - 1) / options.pad_multiple * options.pad_multiple;
    for (int64_t i = count; i < padded; ++i) {
      if (!keep(permuted.num_permuted_rows++)) continue;
      detail::append_zero_row(world, permuted.hidden);
      permuted.probs.push_back(0.0f);
      permuted.recv_row.push_back(-1);
    }
    permuted.unpadded_tokens_per_expert.push_back(count);
    permuted.tokens_per_expert.push_back(padded);
  }
  permuted.overflow =
      options.max_permuted_rows && permuted.num_permuted_rows > *options.max_permuted_rows;
  return permuted;
}

PermutedDispatchResult dispatch_with_permute(const World& world, std::span<const RankInput> inputs,
                                             const PermuteOptions& options) {
  PermutedDispatchResult result;
  result.received = dispatch(world, inputs);
  for (const ReceivedRows& received : result.received.ranks) {
    result.ranks.push_back(permute(world, received, options));
  }
  return result;
}

}  // namespace railyard::reference
