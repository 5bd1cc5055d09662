// Railyard public API: the handle a dispatch leaves behind. Host only.
//
// A Handle owns one device allocation (sized by the Buffer's path for recv_capacity
// rows, from the Buffer's Allocator) holding what the metadata kernel computed (where every token goes, its top-k slots, the
// count matrix, the totals) and what the dispatch kernel added (the source and
// expert entries of every received row). It also remembers how the dispatch was
// made (tokens, layout, padding, bound, capacity). With it a later combine, and the
// backward pass's dispatch and combine, run without recomputing any routing metadata.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "railyard/runtime/allocator.hpp"

namespace railyard {

// How dispatch lays out the rows a rank receives (docs/semantics.md sections 4 and 5),
// and so how combine reads the expert outputs. Every rank passes the same layout.
enum class TokenLayout : int {
  Received = 0,       // one row per (source token, this rank), by source rank then token
  ExpertGrouped = 1,  // grouped by local expert, each group zero-padded to pad_multiple
};
const char* to_string(TokenLayout layout);

// The counts of a dispatch, copied to the host (blocking mode only).
struct DispatchCounts {
  int64_t num_recv_tokens = 0;    // received rows (true count)
  int64_t num_permuted_rows = 0;  // expert-grouped rows with padding (true count)
  std::vector<int64_t> tokens_per_expert;           // [E_local], padded
  std::vector<int64_t> unpadded_tokens_per_expert;  // [E_local]
};

// The same counts where the metadata kernel left them: device pointers into the
// handle, valid while the handle lives. In the bounded (no host sync) mode this is
// the only place they exist; overflow_* are 1 when the true count exceeds the bound.
struct DeviceCounts {
  const int64_t* num_recv_tokens = nullptr;
  const int64_t* num_permuted_rows = nullptr;
  const int64_t* overflow_recv = nullptr;
  const int64_t* overflow_permuted = nullptr;
  const int64_t* tokens_per_expert = nullptr;           // [E_local]
  const int64_t* unpadded_tokens_per_expert = nullptr;  // [E_local]
};

class Handle {
 public:
  Handle() = default;
  Handle(Handle&&) noexcept = default;
  Handle& operator=(Handle&&) noexcept = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  bool valid() const { return allocation_.get() != nullptr; }
  TokenLayout layout() const { return layout_; }
  int pad_multiple() const { return pad_multiple_; }
  // The caller's bound on output rows (received rows, or expert-grouped rows with
  // padding); empty in blocking mode.
  std::optional<int64_t> max_rows() const { return max_rows_; }
  int64_t num_tokens() const { return num_tokens_; }
  // Rows the dispatch wrote into its outputs, and the rows combine reads by default:
  // the exact count (blocking) or the bound (bounded; rows past the true count are
  // unwritten).
  int64_t output_rows() const { return output_rows_; }
  // Received rows the handle describes (its expert side).
  int64_t recv_capacity() const { return recv_capacity_; }
  // Host copy of the counts; empty in bounded mode.
  const std::optional<DispatchCounts>& counts() const { return counts_; }
  DeviceCounts device_counts() const;

  std::size_t bytes() const { return allocation_.bytes(); }

 private:
  friend class Buffer;
  runtime::DeviceAllocation allocation_;
  uint64_t buffer_id_ = 0;  // the Buffer that made it; another Buffer refuses it
  int num_local_experts_ = 0;
  const int64_t* totals_ = nullptr;  // the counts, inside the allocation (layout::Total order)
  TokenLayout layout_ = TokenLayout::Received;
  int pad_multiple_ = 1;
  std::optional<int64_t> max_rows_;
  int64_t num_tokens_ = 0;
  int64_t output_rows_ = 0;
  int64_t recv_capacity_ = 0;
  std::optional<DispatchCounts> counts_;
};

}  // namespace railyard
