// Table-driven argument checks for the kernel tests: one valid argument struct, one
// changed field a row, and the Status the launcher must answer (its code and its
// whole message). domain_refusals() is the table of check_domain
// (kernels/intranode/domain_checks.hpp), which every intra-node launcher shares.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "railyard/common/dtypes.cuh"
#include "railyard/common/status.hpp"

namespace railyard::test {

template <class Args>
struct Refusal {
  std::string change;                   // what the row changes, for the failure message
  std::function<void(Args&)> mutate;    // applied to a copy of the valid arguments
  StatusCode code = StatusCode::InvalidArgument;
  std::string message;                  // the whole expected message
};

// For every row: `check(base with the row's change)` answers the row's code and message.
template <class Args, class Check>
void expect_refusals(const Args& base, const std::vector<Refusal<Args>>& rows, Check&& check) {
  for (const Refusal<Args>& row : rows) {
    SCOPED_TRACE(row.change);
    Args a = base;
    row.mutate(a);
    const Status st = check(a);
    EXPECT_EQ(st.code(), row.code) << st.to_string();
    EXPECT_EQ(st.message(), row.message);
  }
}

// `p` moved by `bytes`: a misaligned pointer of the same type.
template <class T>
T* shift_bytes(T* p, int bytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const uint8_t, uint8_t>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + bytes);
}

// The rows of check_domain for arguments whose `domain` is valid with shape
// {num_ranks 2, num_local_experts El, max_tokens <= 2^29, hidden 16, max_topk <= 2 x El,
// BF16}; `kernel` as the launcher names itself ("dispatch", "combine", "metadata").
template <class Args>
std::vector<Refusal<Args>> domain_refusals(const std::string& kernel, int local_experts) {
  const std::string who = "intranode " + kernel + ": domain.";
  const std::string topk_range = "1.." + std::to_string(2 * local_experts);
  using R = Refusal<Args>;
  const StatusCode bad = StatusCode::InvalidArgument;
  return {
      R{"no ranks", [](Args& a) { a.domain.shape.ranks_per_domain = 0; }, bad, who + "shape.ranks_per_domain is 0; expected 1..72"},
      R{"73 ranks", [](Args& a) { a.domain.shape.ranks_per_domain = 73; }, bad,
        who + "shape.ranks_per_domain is 73; expected 1..72"},
      R{"no local experts", [](Args& a) { a.domain.shape.num_local_experts = 0; }, bad,
        who + "shape.num_local_experts is 0; expected 1..256"},
      R{"257 local experts", [](Args& a) { a.domain.shape.num_local_experts = 257; }, bad,
        who + "shape.num_local_experts is 257; expected 1..256"},
      R{"top-0", [](Args& a) { a.domain.shape.max_topk = 0; }, bad,
        who + "shape.max_topk is 0; expected " + topk_range},
      R{"top-k above the expert count", [=](Args& a) { a.domain.shape.max_topk = 2 * local_experts + 1; }, bad,
        who + "shape.max_topk is " + std::to_string(2 * local_experts + 1) + "; expected " + topk_range},
      R{"negative max_tokens", [](Args& a) { a.domain.shape.max_tokens = -1; }, bad,
        who + "shape.max_tokens is -1; expected >= 0"},
      R{"2 x 2^30 staging rows", [](Args& a) { a.domain.shape.max_tokens = 1 << 30; }, bad,
        who + "shape.ranks_per_domain x shape.max_tokens exceeds 2^31 - 1 rows"},
      R{"FP32 dispatch", [](Args& a) { a.domain.shape.dispatch_dtype = DType::FP32; }, bad,
        who + "shape.dispatch_dtype: expected BF16 or FP8_E4M3"},
      R{"24-byte rows", [](Args& a) { a.domain.shape.hidden = 12; }, bad,
        who + "shape.hidden is 12; expected a positive count whose rows are a multiple of 16 bytes"},
      R{"hidden 0", [](Args& a) { a.domain.shape.hidden = 0; }, bad,
        who + "shape.hidden is 0; expected a positive count whose rows are a multiple of 16 bytes"},
      R{"FP8 without whole scale blocks",
        [](Args& a) {
          a.domain.shape.dispatch_dtype = DType::FP8_E4M3;
          a.domain.shape.hidden = 64;
        },
        bad, who + "shape.hidden is 64; FP8 needs a multiple of 128"},
      R{"rank past the domain", [](Args& a) { a.domain.rank = 2; }, bad, who + "rank is 2; expected 0..1"},
      R{"negative rank", [](Args& a) { a.domain.rank = -1; }, bad, who + "rank is -1; expected 0..1"},
      R{"a peer without a buffer", [](Args& a) { a.domain.peers.ptr[1] = nullptr; }, bad,
        who + "peers.ptr[1] is null"},
  };
}

}  // namespace railyard::test
