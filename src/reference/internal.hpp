// Helpers shared by the reference's translation units; not part of its interface.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "railyard/reference/reference.hpp"

namespace railyard::reference::detail {

// Throws std::invalid_argument whose message is the arguments streamed in order.
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw std::invalid_argument(message.str());
}

// One chosen expert of a token, with its prob copied bit for bit from the input.
struct Choice {
  int expert;
  float prob;
};

// Every token's choices, experts ascending: routes[t].
using TokenRoutes = std::vector<std::vector<Choice>>;

void validate_world(const World& world);

// Validates one rank's input (shapes, dtype, expert ids, duplicates) and normalises
// its routing. `rank` only names the argument in messages.
TokenRoutes validate_and_route(const World& world, const RankInput& input, int rank);

// Bytes in one row of `dtype`, and fp32 scales in one FP8 row (0 for BF16).
int64_t row_bytes(const World& world, DType dtype);
int64_t scales_per_row(const World& world, DType dtype);

// Appends row `row` of `from` to `to` (same dtype), scales included.
void append_row(const World& world, const HiddenRows& from, int64_t row, HiddenRows& to);
// Appends an all-zero row (hidden 0 bits, scales 0) to `to`.
void append_zero_row(const World& world, HiddenRows& to);

}  // namespace railyard::reference::detail
