// Railyard hierarchical metadata: the intra-node metadata kernel over the whole group
// of D NVLink domains of R ranks, whose count rows cross domains rail by rail. See
// docs/design-internode.md, "Metadata across domains".
//
// Every rank counts its tokens per rank and per expert of the group (the intra-node
// kernel's phases 1-2, with D x R ranks), and block 0 publishes its count row to the
// ranks of its NVLink domain (phase 3). Then RailRelay, in block 0:
//  (a) one RDMA put with a signal per remote domain: this rank's row, from its slot in
//      its own count table, to its rail peer there (the rank of its local index);
//  (b) every lane's completions: a NIC error is reported here, by the rank that posted;
//  (c) per remote domain, the rail peer's row, once its signal counts this metadata
//      operation, into the count table of every rank of this NVLink domain, then the
//      row's flag, as if the rail peer had published it over NVLink.
// Then every block waits for the D x R rows (phase 4) and finishes as on one domain.
// Only counts cross the NICs: D - 1 rows per rank and operation, no routing map.
//
// Signals only grow (the transport contract): rail peer r adds 1 per metadata
// operation, and this rank waits for the count of metadata operations it has finished
// (kept in its RDMA state) plus one. The RDMA count rows alternate by that count's
// parity: a rail peer may start the next metadata operation before this rank has
// relayed its row of this one, never the one after (it needs this rank's row of the
// next one first, which this rank sends after relaying).
#pragma once

#include <cstdint>

#include "kernels/hierarchical/metadata.hpp"
#include "kernels/hierarchical/rail.cuh"
#include "kernels/intranode/metadata.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/layout/hierarchical_layout.cuh"
#include "railyard/transport/contract.cuh"
#include "railyard/transport/nvlink.cuh"

namespace railyard::kernels::hierarchical {

template <class T>
struct RailRelay {
  static constexpr const char* kName = "hierarchical::Metadata";
  struct Params {
    layout::HierarchicalShape shape;
    const typename T::LaneDesc* lanes;  // [(D - 1) L], HierarchicalLayout::lane_index order
  };

  // Run by every thread of block 0 after phase 3 (this rank's row is in its NVLink
  // peers' tables and its own, and its flags are released).
  RAILYARD_DEVICE static void relay(const Params& rp, const intranode::DomainParams& dom,
                                    const layout::IntranodeLayout& lay, uint64_t seq) {
    const layout::HierarchicalLayout H(rp.shape);
    const int R = rp.shape.domain.ranks_per_domain;
    uint64_t* ops_done = reinterpret_cast<uint64_t*>(dom.self() + H.metadata_ops_offset());
    const uint64_t ops = arch::ld_global(ops_done);  // by every thread, before the barrier below
    const int warp = static_cast<int>(arch::warp_idx()), warps = static_cast<int>(blockDim.x / 32);
    const auto row_bytes = static_cast<uint32_t>(lay.count_row_ints() * 4);
    const auto own_row = static_cast<uint64_t>(reinterpret_cast<uint8_t*>(lay.count_row(dom.self(), seq & 1u, dom.rank)) - dom.self());
    // (a) This rank's row to every rail peer. The block barrier that ended phase 3
    // ordered every thread's stores of it before this warp's doorbell release.
    for (int r = warp; r < H.remote_domains(); r += warps) {
      const RailPeer peer = rail_peer(dom.rank, R, r);
      typename T::Lane lane = T::lane(rp.lanes, H.lane_index(r, 0), dom.handshake_wait());
      lane.put_signal({own_row}, {peer.rank, static_cast<uint64_t>(H.count_row_offset(peer.at_peer, ops))}, row_bytes,
                      {peer.rank, static_cast<uint64_t>(H.metadata_signal_offset(peer.at_peer))}, 1);
      lane.submit();
    }
    // (b) The puts' completions, before waiting for the peers' rows: a NIC error is
    // reported here, naming the queue pair and the WQE, rather than as a peer's row that
    // never came. (The source is rewritten by operation seq + 2.)
    for (int r = warp; r < H.remote_domains(); r += warps) {
      typename T::Lane lane = T::lane(rp.lanes, H.lane_index(r, 0), dom.handshake_wait());
      lane.quiet();
    }
    // (c) Each rail peer's row into this domain's tables, then its flag.
    for (int r = warp; r < H.remote_domains(); r += warps) {
      const int src = rail_peer(dom.rank, R, r).rank;
      T::wait_signal(rp.lanes, H.lane_index(r, 0), dom.self(), H.metadata_signal_offset(r), ops + 1,
                     {"count row relayed by RDMA from rank", src, static_cast<int64_t>(seq)}, dom.handshake_wait());
      const auto* row = reinterpret_cast<const int32_t*>(dom.self() + H.count_row_offset(r, ops));
      for (int i = static_cast<int>(arch::lane_idx()); i < lay.count_row_ints(); i += 32) {
        const int32_t value = arch::ld_global(&row[i]);
        for (int p = dom.nvlink_begin(); p < dom.nvlink_end(); ++p)
          transport::nvlink::put(&lay.count_row(dom.peers.base(p), seq & 1u, src)[i], value);
      }
      __syncwarp();  // orders every lane's stores before the releases, which are cumulative
      for (int p = dom.nvlink_begin() + static_cast<int>(arch::lane_idx()); p < dom.nvlink_end(); p += 32)
        transport::nvlink::signal_release(lay.count_flag(dom.peers.base(p), src), intranode::flag_of(seq));
    }
    __syncthreads();  // every thread of the block has read `ops`
    if (threadIdx.x == 0) arch::st_global(ops_done, ops + 1);
  }
};

template <class T>
using Metadata = intranode::MetadataKernel<RailRelay<T>>;

}  // namespace railyard::kernels::hierarchical
