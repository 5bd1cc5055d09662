// Railyard hierarchical dispatch: the intra-node dispatch (kernels/intranode/dispatch.cuh)
// over a group of D NVLink domains of R ranks, with Forwarding as its Remote part. See
// docs/design-internode.md, "Dispatch across domains".
//
// - This rank's tokens go over NVLink to the ranks of its own domain only.
// - A sixth warp (RdmaSender, dispatch_rdma.cuh) packs this rank's rows for every
//   other domain into wire rows and puts them, a chunk of C rows with a signal at a
//   time, into its rail peer's receive area there. A token crosses each NIC once per
//   destination domain.
// - Beside its own tokens, two Forward warps per block forward the wire rows its rail
//   peers put into this rank's receive areas, chunk by chunk, each chunk once its
//   signal has counted this operation: exactly as the source would have sent the row
//   within its own domain (the same staging row, header, entries and scales).
// Copy-out is the intra-node one: every received row, local or forwarded, lands at
// the position the group's metadata gave it.
//
// A chunk signal grows only in the operations whose source packed that chunk, so the
// receiver keeps, per chunk, how far it has consumed the signal (HierarchicalLayout
// counters): the warp it is dealt to waits for the count + 1. A chunk is dealt to one
// Forward warp per operation; warps may differ between operations, the counts live in
// global memory and the kernel boundary orders them.
#pragma once

#include <cstdint>

#include "kernels/hierarchical/dispatch_rdma.cuh"
#include "kernels/intranode/dispatch.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/layout/hierarchical_layout.cuh"
#include "railyard/transport/contract.cuh"

namespace railyard::kernels::hierarchical {

template <class T>
struct Forwarding {
  static constexpr const char* kName = "hierarchical::Dispatch";
  static constexpr bool kForwards = true;
  static constexpr uint32_t kWarps = 1;

  // Where a wire row's parts lie (HierarchicalLayout::wire_*), computed on the host.
  struct WireFormat {
    int64_t slots, recv_pos, scales, payload, row_bytes;
  };
  struct Params {
    RdmaSendParams<T> send;  // this rank, its buffer, handle, tokens, lanes and waits
    WireFormat wire;
  };
  template <uint32_t SlotBytes>
  using Storage = RdmaSendStorage<SlotBytes>;

  static Params make(const RdmaSendParams<T>& send) {
    const layout::HierarchicalLayout H(send.shape);
    return {send, {H.wire_slots_offset(), H.wire_recv_pos_offset(), H.wire_header_bytes(), H.wire_payload_offset(),
                   H.wire_dispatch_row_bytes()}};
  }

  template <uint32_t SlotBytes>
  RAILYARD_DEVICE static void init(RdmaSendStorage<SlotBytes>& s) {
    s.init();
  }
  // The RDMA send warp of this block.
  template <uint32_t SlotBytes>
  RAILYARD_DEVICE static void send(const Params& p, RdmaSendStorage<SlotBytes>& s) {
    RdmaSender<T, SlotBytes>(p.send, s).run(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
  }

  // A wire row's parts.
  RAILYARD_DEVICE static const layout::WireHeader* header(const Params&, const uint8_t* row) {
    return reinterpret_cast<const layout::WireHeader*>(row);
  }
  RAILYARD_DEVICE static const layout::WireSlot* slots(const Params& p, const uint8_t* row) {
    return reinterpret_cast<const layout::WireSlot*>(row + p.wire.slots);
  }
  RAILYARD_DEVICE static const int32_t* recv_pos(const Params& p, const uint8_t* row) {
    return reinterpret_cast<const int32_t*>(row + p.wire.recv_pos);
  }
  RAILYARD_DEVICE static const float* scales(const Params& p, const uint8_t* row) {
    return reinterpret_cast<const float*>(row + p.wire.scales);
  }
  RAILYARD_DEVICE static const uint8_t* payload(const Params& p, const uint8_t* row) { return row + p.wire.payload; }

  // Warp-collective, by Forward warp f of this block's F: fn(rows, n, stride,
  // forwarded) for each chunk of received wire rows dealt to it, once its signal has
  // counted this operation; `forwarded` is the chunk's first row in the handle's
  // forward_pos (source domain x M + packed row). Chunks are dealt round robin in the
  // order the rail peers send them (in rounds, round j the j-th chunk of every lane:
  // chunk l + j L of lane l, lanes in HierarchicalLayout::dealt_lane order), to every
  // block's warp 0, then every block's warp 1, ..., except that the blocks whose RDMA
  // warp drives one lane more than others (blocks below lanes mod blocks: it deals
  // lanes round robin) leave out their last Forward warp: their SM's TMA also carries
  // that lane's packing. The count of rows comes from the rail peer's count row
  // (count_to_domain of this domain), which the metadata relayed.
  template <class Fn>
  RAILYARD_DEVICE static void for_each_chunk(const Params& p, int f, int F, Fn&& fn) {
    const RdmaSendParams<T>& q = p.send;
    const layout::HierarchicalLayout H(q.shape);
    const int64_t B = gridDim.x, b = blockIdx.x, busy = F > 1 ? H.lanes() % B : 0;
    if (f == F - 1 && b < busy) return;
    const int64_t warps = F * B - busy, mine = f * B + b - (f == F - 1 ? busy : 0);
    int64_t dealt = 0;
    for (int64_t j = 0, more = 1; more; ++j) {
      more = 0;
      for (int d = 0; d < H.lanes(); ++d) {
        const ReceivedLane in = received_lane(q, H, H.dealt_lane(d));
        const int64_t c = in.l + j * q.shape.lanes_per_peer;
        if (c * q.shape.dispatch.chunk_tokens >= in.rows) continue;
        more = 1;
        if (dealt++ % warps == mine) forward_chunk(p, H, in, c, fn);
      }
    }
  }

 private:
  // Lane q towards remote domain r = q / L (lane l = q % L) as the receiver sees it: the
  // rail peer's domain and rank, and the rows it packed for this domain.
  struct ReceivedLane {
    int q, r, l, other, src;
    int32_t rows;
  };
  RAILYARD_DEVICE static ReceivedLane received_lane(const RdmaSendParams<T>& q, const layout::HierarchicalLayout& H,
                                                    int lane) {
    const layout::IntranodeLayout& L = H.nvlink();
    const int R = q.shape.domain.ranks_per_domain, mine = q.rank / R, lanes = q.shape.lanes_per_peer;
    const int r = lane / lanes, other = r < mine ? r : r + 1, src = other * R + q.rank % R;
    const int32_t rows =
        arch::ld_global(q.handle.count_matrix + int64_t{src} * L.count_row_ints() +
                        layout::count_to_domain(L.shape().ranks_per_domain, L.shape().num_local_experts, mine));
    return {lane, r, lane % lanes, other, src, rows};
  }

  // Chunk c of the lane: waited for, then fn on its rows.
  template <class Fn>
  RAILYARD_DEVICE static void forward_chunk(const Params& p, const layout::HierarchicalLayout& H,
                                            const ReceivedLane& in, int64_t c, Fn&& fn) {
    const RdmaSendParams<T>& q = p.send;
    const int C = q.shape.dispatch.chunk_tokens;
    if (arch::lane_idx() == 0) {
      auto* consumed = reinterpret_cast<uint64_t*>(q.self + H.dispatch_consumed_offset(in.r, c));
      const uint64_t target = arch::ld_global(consumed) + 1;
      T::wait_signal(q.lanes, in.q, q.self, H.dispatch_signal_offset(in.r, c), target,
                     {"dispatch forwarding: wire rows of chunk (index) from rank (value)", c, in.src},
                     q.handshake_wait);
      arch::st_global(consumed, target);
    }
    // Lane 0's acquire, then the warp barrier: every lane reads the rows; the proxy
    // fence orders them before the TMA loads of their bytes (the leader's).
    __syncwarp();
    arch::fence_proxy_async_global();
    const int n = in.rows - c * C < C ? static_cast<int>(in.rows - c * C) : C;
    fn(q.self + H.dispatch_recv_row_offset(in.r, c * C), n, p.wire.row_bytes,
       int64_t{in.other} * q.shape.domain.max_tokens + c * C);
  }
};

template <class T>
using Dispatch = intranode::Dispatch<intranode::kDispatchSlotBytes, intranode::kDispatchStages, Forwarding<T>>;

}  // namespace railyard::kernels::hierarchical
