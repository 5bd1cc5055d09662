// Railyard intra-node kernels: the argument checks every launcher shares (host only).
// The shape fixes the registered buffer's layout, so metadata, dispatch and combine
// accept exactly the same shapes; one function says which.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "kernels/intranode/domain.hpp"
#include "railyard/common/status.hpp"

namespace railyard::kernels::intranode {

inline std::string check_range(int64_t lo, int64_t hi) { return std::to_string(lo) + ".." + std::to_string(hi); }

// Checks `domain` (its shape, rank and peer table); errors read
// "intranode <kernel>: <argument> is <value>; expected <values>".
inline Status check_domain(const DomainParams& domain, const char* kernel) {
  const layout::IntranodeShape& s = domain.shape;
  const std::string who = std::string("intranode ") + kernel + ": domain.";
  if (s.ranks_per_domain < 1 || s.ranks_per_domain > layout::kMaxRanksPerDomain)
    return Status::invalid_argument(who + "shape.ranks_per_domain is " + std::to_string(s.ranks_per_domain) + "; expected " +
                                    check_range(1, layout::kMaxRanksPerDomain));
  if (s.num_domains < 1 || s.num_domains > s.ranks_per_domain || s.ranks_per_domain % s.num_domains != 0)
    return Status::invalid_argument(who + "shape.num_domains is " + std::to_string(s.num_domains) +
                                    "; expected a divisor of shape.ranks_per_domain (" + std::to_string(s.ranks_per_domain) +
                                    "): the NVLink domains the ranks form");
  if (s.num_local_experts < 1 || s.num_local_experts > layout::kMaxLocalExperts)
    return Status::invalid_argument(who + "shape.num_local_experts is " + std::to_string(s.num_local_experts) +
                                    "; expected " + check_range(1, layout::kMaxLocalExperts));
  if (s.max_topk < 1 || s.max_topk > s.ranks_per_domain * s.num_local_experts)
    return Status::invalid_argument(who + "shape.max_topk is " + std::to_string(s.max_topk) + "; expected " +
                                    check_range(1, int64_t{s.ranks_per_domain} * s.num_local_experts));
  if (s.max_tokens < 0)
    return Status::invalid_argument(who + "shape.max_tokens is " + std::to_string(s.max_tokens) + "; expected >= 0");
  if (int64_t{s.ranks_per_domain} * s.max_tokens > std::numeric_limits<int32_t>::max())
    return Status::invalid_argument(who + "shape.ranks_per_domain x shape.max_tokens exceeds 2^31 - 1 rows");
  if (s.dispatch_dtype != DType::BF16 && s.dispatch_dtype != DType::FP8_E4M3)
    return Status::invalid_argument(who + "shape.dispatch_dtype: expected BF16 or FP8_E4M3");
  // Rows move by TMA in whole 16-byte units, as dispatch rows and as BF16 combine rows.
  if (s.hidden < 1 || (int64_t{s.hidden} * dtype_bytes(s.dispatch_dtype)) % 16 != 0 || (int64_t{s.hidden} * 2) % 16 != 0)
    return Status::invalid_argument(who + "shape.hidden is " + std::to_string(s.hidden) +
                                    "; expected a positive count whose rows are a multiple of 16 bytes");
  if (s.dispatch_dtype == DType::FP8_E4M3 && s.hidden % layout::kFp8ScaleBlock != 0)
    return Status::invalid_argument(who + "shape.hidden is " + std::to_string(s.hidden) +
                                    "; FP8 needs a multiple of " + std::to_string(layout::kFp8ScaleBlock));
  if (domain.rank < 0 || domain.rank >= s.ranks_per_domain)
    return Status::invalid_argument(who + "rank is " + std::to_string(domain.rank) + "; expected " +
                                    check_range(0, s.ranks_per_domain - 1));
  if (domain.nvlink_ranks < 0 || domain.nvlink_first < 0 || domain.nvlink_end() > s.ranks_per_domain)
    return Status::invalid_argument(who + "nvlink_first, nvlink_ranks are " + std::to_string(domain.nvlink_first) +
                                    ", " + std::to_string(domain.nvlink_ranks) + "; expected ranks within " +
                                    check_range(0, s.ranks_per_domain - 1));
  if (domain.rank < domain.nvlink_begin() || domain.rank >= domain.nvlink_end())
    return Status::invalid_argument(who + "rank is " + std::to_string(domain.rank) + "; expected one of its NVLink ranks " +
                                    check_range(domain.nvlink_begin(), domain.nvlink_end() - 1));
  for (int r = domain.nvlink_begin(); r < domain.nvlink_end(); ++r)
    if (!domain.peers.ptr[r])
      return Status::invalid_argument(who + "peers.ptr[" + std::to_string(r) + "] is null");
  return Status::success();
}

}  // namespace railyard::kernels::intranode
