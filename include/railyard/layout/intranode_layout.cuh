// Railyard layout: where every byte of the intra-node (NVLink) path lives.
//
// One object, used by the host to size allocations and by the kernels to address
// them: there is no second formula anywhere. See docs/design-intranode.md.
//
// Two allocations per rank:
//  - the registered buffer (peer-visible): count table, flags, staging rows, headers
//    and scales; sized once for the worst case and reused by every call;
//  - the handle (ordinary device memory): what a dispatch leaves for the combine and
//    for the backward pass, so neither recomputes routing metadata.
#pragma once

#include <cstddef>
#include <cstdint>

#include "railyard/common/dtypes.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/pipeline/abort_record.hpp"

namespace railyard::layout {

inline constexpr int kMaxRanksPerDomain = 72;
inline constexpr int kMaxLocalExperts = 256;
inline constexpr int kFp8ScaleBlock = 128;  // elements per FP8 scale
// Blocks the metadata kernel spreads a rank's tokens over, at most: each has a flag
// and a count row in the registered buffer's metadata scratch.
inline constexpr int kMaxMetadataBlocks = 32;

RAILYARD_HOST_DEVICE constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The configuration that fixes the layout. Everything here is runtime: a new model
// changes these numbers, never the compiled kernels.
struct IntranodeShape {
  // R: the ranks the count table, staging and handle index. One NVLink domain: its
  // ranks. The hierarchical path lays its NVLink part out for the whole group of D x R
  // ranks (HierarchicalLayout::nvlink()), of which a process maps its domain's.
  int ranks_per_domain = 1;
  int num_local_experts = 1;  // E_local: experts per rank
  int max_tokens = 0;         // M: most tokens any rank passes in one call
  int hidden = 16;            // H: elements per token row
  int max_topk = 1;           // K: top-k slots per token
  DType dispatch_dtype = DType::BF16;
  // D: the NVLink domains the ranks form, R / D ranks each (ranks d * R / D ..). Above
  // 1, count rows and handles also count tokens per domain (domain_keys()).
  int num_domains = 1;

  bool operator==(const IntranodeShape&) const = default;
};

// The head of a rank's count row: what other ranks need to know about its call. A
// bound of -1 means "no bound". pad_multiple must agree on every rank (checked).
enum class CountRow : int { NumTokens = 0, MaxRecvRows = 1, MaxPermutedRows = 2, PadMultiple = 3 };
inline constexpr int kCountRowHeaderInts = 4;
// Index of "tokens to rank d" and of "tokens to (rank d, local expert j)" in a count row.
RAILYARD_HOST_DEVICE constexpr int count_to_rank(int d) { return kCountRowHeaderInts + d; }
RAILYARD_HOST_DEVICE constexpr int count_to_expert(int ranks_per_domain, int num_local_experts, int d, int j) {
  return kCountRowHeaderInts + ranks_per_domain + d * num_local_experts + j;
}
// Index of "tokens with an expert in NVLink domain n" (groups of several domains only).
RAILYARD_HOST_DEVICE constexpr int count_to_domain(int ranks_per_domain, int num_local_experts, int n) {
  return kCountRowHeaderInts + ranks_per_domain * (1 + num_local_experts) + n;
}

// One (local expert, prob, permuted position) entry of a staged row's header.
struct HeaderEntry {
  int32_t local_expert;
  float prob;
  int32_t permuted_pos;  // row in the expert-grouped output; -1 if past the caller's bound
};

// The fixed part of a staged row's header. `seq` is written last, with a release
// store, once the row, its scales and its entries are in place. It is 64-bit: a row
// may go unwritten for any number of operations (only skewed batches reach high
// rows), so its header's distance from the current operation is unbounded, and a
// 32-bit number would make a header written 2^31 operations ago, or never, look
// current (docs/design-intranode.md, "Ordering across calls").
struct RowHeader {
  uint64_t seq;
  int32_t src_token;
  int16_t num_entries;  // <= max_entries() <= kMaxLocalExperts
  int16_t src_rank;     // < kMaxRanksPerDomain
};
static_assert(sizeof(RowHeader) == 16 && sizeof(HeaderEntry) == 12);

// What a rank's dispatch or combine must agree on with every other rank's. The entry
// barrier stores it into the rank's slot of every peer before the barrier flag and
// compares the slots after the barrier (kernels/intranode/protocol.cuh). The handle's
// identity is its whole made_by_op, so two different handles never look alike.
struct OpDescriptor {
  uint32_t kind;               // pipeline::OpKind
  uint16_t grouped;            // 1: expert-grouped layout (dispatch) or permuted input (combine)
  uint16_t probs;              // 1: combine with probs
  uint64_t handle_made_by_op;  // the sequence number of the metadata operation that filled the handle
};
static_assert(sizeof(OpDescriptor) == 16);

// A received row's routing, kept in the handle: (local expert, permuted position).
struct RecvEntry {
  int32_t local_expert;
  int32_t permuted_pos;
};

class IntranodeLayout {
 public:
  RAILYARD_HOST_DEVICE explicit IntranodeLayout(const IntranodeShape& shape) : s_(shape) {}
  RAILYARD_HOST_DEVICE const IntranodeShape& shape() const { return s_; }

  // ---- per-row sizes --------------------------------------------------------------------
  RAILYARD_HOST_DEVICE int64_t dispatch_row_bytes() const {
    return int64_t{s_.hidden} * dtype_bytes(s_.dispatch_dtype);
  }
  RAILYARD_HOST_DEVICE int64_t combine_row_bytes() const { return int64_t{s_.hidden} * 2; }
  // Staging holds a dispatch row, or later a combine row, at the same position.
  RAILYARD_HOST_DEVICE int64_t stage_row_bytes() const {
    const int64_t d = dispatch_row_bytes(), c = combine_row_bytes();
    return round_up(d > c ? d : c, 16);
  }
  RAILYARD_HOST_DEVICE int num_scales() const {
    return s_.dispatch_dtype == DType::FP8_E4M3 ? s_.hidden / kFp8ScaleBlock : 0;
  }
  RAILYARD_HOST_DEVICE int64_t stage_scale_bytes() const { return round_up(int64_t{num_scales()} * 4, 16); }
  // Entries a token can have on one rank: one per chosen local expert.
  RAILYARD_HOST_DEVICE int max_entries() const {
    return s_.max_topk < s_.num_local_experts ? s_.max_topk : s_.num_local_experts;
  }
  RAILYARD_HOST_DEVICE int64_t header_bytes() const {
    return 16 + round_up(int64_t{max_entries()} * int64_t{sizeof(HeaderEntry)}, 16);
  }
  // One rank's row of the count table, int32: the call parameters every rank must know
  // ([kCountRowHeaderInts], see CountRow), tokens to each rank [R], then tokens to
  // each (rank, local expert) [R][E_local], then, across domains, tokens to each
  // domain [domain_keys()]: how many rows the rank packs for that domain's NICs.
  RAILYARD_HOST_DEVICE int domain_keys() const { return s_.num_domains > 1 ? s_.num_domains : 0; }
  RAILYARD_HOST_DEVICE int count_row_ints() const {
    return kCountRowHeaderInts + s_.ranks_per_domain * (1 + s_.num_local_experts) + domain_keys();
  }
  RAILYARD_HOST_DEVICE int64_t stage_capacity_rows() const { return int64_t{s_.ranks_per_domain} * s_.max_tokens; }

  // ---- the registered buffer ---------------------------------------------------------------
  // [count_table: 2 parities x R sources x count_row_ints]
  // [count_flags: R] [barrier_flags: R] [op_descriptors: 2 parities x R] [local_state: 64 B]
  // [metadata scratch: kMaxMetadataBlocks flags, kMaxMetadataBlocks x count_row_ints]
  // [headers: R*M x header_bytes] [scales: R*M x stage_scale_bytes] [rows: R*M x stage_row_bytes]
  RAILYARD_HOST_DEVICE int64_t count_table_offset() const { return 0; }
  RAILYARD_HOST_DEVICE int64_t count_flags_offset() const {
    return round_up(int64_t{2} * s_.ranks_per_domain * count_row_ints() * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t barrier_flags_offset() const {
    return count_flags_offset() + round_up(int64_t{s_.ranks_per_domain} * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t op_descriptors_offset() const {
    return barrier_flags_offset() + round_up(int64_t{s_.ranks_per_domain} * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t local_state_offset() const {
    return op_descriptors_offset() + int64_t{2} * s_.ranks_per_domain * int64_t{sizeof(OpDescriptor)};
  }
  RAILYARD_HOST_DEVICE int64_t metadata_flags_offset() const { return local_state_offset() + 64; }
  RAILYARD_HOST_DEVICE int64_t metadata_counts_offset() const {
    return metadata_flags_offset() + int64_t{kMaxMetadataBlocks} * 4;
  }
  RAILYARD_HOST_DEVICE int64_t headers_offset() const {
    return round_up(metadata_counts_offset() + int64_t{kMaxMetadataBlocks} * count_row_ints() * 4, 128);
  }
  RAILYARD_HOST_DEVICE int64_t scales_offset() const {
    return round_up(headers_offset() + stage_capacity_rows() * header_bytes(), 128);
  }
  RAILYARD_HOST_DEVICE int64_t rows_offset() const {
    return round_up(scales_offset() + stage_capacity_rows() * stage_scale_bytes(), 128);
  }
  RAILYARD_HOST_DEVICE int64_t registered_bytes() const {
    return round_up(rows_offset() + stage_capacity_rows() * stage_row_bytes(), 128);
  }

  // Addresses inside a registered buffer starting at `base` (this rank's or a peer's).
  RAILYARD_HOST_DEVICE int32_t* count_row(uint8_t* base, uint32_t parity, int src_rank) const {
    return reinterpret_cast<int32_t*>(base + count_table_offset()) +
           (int64_t{parity & 1u} * s_.ranks_per_domain + src_rank) * count_row_ints();
  }
  RAILYARD_HOST_DEVICE uint32_t* count_flag(uint8_t* base, int src_rank) const {
    return reinterpret_cast<uint32_t*>(base + count_flags_offset()) + src_rank;
  }
  RAILYARD_HOST_DEVICE uint32_t* barrier_flag(uint8_t* base, int src_rank) const {
    return reinterpret_cast<uint32_t*>(base + barrier_flags_offset()) + src_rank;
  }
  // Rank src_rank's descriptor of its dispatch or combine whose `seq` has this parity.
  // Two slots: a peer can be one operation ahead (every operation starts with a
  // handshake), and must not overwrite the slot of the operation this rank checks.
  RAILYARD_HOST_DEVICE OpDescriptor* op_descriptor(uint8_t* base, uint32_t parity, int src_rank) const {
    return reinterpret_cast<OpDescriptor*>(base + op_descriptors_offset()) +
           (int64_t{parity & 1u} * s_.ranks_per_domain + src_rank);
  }
  // The sequence number of the last operation this rank finished (64-bit: it never
  // wraps); then blocks_finished; the rest is reserved for cumulative counters.
  RAILYARD_HOST_DEVICE uint64_t* local_state(uint8_t* base) const {
    return reinterpret_cast<uint64_t*>(base + local_state_offset());
  }
  // Blocks of the running kernel that have finished (op_end), in local_state.
  RAILYARD_HOST_DEVICE uint32_t* blocks_finished(uint8_t* base) const {
    return reinterpret_cast<uint32_t*>(base + local_state_offset() + 8);
  }
  // Where a rank that gives up an operation reports to this rank, in local_state.
  RAILYARD_HOST_DEVICE pipeline::AbortRecord* abort_record(uint8_t* base) const {
    static_assert(16 + sizeof(pipeline::AbortRecord) <= 64, "local_state is 64 bytes");
    return reinterpret_cast<pipeline::AbortRecord*>(base + local_state_offset() + 16);
  }
  // This rank's metadata kernel, block b: the flag that says its counts are written
  // (the low 32 bits of the operation's seq), and its tokens' counts, per count-row key.
  // Only this rank's blocks touch them.
  RAILYARD_HOST_DEVICE uint32_t* metadata_flag(uint8_t* base, int block) const {
    return reinterpret_cast<uint32_t*>(base + metadata_flags_offset()) + block;
  }
  RAILYARD_HOST_DEVICE int32_t* metadata_counts(uint8_t* base, int block) const {
    return reinterpret_cast<int32_t*>(base + metadata_counts_offset()) + int64_t{block} * count_row_ints();
  }
  RAILYARD_HOST_DEVICE RowHeader* header(uint8_t* base, int64_t row) const {
    return reinterpret_cast<RowHeader*>(base + headers_offset() + row * header_bytes());
  }
  RAILYARD_HOST_DEVICE HeaderEntry* header_entries(uint8_t* base, int64_t row) const {
    return reinterpret_cast<HeaderEntry*>(base + headers_offset() + row * header_bytes() + 16);
  }
  RAILYARD_HOST_DEVICE float* stage_scales(uint8_t* base, int64_t row) const {
    return reinterpret_cast<float*>(base + scales_offset() + row * stage_scale_bytes());
  }
  RAILYARD_HOST_DEVICE uint8_t* stage_row(uint8_t* base, int64_t row) const {
    return base + rows_offset() + row * stage_row_bytes();
  }

  // ---- the handle (ordinary device memory, one allocation) ------------------------------------
  // Home side, indexed by this rank's token t < M:
  //   recv_pos   int32 [M][R]   position of t in rank d's received rows, -1 if t skips d
  //   slot_expert int32 [M][K]  global expert of top-k slot k, -1 if unused
  //   slot_prob  float [M][K]   its routing probability
  //   slot_pos   int32 [M][K]   permuted position at that expert's rank, -1 if unused or dropped
  // Expert side, indexed by received row r < recv_capacity:
  //   recv_src     int32 [cap][2]          (source rank, source token)
  //   recv_entries RecvEntry [cap][Kl]     Kl = max_entries()
  //   recv_num_entries int32 [cap]
  //   made_by_op   uint64                 the sequence number of the metadata operation
  //                that filled the handle: the handle's identity for the entry barrier
  // Across domains, home side again:
  //   domain_pos int32 [M][domain_keys()]  t's index among this rank's tokens with an
  //                expert in domain n (its packed row for that domain), -1 if none
  //   domain_tokens int32 [domain_keys()][M]  the inverse: packed row i for domain n is
  //                token domain_tokens[n][i] (i below the count row's tokens to n)
  // Across domains, forwarding side (written by the dispatch, read by the combine):
  //   forward_pos int32 [domain_keys()][M][R / D]  the packed row i that this rank's
  //                rail peer in domain n put to it: its staged position at rank j of
  //                this rank's NVLink domain, -1 where it was not sent (none, or at or
  //                past j's bound); rows of this rank's own domain unused
  // Counts:
  //   count_matrix int32 [R][count_row_ints]  every rank's count row, as exchanged
  //   totals       int64 [4 + 2 E_local]      num_recv, num_permuted, overflow_recv,
  //                overflow_permuted, tokens_per_expert (padded) [E_local],
  //                tokens_per_expert (unpadded) [E_local]
  RAILYARD_HOST_DEVICE int64_t recv_pos_offset() const { return 0; }
  RAILYARD_HOST_DEVICE int64_t slot_expert_offset() const {
    return round_up(int64_t{s_.max_tokens} * s_.ranks_per_domain * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t slot_prob_offset() const {
    return slot_expert_offset() + round_up(int64_t{s_.max_tokens} * s_.max_topk * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t slot_pos_offset() const {
    return slot_prob_offset() + round_up(int64_t{s_.max_tokens} * s_.max_topk * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t count_matrix_offset() const {
    return slot_pos_offset() + round_up(int64_t{s_.max_tokens} * s_.max_topk * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t totals_offset() const {
    return count_matrix_offset() + round_up(int64_t{s_.ranks_per_domain} * count_row_ints() * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t recv_src_offset() const {
    return totals_offset() + round_up(int64_t{4 + 2 * s_.num_local_experts} * 8, 16);
  }
  RAILYARD_HOST_DEVICE int64_t recv_entries_offset(int64_t recv_capacity) const {
    return recv_src_offset() + round_up(recv_capacity * 8, 16);
  }
  RAILYARD_HOST_DEVICE int64_t recv_num_entries_offset(int64_t recv_capacity) const {
    return recv_entries_offset(recv_capacity) +
           round_up(recv_capacity * max_entries() * int64_t{sizeof(RecvEntry)}, 16);
  }
  RAILYARD_HOST_DEVICE int64_t made_by_op_offset(int64_t recv_capacity) const {
    return recv_num_entries_offset(recv_capacity) + round_up(recv_capacity * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t domain_pos_offset(int64_t recv_capacity) const {
    return made_by_op_offset(recv_capacity) + 16;
  }
  // recv_capacity: received rows the handle can describe (at most stage_capacity_rows()).
  RAILYARD_HOST_DEVICE int64_t domain_tokens_offset(int64_t recv_capacity) const {
    return domain_pos_offset(recv_capacity) + round_up(int64_t{s_.max_tokens} * domain_keys() * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t forward_pos_offset(int64_t recv_capacity) const {
    return domain_tokens_offset(recv_capacity) + round_up(int64_t{s_.max_tokens} * domain_keys() * 4, 16);
  }
  RAILYARD_HOST_DEVICE int64_t handle_bytes(int64_t recv_capacity) const {
    // domain_keys() x M x (R / D) = M x R positions across domains, none on one.
    const int64_t forward = domain_keys() > 0 ? round_up(int64_t{s_.max_tokens} * s_.ranks_per_domain * 4, 16) : 0;
    return forward_pos_offset(recv_capacity) + forward;
  }

 private:
  IntranodeShape s_;
};

// Indices into the handle's totals array.
enum class Total : int { NumRecv = 0, NumPermuted = 1, OverflowRecv = 2, OverflowPermuted = 3, TokensPerExpert = 4 };

// Device pointers of one handle, carved from one allocation by the layout.
struct HandleView {
  int32_t* recv_pos = nullptr;
  int32_t* slot_expert = nullptr;
  float* slot_prob = nullptr;
  int32_t* slot_pos = nullptr;
  int32_t* count_matrix = nullptr;
  int64_t* totals = nullptr;
  int32_t* recv_src = nullptr;
  RecvEntry* recv_entries = nullptr;
  int32_t* recv_num_entries = nullptr;
  uint64_t* made_by_op = nullptr;
  int32_t* domain_pos = nullptr;     // null on one domain
  int32_t* domain_tokens = nullptr;  // null on one domain
  int32_t* forward_pos = nullptr;    // null on one domain
  int64_t recv_capacity = 0;

  RAILYARD_HOST_DEVICE static HandleView carve(const IntranodeLayout& layout, uint8_t* base, int64_t recv_capacity) {
    HandleView v;
    v.recv_pos = reinterpret_cast<int32_t*>(base + layout.recv_pos_offset());
    v.slot_expert = reinterpret_cast<int32_t*>(base + layout.slot_expert_offset());
    v.slot_prob = reinterpret_cast<float*>(base + layout.slot_prob_offset());
    v.slot_pos = reinterpret_cast<int32_t*>(base + layout.slot_pos_offset());
    v.count_matrix = reinterpret_cast<int32_t*>(base + layout.count_matrix_offset());
    v.totals = reinterpret_cast<int64_t*>(base + layout.totals_offset());
    v.recv_src = reinterpret_cast<int32_t*>(base + layout.recv_src_offset());
    v.recv_entries = reinterpret_cast<RecvEntry*>(base + layout.recv_entries_offset(recv_capacity));
    v.recv_num_entries = reinterpret_cast<int32_t*>(base + layout.recv_num_entries_offset(recv_capacity));
    v.made_by_op = reinterpret_cast<uint64_t*>(base + layout.made_by_op_offset(recv_capacity));
    if (layout.domain_keys() > 0) {
      v.domain_pos = reinterpret_cast<int32_t*>(base + layout.domain_pos_offset(recv_capacity));
      v.domain_tokens = reinterpret_cast<int32_t*>(base + layout.domain_tokens_offset(recv_capacity));
      v.forward_pos = reinterpret_cast<int32_t*>(base + layout.forward_pos_offset(recv_capacity));
    }
    v.recv_capacity = recv_capacity;
    return v;
  }
};

}  // namespace railyard::layout
