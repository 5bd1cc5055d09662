// Railyard intra-node metadata kernel: from this rank's routing, every position its
// tokens will take on every rank, exchanging only counts. See docs/design-intranode.md,
// "Metadata: what ranks exchange, and why that little".
//
// Up to kMaxMetadataBlocks blocks of up to kMaxWarps warps per rank. Each warp takes
// a contiguous slice of the tokens, 32 a tile, one per lane, and keeps its own count
// row in shared memory. Positions must follow token order (the canonical received
// order), and a token's experts on a rank may sit in any of its top-k slots. Within a
// tile, destination ranks are given key by key: the warp takes the smallest rank any
// lane still holds, ballots which lanes hold it, and gives them running +
// rank-among-lower-lanes (iterations per tile: distinct ranks in the tile, at most R).
// Experts, of which a tile may hold up to 32 x K distinct ones, go through a
// per-expert mask of the tile's lanes in shared memory instead: every lane sets its
// bit in the masks of its experts (atomicOr, so the result does not depend on the
// order), then reads running + the bits below its own; the lowest lane of each expert
// advances its counter, and every lane clears its bits (atomicAnd): four passes over
// the lane's K slots a tile, however many distinct experts.
//
// Phases: (1) every warp normalises its tokens' routing to slots and counts, writing
// positions within its slice into the handle; (2) the block turns its warps' counts
// into offsets within the block and leaves its total in the registered buffer's
// metadata scratch, behind a flag; (3) block 0 sums the blocks' totals into this
// rank's count row and publishes it to every rank of its NVLink domain, then runs the
// relay (nothing on one domain; across domains, kernels/hierarchical/metadata.cuh
// carries rows between domains rail by rail); (4) every block waits for every
// rank's row, block 0 copies the table into the handle and writes this rank's totals
// as a destination; (5) every block adds the global offsets (ranks and expert groups
// before this rank's tokens) and the counts of the blocks before it to its warps'
// offsets; (6) every warp adds its offsets to its tokens' positions.
#pragma once

#include <cstdint>

#include "kernels/common/warp_reduce.cuh"
#include "kernels/intranode/metadata.hpp"
#include "kernels/intranode/protocol.cuh"
#include "railyard/arch/fault.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/layout/intranode_layout.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/nvlink.cuh"

namespace railyard::kernels::intranode {

// The count exchange of one NVLink domain: every rank's row reaches every rank
// directly, so block 0 has nothing to relay. The hierarchical path's relay
// (kernels/hierarchical/metadata.cuh) carries rows between domains, rail by rail.
struct NvlinkOnly {
  static constexpr const char* kName = "intranode::Metadata";
  struct Params {};
  RAILYARD_DEVICE static void relay(const Params&, const DomainParams&, const layout::IntranodeLayout&, uint64_t) {}
};

// The metadata kernel, with `Relay` run by block 0 once this rank's count row is in
// place on its NVLink peers and before any block waits for the other ranks' rows:
// relay(params, domain, layout, seq) must leave, in every NVLink peer's count table,
// the rows (and flags) of the ranks outside the NVLink domain.
template <class Relay>
struct MetadataKernel {
  static constexpr const char* kName = Relay::kName;
  static constexpr int kMaxWarps = 8;
  static constexpr uint32_t kMaxThreadsPerBlock = kMaxWarps * 32;
  static constexpr uint32_t kMinBlocksPerSm = 1;
  // The largest count row: 72 ranks x (1 + 256 experts) plus its header, and up to
  // one domain key per rank.
  static constexpr int kMaxCountRowInts =
      layout::kCountRowHeaderInts + layout::kMaxRanksPerDomain * (2 + layout::kMaxLocalExperts);
  static constexpr int kMaxExperts = layout::kMaxRanksPerDomain * layout::kMaxLocalExperts;
  static constexpr int kMaxRankWords = (layout::kMaxRanksPerDomain + 31) / 32;

  using Arguments = MetadataArguments;

  struct Params {
    DomainParams domain;
    int num_tokens;
    int num_topk;  // slots given by the caller (top-k form), <= shape.max_topk
    const int64_t* topk_idx;
    const float* topk_weights;
    const uint8_t* routing_map;
    const float* probs;
    int32_t max_recv_rows;  // -1: none
    int32_t max_permuted_rows;
    int32_t pad_multiple;
    uint8_t* handle;
    int64_t recv_capacity;
    typename Relay::Params relay;
  };

  // Per warp, a count row (its tokens' counts, then the offsets of its positions) and,
  // per global expert, the lanes of its current tile that chose it (zero between
  // tiles); warps_per_block() says how many fit. Once counting is done, the start of
  // the mask pool holds the expert groups' bases instead.
  struct SharedStorage {
    alignas(16) arch::SharedVar<int32_t> rows[kMaxCountRowInts];
    arch::SharedVar<uint32_t> masks[kMaxExperts];
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "metadata shared memory exceeds the per-block budget");

  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }

  // Warps per block for `shape`: as many as have a count row and a mask per expert in
  // SharedStorage, at most kMaxWarps (at least one: the largest shape fills it once).
  RAILYARD_HOST_DEVICE static int warps_per_block(const layout::IntranodeShape& shape) {
    const int row_ints = layout::IntranodeLayout(shape).count_row_ints();
    const int by_rows = kMaxCountRowInts / row_ints, by_masks = kMaxExperts / (shape.ranks_per_domain * shape.num_local_experts);
    const int w = by_rows < by_masks ? by_rows : by_masks;
    return w < kMaxWarps ? w : kMaxWarps;
  }
  // Blocks of `warps` warps for `num_tokens` tokens when `max_blocks` are offered:
  // enough for a tile of 32 tokens per warp, at most max_blocks and kMaxMetadataBlocks,
  // at least one.
  RAILYARD_HOST_DEVICE static int blocks_for(int num_tokens, int warps, int max_blocks) {
    const int tiles = (num_tokens + 31) / 32;
    int g = (tiles + warps - 1) / warps;
    if (g > max_blocks) g = max_blocks;
    if (g > layout::kMaxMetadataBlocks) g = layout::kMaxMetadataBlocks;
    return g < 1 ? 1 : g;
  }

  static Params to_params(const Arguments& a, const typename Relay::Params& relay = {}) {
    Params p{};
    p.relay = relay;
    p.domain = a.domain;
    p.num_tokens = a.num_tokens;
    p.num_topk = a.topk_idx ? a.num_topk : a.domain.shape.max_topk;
    p.topk_idx = a.topk_idx;
    p.topk_weights = a.topk_weights;
    p.routing_map = a.routing_map;
    p.probs = a.probs;
    p.max_recv_rows = static_cast<int32_t>(a.max_recv_rows);
    p.max_permuted_rows = static_cast<int32_t>(a.max_permuted_rows);
    p.pad_multiple = a.pad_multiple;
    p.handle = a.handle;
    p.recv_capacity = a.recv_capacity;
    return p;
  }

  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage& storage) const {
    const DomainParams& dom = p.domain;
    const uint64_t seq = op_begin(dom);
    const Context c(p, storage, seq);

    // This warp's slice of the tokens: whole tiles, in block then warp order.
    const int warp = static_cast<int>(arch::warp_idx());
    const int slice = (p.num_tokens + c.num_warps() - 1) / c.num_warps();
    const int per_warp = static_cast<int>(layout::round_up(slice, 32));
    const int global_warp = static_cast<int>(blockIdx.x) * c.warps + warp;
    const int begin = global_warp * per_warp < p.num_tokens ? global_warp * per_warp : p.num_tokens;
    const int end = begin + per_warp < p.num_tokens ? begin + per_warp : p.num_tokens;

    // ---- (1) slots, counts and positions within the slice ----------------------------
    for (int i = static_cast<int>(arch::lane_idx()); i < c.row_ints; i += 32) c.row(warp)[i].store(0);
    for (int e = static_cast<int>(arch::lane_idx()); e < c.E; e += 32) c.masks(warp)[e].store(0u);
    if (blockIdx.x == 0 && threadIdx.x == 0) arch::st_global(c.h.made_by_op, seq);  // the handle's identity
    __syncwarp();
    count_slice(p, c, warp, begin, end);
    __syncthreads();

    // ---- (2) offsets within the block; the block's counts, flagged -------------------
    for (int key = layout::kCountRowHeaderInts + static_cast<int>(threadIdx.x); key < c.row_ints;
         key += static_cast<int>(blockDim.x)) {
      int32_t running = 0;
      for (int w = 0; w < c.warps; ++w) {
        const int32_t count = c.row(w)[key].load();
        c.row(w)[key].store(running);
        running += count;
      }
      arch::st_global(&c.lay.metadata_counts(dom.self(), static_cast<int>(blockIdx.x))[key], running);
    }
    // The block barrier orders every thread's counts before thread 0's release, which is
    // cumulative: it publishes them with its own.
    __syncthreads();
    if (threadIdx.x == 0) arch::st_release_gpu(c.lay.metadata_flag(dom.self(), static_cast<int>(blockIdx.x)), flag_of(seq));

    // ---- (3) block 0: this rank's count row, to every rank (itself included) ----------
    if (blockIdx.x == 0) {
      publish_count_row(p, c, seq);
      Relay::relay(p.relay, dom, c.lay, seq);
    }
    // ---- (4) every rank's row (and the counts of the blocks before this one) --------
    wait_for_blocks(c, static_cast<int>(blockIdx.x), seq);
    wait_for_count_rows(c, seq);
    __syncthreads();  // every row and block count is acquired by some thread of the block
    if (blockIdx.x == 0 && warp == 0) fill_count_table_and_totals(p, c);
    // ---- (5) global offsets and the blocks before this one, into every warp's row ----
    add_offsets(p, c);
    __syncthreads();
    // ---- (6) final positions ------------------------------------------------------------
    finish_slice(c, warp, begin, end);
    op_end(dom, seq);
  }

 private:
  // What every phase reads: the shape's numbers, the layout, the handle, the block's
  // shared memory carved per warp.
  struct Context {
    RAILYARD_DEVICE Context(const Params& p, SharedStorage& s, uint64_t seq)
        : dom(p.domain),
          lay(p.domain.shape),
          h(layout::HandleView::carve(lay, p.handle, p.recv_capacity)),
          storage(s),
          R(p.domain.shape.ranks_per_domain),
          El(p.domain.shape.num_local_experts),
          K(p.domain.shape.max_topk),
          E(R * El),
          Dk(lay.domain_keys()),
          ranks_per_nvlink_domain(R / p.domain.shape.num_domains),
          row_ints(lay.count_row_ints()),
          warps(static_cast<int>(blockDim.x / 32)),
          parity(static_cast<uint32_t>(seq & 1u)) {}
    const DomainParams& dom;
    layout::IntranodeLayout lay;
    layout::HandleView h;
    SharedStorage& storage;
    int R, El, K, E, Dk, ranks_per_nvlink_domain, row_ints, warps;
    uint32_t parity;  // of the operation: which half of the count table it uses
    RAILYARD_DEVICE int num_warps() const { return static_cast<int>(gridDim.x) * warps; }
    RAILYARD_DEVICE arch::SharedVar<int32_t>* row(int warp) const { return storage.rows + warp * row_ints; }
    RAILYARD_DEVICE arch::SharedVar<uint32_t>* masks(int warp) const { return storage.masks + warp * E; }
  };

  // A token's experts, slot by slot: the first kCachedSlots stay in registers from
  // normalisation to the tile's last pass, which would otherwise read them back from
  // the handle four times a tile; later slots are read back.
  static constexpr int kCachedSlots = 8;
  struct TokenSlots {
    int32_t cached[kCachedSlots];
    const int32_t* in_handle;  // the token's slot_expert row
    RAILYARD_DEVICE explicit TokenSlots(const int32_t* row) : in_handle(row) {
      for (int k = 0; k < kCachedSlots; ++k) cached[k] = -1;
    }
    RAILYARD_DEVICE void set(int k, int32_t e) {
      if (k < kCachedSlots) cached[k] = e;
    }
    RAILYARD_DEVICE int32_t operator[](int k) const { return k < kCachedSlots ? cached[k] : arch::ld_global(&in_handle[k]); }
  };

  // Entry `index` of rank src's count row in this rank's count table.
  RAILYARD_DEVICE static int32_t column(const Context& c, int src, int index) {
    return arch::ld_global(&c.lay.count_row(c.dom.self(), c.parity, src)[index]);
  }

  // Numbers the indices < n each lane has marked, in ascending order of index: lane
  // gets key(i)'s running count plus the lanes below it marking i (store(i, pos)),
  // then the counter advances by the lanes marking i. Clears the marks. Iterations:
  // the distinct indices the warp marked.
  template <class Key, class Store>
  RAILYARD_DEVICE static void number_in_order(uint32_t (&marks)[kMaxRankWords], int n, arch::SharedVar<int32_t>* row,
                                              Key key, Store store) {
    const uint32_t lane = arch::lane_idx();
    const uint32_t lower_lanes = (1u << lane) - 1u;
    for (;;) {
      int my_first = n;
      for (int w = 0; w < kMaxRankWords && my_first == n; ++w)
        if (marks[w]) my_first = w * 32 + __ffs(static_cast<int>(marks[w])) - 1;
      const int i = warp_min(my_first);
      if (i >= n) break;
      const bool mine = my_first == i;
      const uint32_t holders = __ballot_sync(arch::kFullWarpMask, mine);
      if (mine) {
        store(i, row[key(i)].load() + __popc(holders & lower_lanes));
        marks[i / 32] &= ~(1u << (i % 32));
      }
      __syncwarp();
      if (lane == 0) row[key(i)].store(row[key(i)].load() + __popc(holders));
      // No warp barrier: the next iteration reads another key's counter (i grows), and
      // the expert passes read experts' counters only after their own warp barrier, as
      // does the next tile (the barrier that ends this one).
    }
  }

  // Phase (1) for one warp: tokens [begin, end), 32 a tile. Leaves the warp's counts in
  // its row and each token's position among the slice's tokens in the handle.
  RAILYARD_DEVICE static void count_slice(const Params& p, const Context& c, int warp, int begin, int end) {
    const int R = c.R, El = c.El, K = c.K;
    const uint32_t lane = arch::lane_idx();
    const uint32_t lower_lanes = (1u << lane) - 1u;
    arch::SharedVar<int32_t>* row = c.row(warp);
    arch::SharedVar<uint32_t>* masks = c.masks(warp);
    for (int base = begin; base < end; base += 32) {
      const int t = base + static_cast<int>(lane);
      const bool valid = t < end;
      uint32_t ranks[kMaxRankWords] = {};
      TokenSlots slots(&c.h.slot_expert[int64_t{t} * K]);
      if (valid) normalise_token(p, c.h, t, c.E, El, K, ranks, slots);
      for (int d = 0; valid && d < R; ++d) arch::st_global(&c.h.recv_pos[int64_t{t} * R + d], int32_t{-1});

      // Destination domains (across domains), then ranks, in ascending order.
      if (c.Dk > 0) {
        uint32_t domains[kMaxRankWords] = {};
        for (int d = 0; valid && d < R; ++d)
          if (ranks[d / 32] & (1u << (d % 32))) {
            const int n = d / c.ranks_per_nvlink_domain;
            domains[n / 32] |= 1u << (n % 32);
          }
        for (int n = 0; valid && n < c.Dk; ++n) arch::st_global(&c.h.domain_pos[int64_t{t} * c.Dk + n], int32_t{-1});
        number_in_order(domains, c.Dk, row, [&](int n) { return layout::count_to_domain(R, El, n); },
                        [&](int n, int32_t pos) { arch::st_global(&c.h.domain_pos[int64_t{t} * c.Dk + n], pos); });
      }
      number_in_order(ranks, R, row, [](int d) { return layout::count_to_rank(d); },
                      [&](int d, int32_t pos) { arch::st_global(&c.h.recv_pos[int64_t{t} * R + d], pos); });
      // Experts: every lane marks its experts, then takes running + the marks below it;
      // the lowest lane of each expert then advances its counter; every lane clears its
      // marks.
      for (int k = 0; valid && k < K; ++k) {
        const int e = slots[k];
        if (e >= 0) masks[e].fetch_or(1u << lane);
      }
      __syncwarp();
      for (int k = 0; valid && k < K; ++k) {
        const int e = slots[k];
        if (e < 0) continue;
        const uint32_t lanes = masks[e].load();
        const int key = layout::count_to_expert(R, El, e / El, e % El);
        arch::st_global(&c.h.slot_pos[int64_t{t} * K + k], row[key].load() + __popc(lanes & lower_lanes));
      }
      __syncwarp();
      for (int k = 0; valid && k < K; ++k) {
        const int e = slots[k];
        if (e < 0) continue;
        const uint32_t lanes = masks[e].load();
        if (lanes & lower_lanes) continue;  // one lane a key writes its counter
        const int key = layout::count_to_expert(R, El, e / El, e % El);
        row[key].store(row[key].load() + __popc(lanes));
      }
      // Every mask read above; each lane clears its own bits (atomically: other lanes
      // clear theirs in the same words).
      __syncwarp();
      for (int k = 0; valid && k < K; ++k) {
        const int e = slots[k];
        if (e >= 0) masks[e].fetch_and(~(1u << lane));
      }
      // No warp barrier: the next tile's first accesses to masks are atomics, and it
      // reads masks and expert counters only after its own warp barrier.
    }
  }

  // Waits until blocks [0, n) of this kernel have flagged their counts (block 0: all of
  // them). Every block is resident (the launcher checks), so this is a data wait.
  RAILYARD_DEVICE static void wait_for_blocks(const Context& c, int n, uint64_t seq) {
    for (int b = static_cast<int>(threadIdx.x); b < n; b += static_cast<int>(blockDim.x)) {
      const uint32_t* flag = c.lay.metadata_flag(c.dom.self(), b);
      pipeline::timeout_while([&] { return arch::ld_acquire_gpu(flag) != flag_of(seq); },
                              {"metadata counts of block", b, static_cast<int64_t>(seq)}, c.dom.wait());
    }
  }

  // Phase (3), block 0: this rank's count row (the call's parameters, then every
  // block's counts summed) into its slot on every NVLink peer, itself included, then
  // the flags.
  RAILYARD_DEVICE static void publish_count_row(const Params& p, const Context& c, uint64_t seq) {
    const DomainParams& dom = c.dom;
    wait_for_blocks(c, static_cast<int>(gridDim.x), seq);
    __syncthreads();
    for (int i = static_cast<int>(threadIdx.x); i < c.row_ints; i += static_cast<int>(blockDim.x)) {
      int32_t value = 0;
      switch (i) {
        case static_cast<int>(layout::CountRow::NumTokens): value = p.num_tokens; break;
        case static_cast<int>(layout::CountRow::MaxRecvRows): value = p.max_recv_rows; break;
        case static_cast<int>(layout::CountRow::MaxPermutedRows): value = p.max_permuted_rows; break;
        case static_cast<int>(layout::CountRow::PadMultiple): value = p.pad_multiple; break;
        default:
          for (int b = 0; b < static_cast<int>(gridDim.x); ++b) value += arch::ld_global(&c.lay.metadata_counts(dom.self(), b)[i]);
      }
      for (int peer = dom.nvlink_begin(); peer < dom.nvlink_end(); ++peer)
        transport::nvlink::put(&c.lay.count_row(dom.peers.base(peer), c.parity, dom.rank)[i], value);
    }
    // The block barrier orders every thread's stores before the releases, which are
    // cumulative: each publishes them with its own (no fence needed).
    __syncthreads();
    for (int peer = dom.nvlink_begin() + static_cast<int>(threadIdx.x); peer < dom.nvlink_end();
         peer += static_cast<int>(blockDim.x))
      transport::nvlink::signal_release(c.lay.count_flag(dom.peers.base(peer), dom.rank), flag_of(seq));
  }

  // Phase (4): waits for every rank's count row in this rank's table.
  RAILYARD_DEVICE static void wait_for_count_rows(const Context& c, uint64_t seq) {
    const DomainParams& dom = c.dom;
    for (int src = static_cast<int>(threadIdx.x); src < c.R; src += static_cast<int>(blockDim.x)) {
      const uint32_t* flag = c.lay.count_flag(dom.self(), src);
      const uint32_t* barrier_flag = c.lay.barrier_flag(dom.self(), src);
      bool in_other_op = false;  // src runs an operation with an entry barrier at `seq` instead
      pipeline::timeout_while(
          [&] {
            if (!flag_behind(arch::ld_acquire_sys(flag), seq)) return false;
            in_other_op = arch::ld_relaxed_sys(barrier_flag) == flag_of(seq);
            return !in_other_op;
          },
          {"count row of rank", src, static_cast<int64_t>(seq)}, dom.handshake_wait());
      if (in_other_op) report_mixed_handshakes(dom, seq);
    }
  }

  // Phase (4), one warp of block 0: the count table into the handle (pad_multiple must
  // agree: every rank compares every row with rank 0's, in rank order, so every rank
  // reports the same first rank that differs), then this rank's totals as a destination.
  RAILYARD_DEVICE static void fill_count_table_and_totals(const Params& p, const Context& c) {
    const int R = c.R, El = c.El, me = c.dom.rank;
    const int lane = static_cast<int>(arch::lane_idx());
    const int pad_index = static_cast<int>(layout::CountRow::PadMultiple);
    const int32_t rank0_pad = column(c, 0, pad_index);
    for (int src = 0; src < R; ++src) {
      for (int i = lane; i < c.row_ints; i += 32) arch::st_global(&c.h.count_matrix[int64_t{src} * c.row_ints + i], column(c, src, i));
      const int32_t pad = column(c, src, pad_index);
      if (lane == 0 && pad != rank0_pad)
        pipeline::fail_operation(c.dom.failure_record, pipeline::FailureKind::Mismatch, src,
                                 static_cast<int32_t>(pipeline::AbortReason::DifferentPadMultiples), src, pad,
                                 rank0_pad);
    }
    int64_t permuted = 0;
    for (int j = lane; j < El; j += 32) {
      int64_t count = 0;
      for (int src = 0; src < R; ++src) count += column(c, src, layout::count_to_expert(R, El, me, j));
      const int64_t padded = layout::round_up(count, p.pad_multiple);
      arch::st_global(&c.h.totals[static_cast<int>(layout::Total::TokensPerExpert) + j], padded);
      arch::st_global(&c.h.totals[static_cast<int>(layout::Total::TokensPerExpert) + El + j], count);
      permuted += padded;
    }
    permuted = warp_sum(permuted);
    if (lane == 0) {
      int64_t recv = 0;
      for (int src = 0; src < R; ++src) recv += column(c, src, layout::count_to_rank(me));
      arch::st_global(&c.h.totals[static_cast<int>(layout::Total::NumRecv)], recv);
      arch::st_global(&c.h.totals[static_cast<int>(layout::Total::NumPermuted)], permuted);
      arch::st_global(&c.h.totals[static_cast<int>(layout::Total::OverflowRecv)],
                      int64_t{p.max_recv_rows >= 0 && recv > p.max_recv_rows});
      arch::st_global(&c.h.totals[static_cast<int>(layout::Total::OverflowPermuted)],
                      int64_t{p.max_permuted_rows >= 0 && permuted > p.max_permuted_rows});
    }
  }

  // Phase (5): per key, where this block's tokens start on the destination: on rank d,
  // after the rows of ranks before this one; in expert j of d, after the padded groups
  // of d's experts before j and this rank's predecessors' rows in group j; among this
  // rank's rows packed for domain n, at 0; then after the blocks before this one. Added
  // to every warp's offsets within the block.
  RAILYARD_DEVICE static void add_offsets(const Params& p, const Context& c) {
    const int R = c.R, El = c.El, me = c.dom.rank;
    const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
    arch::SharedVar<uint32_t>* group_base = c.storage.masks;  // [E]: no tile uses the masks now
    for (int e = tid; e < c.E; e += threads) {
      int64_t total = 0;
      for (int src = 0; src < R; ++src) total += column(c, src, layout::count_to_expert(R, El, e / El, e % El));
      group_base[e].store(static_cast<uint32_t>(layout::round_up(total, p.pad_multiple)));
    }
    __syncthreads();
    for (int d = tid; d < R; d += threads) {
      uint32_t running = 0;
      for (int j = 0; j < El; ++j) {
        const uint32_t padded = group_base[d * El + j].load();
        group_base[d * El + j].store(running);
        running += padded;
      }
    }
    __syncthreads();
    for (int key = layout::kCountRowHeaderInts + tid; key < c.row_ints; key += threads) {
      const int first_expert_key = layout::count_to_expert(R, El, 0, 0);
      // A domain key numbers this rank's own tokens (its packed rows): no other rank's.
      const bool domain_key = key >= layout::count_to_domain(R, El, 0);
      int32_t offset = key < first_expert_key || domain_key ? 0 : static_cast<int32_t>(group_base[key - first_expert_key].load());
      for (int src = 0; !domain_key && src < me; ++src) offset += column(c, src, key);
      for (int b = 0; b < static_cast<int>(blockIdx.x); ++b)
        offset += arch::ld_global(&c.lay.metadata_counts(c.dom.self(), b)[key]);
      for (int w = 0; w < c.warps; ++w) c.row(w)[key].store(c.row(w)[key].load() + offset);
    }
  }

  // Phase (6) for one warp: its tokens' positions within the slice plus its offsets;
  // a slot past its rank's bound on permuted rows is dropped (-1).
  RAILYARD_DEVICE static void finish_slice(const Context& c, int warp, int begin, int end) {
    const int R = c.R, El = c.El, K = c.K;
    const arch::SharedVar<int32_t>* row = c.row(warp);
    for (int t = begin + static_cast<int>(arch::lane_idx()); t < end; t += 32) {
      for (int d = 0; d < R; ++d) {
        int32_t* pos = &c.h.recv_pos[int64_t{t} * R + d];
        const int32_t local = arch::ld_global(pos);
        if (local >= 0) arch::st_global(pos, local + row[layout::count_to_rank(d)].load());
      }
      for (int n = 0; n < c.Dk; ++n) {
        int32_t* pos = &c.h.domain_pos[int64_t{t} * c.Dk + n];
        const int32_t local = arch::ld_global(pos);
        if (local < 0) continue;
        const int32_t packed = local + row[layout::count_to_domain(R, El, n)].load();
        arch::st_global(pos, packed);
        arch::st_global(&c.h.domain_tokens[int64_t{n} * c.lay.shape().max_tokens + packed], static_cast<int32_t>(t));
      }
      for (int k = 0; k < K; ++k) {
        const int e = arch::ld_global(&c.h.slot_expert[int64_t{t} * K + k]);
        if (e < 0) continue;
        const int d = e / El;
        int32_t* pos = &c.h.slot_pos[int64_t{t} * K + k];
        int32_t final_pos = arch::ld_global(pos) + row[layout::count_to_expert(R, El, d, e % El)].load();
        const int32_t bound = column(c, d, static_cast<int>(layout::CountRow::MaxPermutedRows));
        if (bound >= 0 && final_pos >= bound) final_pos = -1;
        arch::st_global(pos, final_pos);
      }
    }
  }

  // Writes token t's slots (expert, prob, local position -1) into the handle, checks
  // them, and marks its destination ranks in `ranks`.
  RAILYARD_DEVICE static void normalise_token(const Params& p, const layout::HandleView& h, int t, int E, int El,
                                              int K, uint32_t* ranks, TokenSlots& slots) {
    int filled = 0;
    auto put = [&](int e, float prob) {
      slots.set(filled, e);
      arch::st_global(&h.slot_expert[int64_t{t} * K + filled], int32_t{e});
      arch::st_global(&h.slot_prob[int64_t{t} * K + filled], prob);
      arch::st_global(&h.slot_pos[int64_t{t} * K + filled], int32_t{-1});
      ranks[(e / El) / 32] |= 1u << ((e / El) % 32);
      ++filled;
    };
    if (p.topk_idx) {
      for (int k = 0; k < p.num_topk; ++k) {
        const int64_t e = arch::ld_global(&p.topk_idx[int64_t{t} * p.num_topk + k]);
        if (e < -1 || e >= E) abort_operation(p.domain, pipeline::AbortReason::ExpertOutOfRange, t, k, e);
        for (int prev = 0; e >= 0 && prev < k; ++prev)
          if (slots[prev] == e)  // slot prev holds topk_idx[prev] (or -1)
            abort_operation(p.domain, pipeline::AbortReason::ExpertChosenTwice, t, e, prev);
        if (e >= 0) {
          put(static_cast<int>(e), arch::ld_global(&p.topk_weights[int64_t{t} * p.num_topk + k]));
        } else {
          // An unused slot keeps its index, so slot k of the handle is slot k of the caller.
          arch::st_global(&h.slot_expert[int64_t{t} * K + filled], int32_t{-1});
          arch::st_global(&h.slot_prob[int64_t{t} * K + filled], 0.0f);
          arch::st_global(&h.slot_pos[int64_t{t} * K + filled], int32_t{-1});
          ++filled;
        }
      }
    } else {
      for (int e = 0; e < E; ++e) {
        if (!arch::ld_global(&p.routing_map[int64_t{t} * E + e])) continue;
        if (filled == K)
          abort_operation(p.domain, pipeline::AbortReason::TooManyExperts, t, K, e);
        put(e, arch::ld_global(&p.probs[int64_t{t} * E + e]));
      }
    }
    for (; filled < K; ++filled) {
      arch::st_global(&h.slot_expert[int64_t{t} * K + filled], int32_t{-1});
      arch::st_global(&h.slot_prob[int64_t{t} * K + filled], 0.0f);
      arch::st_global(&h.slot_pos[int64_t{t} * K + filled], int32_t{-1});
    }
  }
};

using Metadata = MetadataKernel<NvlinkOnly>;

}  // namespace railyard::kernels::intranode
