// Railyard intra-node metadata kernel: from this rank's routing, every position its
// tokens will take on every rank, exchanging only counts. See docs/design-intranode.md,
// "Metadata: what ranks exchange, and why that little".
//
// One block of one warp per rank. Tokens go in tiles of 32, one per lane. Positions
// must follow token order (the canonical received order), and a token's experts on a
// rank may sit in any of its top-k slots. Destination ranks are given key by key: the
// warp takes the smallest rank any lane still holds, ballots which lanes hold it, and
// gives them running + rank-among-lower-lanes (iterations per tile: distinct ranks in
// the tile, at most R). Experts, of which a tile may hold up to 32 x K distinct ones,
// go through a per-expert mask of the tile's lanes in shared memory instead: every lane
// sets its bit in the masks of its experts (atomicOr, so the result does not depend on
// the order), then reads running + the bits below its own; the lowest lane of each
// expert advances its counter, and every lane clears its bits (atomicAnd): four passes
// over the lane's K slots a tile, however many distinct experts.
//
// Phases: (1) normalise routing to slots and count, writing local positions into the
// handle; (2) publish this rank's count row to every rank; (3) wait for every rank's
// row and copy the table into the handle; (4) this rank's totals as a destination;
// (5) global offsets; (6) local positions + offsets = final positions.
#pragma once

#include <cstdint>

#include "kernels/intranode/metadata.hpp"
#include "kernels/intranode/protocol.cuh"
#include "railyard/arch/fault.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/layout/intranode_layout.cuh"
#include "railyard/pipeline/wait.cuh"

namespace railyard::kernels::intranode {

struct Metadata {
  static constexpr const char* kName = "intranode::Metadata";
  static constexpr uint32_t kMaxThreadsPerBlock = 32;
  static constexpr uint32_t kMinBlocksPerSm = 1;
  // The largest count row: 72 ranks x (1 + 256 experts) plus its header.
  static constexpr int kMaxCountRowInts =
      layout::kCountRowHeaderInts + layout::kMaxRanksPerDomain * (1 + layout::kMaxLocalExperts);
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
  };

  // This rank's count row while counting, then the global offsets (phase 5); per
  // global expert, the lanes of the current tile that chose it (zero between tiles).
  struct SharedStorage {
    alignas(16) arch::SharedVar<int32_t> row[kMaxCountRowInts];
    arch::SharedVar<uint32_t> lanes_of_expert[layout::kMaxRanksPerDomain * layout::kMaxLocalExperts];
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "metadata shared memory exceeds the per-block budget");

  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }

  static Params to_params(const Arguments& a) {
    Params p{};
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
    const layout::IntranodeLayout lay(dom.shape);
    const int R = dom.shape.num_ranks, El = dom.shape.num_local_experts, K = dom.shape.max_topk;
    const int E = R * El, me = dom.rank, T = p.num_tokens, row_ints = lay.count_row_ints();
    const uint32_t lane = arch::lane_idx();
    const uint32_t lower_lanes = (1u << lane) - 1u;
    const layout::HandleView h = layout::HandleView::carve(lay, p.handle, p.recv_capacity);
    arch::SharedVar<int32_t>* row = storage.row;
    const uint64_t seq = op_begin(dom);

    for (int i = static_cast<int>(lane); i < row_ints; i += 32) row[i].store(0);
    for (int e = static_cast<int>(lane); e < E; e += 32) storage.lanes_of_expert[e].store(0u);
    __syncwarp();
    if (lane == 0) {
      arch::st_global(h.made_by_op, seq);  // the handle's identity (entry_barrier)
      row[static_cast<int>(layout::CountRow::NumTokens)].store(T);
      row[static_cast<int>(layout::CountRow::MaxRecvRows)].store(p.max_recv_rows);
      row[static_cast<int>(layout::CountRow::MaxPermutedRows)].store(p.max_permuted_rows);
      row[static_cast<int>(layout::CountRow::PadMultiple)].store(p.pad_multiple);
    }
    __syncwarp();

    // ---- (1) slots, counts and local positions, tile by tile ----------------------
    for (int base = 0; base < T; base += 32) {
      const int t = base + static_cast<int>(lane);
      const bool valid = t < T;
      uint32_t ranks[kMaxRankWords] = {};
      if (valid) normalise_token(p, h, t, E, El, K, ranks);
      for (int d = 0; valid && d < R; ++d) arch::st_global(&h.recv_pos[int64_t{t} * R + d], int32_t{-1});

      // Destination ranks, in ascending order of rank.
      for (;;) {
        int my_first = R;
        for (int w = 0; w < kMaxRankWords && my_first == R; ++w)
          if (ranks[w]) my_first = w * 32 + __ffs(static_cast<int>(ranks[w])) - 1;
        const int d = warp_min(my_first);
        if (d >= R) break;
        const bool mine = my_first == d;
        const uint32_t holders = __ballot_sync(arch::kFullWarpMask, mine);
        if (mine) {
          arch::st_global(&h.recv_pos[int64_t{t} * R + d], row[layout::count_to_rank(d)].load() + __popc(holders & lower_lanes));
          ranks[d / 32] &= ~(1u << (d % 32));
        }
        __syncwarp();
        if (lane == 0) row[layout::count_to_rank(d)].store(row[layout::count_to_rank(d)].load() + __popc(holders));
        // No warp barrier: the next iteration reads another rank's counter (d grows),
        // and the expert passes below read experts' counters only after their own warp
        // barrier, as does the next tile (the barrier that ends this one).
      }
      // Experts: every lane marks its experts, then takes running + the marks below it;
      // the lowest lane of each expert then advances its counter; every lane clears its
      // marks.
      const int32_t* experts = &h.slot_expert[int64_t{t} * K];
      for (int k = 0; valid && k < K; ++k) {
        const int e = arch::ld_global(&experts[k]);
        if (e >= 0) storage.lanes_of_expert[e].fetch_or(1u << lane);
      }
      __syncwarp();
      for (int k = 0; valid && k < K; ++k) {
        const int e = arch::ld_global(&experts[k]);
        if (e < 0) continue;
        const uint32_t lanes = storage.lanes_of_expert[e].load();
        const int key = layout::count_to_expert(R, El, e / El, e % El);
        arch::st_global(&h.slot_pos[int64_t{t} * K + k], row[key].load() + __popc(lanes & lower_lanes));
      }
      __syncwarp();
      for (int k = 0; valid && k < K; ++k) {
        const int e = arch::ld_global(&experts[k]);
        if (e < 0) continue;
        const uint32_t lanes = storage.lanes_of_expert[e].load();
        if (lanes & lower_lanes) continue;  // one lane a key writes its counter
        const int key = layout::count_to_expert(R, El, e / El, e % El);
        row[key].store(row[key].load() + __popc(lanes));
      }
      // Every mask read above; each lane clears its own bits (atomically: other lanes
      // clear theirs in the same words).
      __syncwarp();
      for (int k = 0; valid && k < K; ++k) {
        const int e = arch::ld_global(&experts[k]);
        if (e >= 0) storage.lanes_of_expert[e].fetch_and(~(1u << lane));
      }
      // No warp barrier: the next tile's first accesses to masks are atomics, and it
      // reads masks and expert counters only after its own warp barrier.
    }

    // ---- (2) publish this rank's count row to every rank (itself included) ----------
    const auto parity = static_cast<uint32_t>(seq & 1u);
    for (int peer = 0; peer < R; ++peer) {
      int32_t* dst = lay.count_row(dom.peers.ptr[peer], parity, me);
      for (int i = static_cast<int>(lane); i < row_ints; i += 32) arch::st_global(&dst[i], row[i].load());
      // The warp barrier orders every lane's stores before lane 0's release, which is
      // cumulative: it publishes them with its own (no fence needed).
      __syncwarp();
      if (lane == 0) arch::st_release_sys(lay.count_flag(dom.peers.ptr[peer], me), flag_of(seq));
    }

    // ---- (3) every rank's row: wait, check, copy into the handle -----------------------
    for (int src = static_cast<int>(lane); src < R; src += 32) {
      const uint32_t* flag = lay.count_flag(dom.self(), src);
      const uint32_t* barrier_flag = lay.barrier_flag(dom.self(), src);
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
    __syncwarp();
    // pad_multiple must agree: every rank compares every row with rank 0's, in rank
    // order, so every rank reports the same first rank that differs.
    const auto pad_of = [&](int src) {
      return arch::ld_global(&lay.count_row(dom.self(), parity, src)[static_cast<int>(layout::CountRow::PadMultiple)]);
    };
    const int32_t rank0_pad = pad_of(0);
    for (int src = 0; src < R; ++src) {
      const int32_t* table_row = lay.count_row(dom.self(), parity, src);
      for (int i = static_cast<int>(lane); i < row_ints; i += 32)
        arch::st_global(&h.count_matrix[int64_t{src} * row_ints + i], arch::ld_global(&table_row[i]));
      const int32_t pad = pad_of(src);
      if (lane == 0 && pad != rank0_pad)
        pipeline::fail_operation(dom.failure_record, pipeline::FailureKind::Mismatch, src,
                                 static_cast<int32_t>(pipeline::AbortReason::DifferentPadMultiples), src, pad,
                                 rank0_pad);
    }
    // No warp barrier: (4) and (5) read the count table, not what (3) wrote.

    // ---- (4) totals of this rank as a destination ------------------------------------------
    int64_t permuted = 0;
    for (int j = static_cast<int>(lane); j < El; j += 32) {
      int64_t count = 0;
      for (int src = 0; src < R; ++src) count += column(lay, dom, parity, src, layout::count_to_expert(R, El, me, j));
      const int64_t padded = layout::round_up(count, p.pad_multiple);
      arch::st_global(&h.totals[static_cast<int>(layout::Total::TokensPerExpert) + j], padded);
      arch::st_global(&h.totals[static_cast<int>(layout::Total::TokensPerExpert) + El + j], count);
      permuted += padded;
    }
    permuted = warp_sum(permuted);
    if (lane == 0) {
      int64_t recv = 0;
      for (int src = 0; src < R; ++src) recv += column(lay, dom, parity, src, layout::count_to_rank(me));
      arch::st_global(&h.totals[static_cast<int>(layout::Total::NumRecv)], recv);
      arch::st_global(&h.totals[static_cast<int>(layout::Total::NumPermuted)], permuted);
      arch::st_global(&h.totals[static_cast<int>(layout::Total::OverflowRecv)],
                      int64_t{p.max_recv_rows >= 0 && recv > p.max_recv_rows});
      arch::st_global(&h.totals[static_cast<int>(layout::Total::OverflowPermuted)],
                      int64_t{p.max_permuted_rows >= 0 && permuted > p.max_permuted_rows});
    }
    // No warp barrier: nothing below reads the totals.

    // ---- (5) offsets of this rank's tokens on every rank, into `row` ---------------------
    // recv offset on d: rows from ranks before me. Expert j of d starts after the padded
    // groups of d's experts before j; my rows in it come after those of ranks before me.
    for (int d = static_cast<int>(lane); d < R; d += 32) {
      int32_t recv_off = 0;
      for (int src = 0; src < me; ++src) recv_off += column(lay, dom, parity, src, layout::count_to_rank(d));
      row[layout::count_to_rank(d)].store(recv_off);
      int64_t group_base = 0;
      for (int j = 0; j < El; ++j) {
        const int key = layout::count_to_expert(R, El, d, j);
        int64_t before_me = 0, total = 0;
        for (int src = 0; src < R; ++src) {
          const int32_t c = column(lay, dom, parity, src, key);
          total += c;
          if (src < me) before_me += c;
        }
        row[key].store(static_cast<int32_t>(group_base + before_me));
        group_base += layout::round_up(total, p.pad_multiple);
      }
    }
    __syncwarp();

    // ---- (6) final positions (each lane finishes the tokens it started in (1)) -----------
    for (int t = static_cast<int>(lane); t < T; t += 32) {
      for (int d = 0; d < R; ++d) {
        int32_t* pos = &h.recv_pos[int64_t{t} * R + d];
        const int32_t local = arch::ld_global(pos);
        if (local >= 0) arch::st_global(pos, local + row[layout::count_to_rank(d)].load());
      }
      for (int k = 0; k < K; ++k) {
        const int e = arch::ld_global(&h.slot_expert[int64_t{t} * K + k]);
        if (e < 0) continue;
        const int d = e / El;
        int32_t* pos = &h.slot_pos[int64_t{t} * K + k];
        int32_t final_pos = arch::ld_global(pos) + row[layout::count_to_expert(R, El, d, e % El)].load();
        const int32_t bound =
            column(lay, dom, parity, d, static_cast<int>(layout::CountRow::MaxPermutedRows));
        if (bound >= 0 && final_pos >= bound) final_pos = -1;
        arch::st_global(pos, final_pos);
      }
    }
    op_end(dom, seq);
  }

 private:
  // Entry `index` of rank src's count row in this rank's count table.
  RAILYARD_DEVICE static int32_t column(const layout::IntranodeLayout& lay, const DomainParams& dom,
                                        uint32_t parity, int src, int index) {
    return arch::ld_global(&lay.count_row(dom.self(), parity, src)[index]);
  }

  RAILYARD_DEVICE static int warp_min(int v) {
    for (int offset = 16; offset > 0; offset /= 2) {
      const int other = __shfl_xor_sync(arch::kFullWarpMask, v, offset);
      v = other < v ? other : v;
    }
    return v;
  }

  RAILYARD_DEVICE static int64_t warp_sum(int64_t v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(arch::kFullWarpMask, v, offset);
    return v;
  }

  // Writes token t's slots (expert, prob, local position -1) into the handle, checks
  // them, and marks its destination ranks in `ranks`.
  RAILYARD_DEVICE static void normalise_token(const Params& p, const layout::HandleView& h, int t, int E, int El,
                                              int K, uint32_t* ranks) {
    int filled = 0;
    auto put = [&](int e, float prob) {
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
          if (arch::ld_global(&p.topk_idx[int64_t{t} * p.num_topk + prev]) == e)
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

}  // namespace railyard::kernels::intranode
