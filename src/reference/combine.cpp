// Combine from the received layout, unpermute, and combine from the permuted layout.
#include "internal.hpp"

namespace railyard::reference {

using detail::fail;

namespace {

void validate_handle(const World& world, const DispatchResult& handle) {
  if (handle.num_tokens.size() != static_cast<size_t>(world.num_ranks) ||
      handle.ranks.size() != static_cast<size_t>(world.num_ranks)) {
    fail("handle: expected num_tokens and ranks of size world.num_ranks = ", world.num_ranks);
  }
  for (int d = 0; d < world.num_ranks; ++d) {
    const ReceivedRows& received = handle.ranks[d];
    for (int64_t row = 0; row < received.num_rows(); ++row) {
      const int r = received.src_rank[row];
      if (r < 0 || r >= world.num_ranks || received.src_token[row] < 0 ||
          received.src_token[row] >= handle.num_tokens[r]) {
        fail("handle.ranks[", d, "] row ", row, ": expected a source (rank, token) in range");
      }
    }
  }
}

// The hidden part of combine. y[d] is [handle.ranks[d].num_rows(), H]; returns the
// [T, H] output of every home rank in the documented summation order.
std::vector<std::vector<bf16>> combine_hidden(const World& world, const DispatchResult& handle,
                                              const std::vector<std::span<const bf16>>& y) {
  const int64_t h_size = world.hidden;
  // row_of[d][r][t]: the row of token (r, t) on rank d, or -1 where d holds none.
  std::vector<std::vector<std::vector<int64_t>>> row_of(world.num_ranks);
  for (int d = 0; d < world.num_ranks; ++d) {
    for (int r = 0; r < world.num_ranks; ++r) row_of[d].emplace_back(handle.num_tokens[r], -1);
    const ReceivedRows& received = handle.ranks[d];
    for (int64_t row = 0; row < received.num_rows(); ++row) {
      row_of[d][received.src_rank[row]][received.src_token[row]] = row;
    }
  }
  std::vector<std::vector<bf16>> out(world.num_ranks);
  for (int r = 0; r < world.num_ranks; ++r) {
    out[r].resize(static_cast<size_t>(handle.num_tokens[r]) * h_size);
    for (int t = 0; t < handle.num_tokens[r]; ++t) {
      for (int64_t h = 0; h < h_size; ++h) {
        float total = 0.0f;
        for (int n = 0; n < world.num_domains(); ++n) {
          float partial = 0.0f;
          bool any = false;
          for (int d = 0; d < world.num_ranks; ++d) {
            const int64_t row = row_of[d][r][t];
            if (world.domain_of_rank(d) != n || row < 0) continue;
            partial += bf16_to_float(y[d][row * h_size + h]);
            any = true;
          }
          // Partials travel between domains as BF16; the home domain's own partial is
          // rounded too, so every domain is treated alike.
          if (any) total += bf16_to_float(float_to_bf16(partial));
        }
        out[r][t * h_size + h] = float_to_bf16(total);
      }
    }
  }
  return out;
}

// Every rank passes probs, or none does; returns which.
bool probs_given(std::span<const CombineInput> inputs) {
  const bool given = inputs[0].probs.has_value();
  for (size_t d = 0; d < inputs.size(); ++d) {
    if (inputs[d].probs.has_value() != given) {
      fail("inputs[", d, "].probs: expected ", given ? "probs" : "no probs",
           " like inputs[0] (every rank passes probs or none does)");
    }
  }
  return given;
}

void check_input_sizes(const World& world, std::span<const CombineInput> inputs, int d,
                       int64_t rows, int64_t probs_per_row, bool with_probs) {
  const size_t hidden = static_cast<size_t>(rows) * world.hidden;
  if (inputs[d].hidden.size() != hidden) {
    fail("inputs[", d, "].hidden.size() = ", inputs[d].hidden.size(),
         ": expected rows * hidden = ", hidden);
  }
  const size_t probs = static_cast<size_t>(rows) * probs_per_row;
  if (with_probs && inputs[d].probs->size() != probs) {
    fail("inputs[", d, "].probs->size() = ", inputs[d].probs->size(), ": expected ", probs);
  }
}

std::vector<CombineOutput> make_outputs(const World& world, const DispatchResult& handle,
                                        std::vector<std::vector<bf16>> hidden, bool with_probs) {
  std::vector<CombineOutput> outputs(world.num_ranks);
  for (int r = 0; r < world.num_ranks; ++r) {
    outputs[r].hidden = std::move(hidden[r]);
    if (with_probs) {
      outputs[r].probs.assign(static_cast<size_t>(handle.num_tokens[r]) * world.num_experts, 0.0f);
    }
  }
  return outputs;
}

void check_input_count(const World& world, std::span<const CombineInput> inputs) {
  if (inputs.size() != static_cast<size_t>(world.num_ranks)) {
    fail("inputs.size() = ", inputs.size(), ": expected world.num_ranks = ", world.num_ranks);
  }
}

}  // namespace

std::vector<CombineOutput> combine(const World& world, const DispatchResult& handle,
                                   std::span<const CombineInput> inputs) {
  detail::validate_world(world);
  validate_handle(world, handle);
  check_input_count(world, inputs);
  const bool with_probs = probs_given(inputs);
  const int local_experts = world.num_local_experts();
  std::vector<std::span<const bf16>> y;
  for (int d = 0; d < world.num_ranks; ++d) {
    check_input_sizes(world, inputs, d, handle.ranks[d].num_rows(), local_experts, with_probs);
    y.emplace_back(inputs[d].hidden);
  }
  std::vector<CombineOutput> outputs =
      make_outputs(world, handle, combine_hidden(world, handle, y), with_probs);
  if (!with_probs) return outputs;
  for (int d = 0; d < world.num_ranks; ++d) {
    const ReceivedRows& received = handle.ranks[d];
    for (int64_t row = 0; row < received.num_rows(); ++row) {
      for (int j = 0; j < local_experts; ++j) {
        if (!received.routing_map[row * local_experts + j]) continue;
        const int64_t cell = static_cast<int64_t>(received.src_token[row]) * world.num_experts +
                             d * local_experts + j;
        outputs[received.src_rank[row]].probs[cell] = (*inputs[d].probs)[row * local_experts + j];
      }
    }
  }
  return outputs;
}

std::vector<bf16> unpermute(const World& world, const ReceivedRows& received,
                            const PermutedRows& permuted, std::span<const bf16> permuted_hidden) {
  const int64_t h_size = world.hidden;
  if (permuted_hidden.size() != static_cast<size_t>(permuted.num_rows() * h_size)) {
    fail("permuted_hidden.size() = ", permuted_hidden.size(),
         ": expected permuted.num_rows() * hidden = ", permuted.num_rows() * h_size);
  }
  std::vector<float> sums(static_cast<size_t>(received.num_rows() * h_size), 0.0f);
  // Permuted rows are grouped by local expert ascending, so walking them in order adds
  // each received row's expert outputs in ascending expert order.
  for (int64_t p = 0; p < permuted.num_rows(); ++p) {
    const int64_t r = permuted.recv_row[p];
    if (r < 0) continue;  // padding
    if (r >= received.num_rows()) {
      fail("permuted.recv_row[", p, "] = ", r,
           ": expected < received.num_rows() = ", received.num_rows());
    }
    for (int64_t h = 0; h < h_size; ++h) {
      sums[r * h_size + h] += bf16_to_float(permuted_hidden[p * h_size + h]);
    }
  }
  std::vector<bf16> y(sums.size());
  for (size_t i = 0; i < sums.size(); ++i) y[i] = float_to_bf16(sums[i]);
  return y;
}

std::vector<CombineOutput> combine_with_unpermute(const World& world,
                                                  const PermutedDispatchResult& handle,
                                                  std::span<const CombineInput> inputs) {
  detail::validate_world(world);
  validate_handle(world, handle.received);
  check_input_count(world, inputs);
  if (handle.ranks.size() != static_cast<size_t>(world.num_ranks)) {
    fail("handle.ranks.size() = ", handle.ranks.size(),
         ": expected world.num_ranks = ", world.num_ranks);
  }
  const bool with_probs = probs_given(inputs);
  std::vector<std::vector<bf16>> unpermuted;
  for (int d = 0; d < world.num_ranks; ++d) {
    check_input_sizes(world, inputs, d, handle.ranks[d].num_rows(), 1, with_probs);
    unpermuted.push_back(
        unpermute(world, handle.received.ranks[d], handle.ranks[d], inputs[d].hidden));
  }
  const std::vector<std::span<const bf16>> y(unpermuted.begin(), unpermuted.end());
  std::vector<CombineOutput> outputs =
      make_outputs(world, handle.received, combine_hidden(world, handle.received, y), with_probs);
  if (!with_probs) return outputs;
  const int local_experts = world.num_local_experts();
  for (int d = 0; d < world.num_ranks; ++d) {
    const ReceivedRows& received = handle.received.ranks[d];
    const PermutedRows& permuted = handle.ranks[d];
    for (int64_t p = 0; p < permuted.num_rows(); ++p) {
      const int64_t r = permuted.recv_row[p];
      if (r < 0) continue;
      const int64_t cell = static_cast<int64_t>(received.src_token[r]) * world.num_experts +
                           d * local_experts + permuted.local_expert_of_row(p);
      outputs[received.src_rank[r]].probs[cell] = (*inputs[d].probs)[p];
    }
  }
  return outputs;
}

}  // namespace railyard::reference
