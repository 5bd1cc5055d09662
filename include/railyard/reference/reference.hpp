// Railyard reference semantics: dispatch, permute, combine and unpermute over a whole
// expert-parallel group, computed on the host in plain C++.
//
// This is the executable form of docs/semantics.md, and the oracle every kernel is
// compared with bit for bit. It takes every rank's inputs at once and returns every
// rank's outputs. It is written for clarity, not speed. Invalid arguments throw
// std::invalid_argument with a message naming the argument and the expected value.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "railyard/common/dtypes.cuh"

namespace railyard::reference {

// FP8 rows carry one fp32 scale per this many consecutive elements.
inline constexpr int kFp8ScaleBlockElems = 128;

// The expert-parallel group. Ranks are numbered 0..num_ranks-1; NVLink domain n
// holds ranks [n * ranks_per_domain, (n + 1) * ranks_per_domain). Expert e lives on
// rank e / num_local_experts() as its local expert e % num_local_experts().
struct World {
  int num_ranks = 1;
  int ranks_per_domain = 1;
  int num_experts = 1;
  int hidden = 1;      // elements per token row (H)
  int max_tokens = 0;  // the largest token count any rank may pass

  int num_local_experts() const { return num_experts / num_ranks; }
  int num_domains() const { return num_ranks / ranks_per_domain; }
  int domain_of_rank(int rank) const { return rank / ranks_per_domain; }
  int rank_of_expert(int expert) const { return expert / num_local_experts(); }
};

// A [num_rows, hidden] matrix of token rows in a dispatch dtype, kept as raw bytes
// because dispatch moves bytes and never reinterprets them.
struct HiddenRows {
  DType dtype = DType::BF16;   // BF16 or FP8_E4M3
  std::vector<uint8_t> bytes;  // row-major, hidden * dtype_bytes(dtype) bytes a row
  std::vector<float> scales;   // FP8 only: [num_rows, hidden / kFp8ScaleBlockElems]
};

// BF16 rows holding exactly these values.
HiddenRows bf16_rows(std::span<const bf16> values);

// FP8 rows for test data: each block of kFp8ScaleBlockElems elements of a row gets
// scale = amax / 448 in fp32 (scale 1 where amax is 0) and codes
// float_to_e4m3(value / scale); the value it stands for is e4m3_to_float(code) * scale.
// `values` is [num_rows, hidden]; hidden must be a multiple of kFp8ScaleBlockElems
// and every value finite.
HiddenRows quantize_fp8_rows(std::span<const float> values, int hidden);
HiddenRows quantize_fp8_rows(std::span<const bf16> values, int hidden);

// The values `num_rows` rows of `rows` stand for, rounded to BF16: the rows
// themselves (BF16), or code x its block's scale (FP8). Tests use them as expert
// outputs of the dispatched rows. [num_rows, hidden]
std::vector<bf16> rows_as_bf16(const HiddenRows& rows, int64_t num_rows, int64_t hidden);

// Routing as top-k slots: token t chose expert topk_idx[t][k] with weight
// topk_weights[t][k]; -1 marks an unused slot (its weight is ignored).
struct TopkRouting {
  int num_topk = 1;                 // K
  std::vector<int64_t> topk_idx;    // [T, K]
  std::vector<float> topk_weights;  // [T, K]
};

// Routing as a dense map: token t chose expert e iff routing_map[t][e] is 1, with
// prob probs[t][e]; probs of experts not chosen are ignored.
struct MapRouting {
  std::vector<uint8_t> routing_map;  // bool [T, E], each 0 or 1
  std::vector<float> probs;          // [T, E]
};

struct RankInput {
  int num_tokens = 0;  // T of this rank, 0 <= T <= World::max_tokens
  HiddenRows hidden;   // [T, H]; every rank passes the same dtype
  std::variant<TopkRouting, MapRouting> routing;
};

struct DispatchOptions {
  // Capacity bound on received rows per rank (the no-host-sync mode): rows whose
  // index is >= the bound are not written and the rank's overflow flag is set.
  std::optional<int64_t> max_recv_rows;
};

// The received layout on one rank d: one row per (source token, d) pair where the
// token chose at least one expert on d, by source rank then source token ascending.
struct ReceivedRows {
  int64_t num_recv_tokens = 0;       // the true count, also when it exceeds the bound
  bool overflow = false;             // num_recv_tokens > max_recv_rows
  HiddenRows hidden;                 // [num_rows(), H], scales too for FP8
  std::vector<float> probs;          // [num_rows(), E_local], 0 where not chosen
  std::vector<uint8_t> routing_map;  // [num_rows(), E_local]
  std::vector<int32_t> src_rank;     // [num_rows()]
  std::vector<int32_t> src_token;    // [num_rows()]

  // Rows written: min(num_recv_tokens, max_recv_rows).
  int64_t num_rows() const { return static_cast<int64_t>(src_rank.size()); }
};

struct DispatchResult {
  std::vector<int> num_tokens;      // T of every home rank (combine's output rows)
  std::vector<ReceivedRows> ranks;  // indexed by receiving rank
};

DispatchResult dispatch(const World& world, std::span<const RankInput> inputs,
                        const DispatchOptions& options = {});

struct PermuteOptions {
  int pad_multiple = 1;  // each expert's row count is padded up to a multiple of this
  // Capacity bound on permuted rows per rank, padding rows included.
  std::optional<int64_t> max_permuted_rows;
};

// The permuted (expert-grouped) layout on one rank: for local expert j ascending, the
// received rows routed to j in received order, then zero rows up to a multiple of
// pad_multiple.
struct PermutedRows {
  int64_t num_permuted_rows = 0;                    // true P = sum of tokens_per_expert
  bool overflow = false;                            // num_permuted_rows > max_permuted_rows
  std::vector<int64_t> tokens_per_expert;           // [E_local], padded
  std::vector<int64_t> unpadded_tokens_per_expert;  // [E_local]
  HiddenRows hidden;                                // [num_rows(), H]; padding rows 0
  std::vector<float> probs;                         // [num_rows()]; padding rows 0
  std::vector<int64_t> recv_row;                    // [num_rows()]; padding rows -1

  // Rows written: min(num_permuted_rows, max_permuted_rows).
  int64_t num_rows() const { return static_cast<int64_t>(recv_row.size()); }
  // The local expert whose group holds permuted row `row` (padding included).
  int local_expert_of_row(int64_t row) const;
};

// Groups one rank's received rows by local expert. `received` must be unbounded
// (no rows dropped).
PermutedRows permute(const World& world, const ReceivedRows& received,
                     const PermuteOptions& options);

struct PermutedDispatchResult {
  DispatchResult received;          // the unbounded received layout (the handle)
  std::vector<PermutedRows> ranks;  // indexed by receiving rank
};

// Megatron Core's dispatch_with_permute: dispatch, then permute on every rank.
PermutedDispatchResult dispatch_with_permute(const World& world, std::span<const RankInput> inputs,
                                             const PermuteOptions& options);

// What one expert rank hands to combine.
struct CombineInput {
  // BF16 rows: [received.num_rows(), H] for combine, [permuted.num_rows(), H] for
  // combine_with_unpermute.
  std::vector<bf16> hidden;
  // No value: no probs combine. Otherwise [received.num_rows(), E_local] for combine,
  // or [permuted.num_rows()] for combine_with_unpermute (empty on a rank with no
  // rows). Every rank gives probs or none does.
  std::optional<std::vector<float>> probs;
};

// What one home rank gets back.
struct CombineOutput {
  std::vector<bf16> hidden;  // [T, H]
  std::vector<float> probs;  // [T, E] when probs were given, else empty
};

// Sums every token's rows back on its home rank: per NVLink domain in ascending rank
// order in fp32, each domain's partial rounded to BF16, the partials summed in fp32
// in ascending domain order, the total rounded to BF16.
std::vector<CombineOutput> combine(const World& world, const DispatchResult& handle,
                                   std::span<const CombineInput> inputs);

// One rank's unpermute: received row r gets bf16 of the fp32 sum, over its local
// experts ascending, of its permuted rows. Returns [received.num_rows(), H].
std::vector<bf16> unpermute(const World& world, const ReceivedRows& received,
                            const PermutedRows& permuted, std::span<const bf16> permuted_hidden);

// Megatron Core's combine_with_unpermute: unpermute on every rank, then combine; probs
// go straight from permuted rows to [T, E].
std::vector<CombineOutput> combine_with_unpermute(const World& world,
                                                  const PermutedDispatchResult& handle,
                                                  std::span<const CombineInput> inputs);

}  // namespace railyard::reference
