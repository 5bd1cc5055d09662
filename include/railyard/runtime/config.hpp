// Railyard runtime: the configuration every rank of a buffer must agree on.
//
// A rank whose configuration differs from the others' would size or address the
// shared buffers differently and corrupt or hang the exchange. So at creation every
// rank allgathers its BufferConfig and compares: any mismatch is a ConfigMismatchError
// on EVERY rank, naming the field, its values and which ranks hold them. Host only.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "railyard/common/dtypes.cuh"
#include "railyard/common/status.hpp"

namespace railyard::runtime {

class Bootstrap;

// Bumped whenever the registered buffer's layout changes, so that ranks running
// different Railyard builds refuse to share a buffer instead of misreading it. 2: one
// dispatch counter per received chunk (the forwarding's), not two. 3: the dispatch and
// the combine each with their chunking (HierarchicalShape::dispatch, combine).
inline constexpr int64_t kBufferLayoutVersion = 3;

// Bytes every dispatched and combined row is padded to a multiple of: TMA bulk copies
// move 16-byte multiples between 16-byte aligned addresses.
inline constexpr int64_t kRowAlignBytes = 16;
// FP8 rows carry one fp32 scale per this many elements (reference::kFp8ScaleBlockElems).
inline constexpr int64_t kFp8ScaleBlockElems = 128;

struct BufferConfig {
  int64_t hidden = 0;               // elements per token row
  int64_t max_tokens_per_rank = 0;  // upper bound on any rank's tokens per call
  int64_t num_ranks = 0;            // ranks in the expert-parallel group
  int64_t num_experts = 0;          // experts in the whole group
  int64_t experts_per_rank = 0;     // num_experts / num_ranks
  int64_t ranks_per_domain = 0;     // ranks per NVLink domain (contiguous)
  DType dispatch_dtype = DType::BF16;
  DType combine_dtype = DType::BF16;
  int64_t max_top_k = 0;  // experts per token, at most
  int64_t layout_version = kBufferLayoutVersion;

  // Ok, or InvalidArgument listing every bad field with what was expected.
  Status validate() const;
  // Allgathers every rank's config. Throws ConfigMismatchError on every rank when any
  // field differs, then (all ranks agreeing) std::invalid_argument on every rank when
  // the config fails validate(). Validation comes second so that a rank never throws
  // alone while the others wait in a collective.
  void check_agreement(Bootstrap& bootstrap) const;
};

class ConfigMismatchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One field of a BufferConfig, by name, as an integer (DTypes by their enum value);
// the order is the wire order of check_agreement.
struct ConfigField {
  const char* name;
  int64_t value;
};
std::vector<ConfigField> config_fields(const BufferConfig& config);

const char* dtype_name(DType dtype);

}  // namespace railyard::runtime
