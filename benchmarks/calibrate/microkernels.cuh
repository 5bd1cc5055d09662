// Railyard calibration: one microkernel per resource of the timed simulator's cost
// model (include/railyard/sim/timing.hpp), written once as Railyard kernel types
// (kernels/common/device_kernel.cuh) so that the same code runs
//  - in the timed simulator, where tests/sim/timing_test.cpp checks that each one
//    reproduces its preset constant within 10%, and
//  - on a GPU, where railyard_calibrate_cuda (benchmarks/calibrate/calibrate.cu, run
//    by scripts/gpu-calibrate.sh) measures it, so that measured / simulated says how
//    far each constant is from the machine.
// Every kernel that times itself writes SM cycles (clock64) to `out`; the others are
// timed from the host (events).
#pragma once

#include <cstddef>
#include <cstdint>

#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/mbarrier.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/common/macros.cuh"

namespace railyard::calibration {

inline constexpr uint32_t kPiece = 16384;  // bytes of one bulk copy

// The members every kernel type here shares: one warp unless it says otherwise.
template <uint32_t Threads>
struct KernelBase {
  static constexpr uint32_t kMaxThreadsPerBlock = Threads;
  static constexpr uint32_t kMinBlocksPerSm = 1;
};

template <std::size_t Bytes>
struct alignas(16) Bytes16 {
  uint8_t bytes[Bytes];
};

// HBM: lane 0 of every block streams `pieces` pieces from src to dst through shared
// memory, Depth in flight (G2S on an mbarrier per slot, then S2G); block b copies
// pieces [b * pieces, (b + 1) * pieces).
template <int Depth>
struct StreamCopy : KernelBase<32> {
  static constexpr const char* kName = "calibration::StreamCopy";
  struct SharedStorage {
    Bytes16<std::size_t{Depth} * kPiece> slots;
    uint64_t bars[Depth];
  };
  struct Params {
    const uint8_t* src;
    uint8_t* dst;
    int pieces;
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage& s) const {
    if (arch::lane_idx() != 0) return;
    for (int b = 0; b < Depth; ++b) arch::mbarrier_init(&s.bars[b], 1);
    arch::fence_mbarrier_init_release_cluster();
    const int64_t first = int64_t{blockIdx.x} * p.pieces;
    for (int i = 0; i < p.pieces; ++i) {
      const int b = i % Depth;
      uint8_t* slot = s.slots.bytes + std::size_t{kPiece} * b;
      if (i >= Depth) arch::bulk_wait_group_read<Depth - 1>();  // slot b's S2G has read it
      arch::mbarrier_arrive_expect_tx(&s.bars[b], kPiece);
      arch::bulk_copy_g2s(slot, p.src + (first + i) * kPiece, kPiece, &s.bars[b]);
      while (!arch::mbarrier_try_wait_parity(&s.bars[b], static_cast<uint32_t>(i / Depth) & 1u)) {
      }
      arch::bulk_copy_s2g(p.dst + (first + i) * kPiece, slot, kPiece);
      arch::bulk_commit_group();
    }
    arch::bulk_wait_group<0>();
  }
};

// One SM's TMA engine: lane 0 of one block loads `pieces` pieces into shared memory,
// Depth in flight.
template <int Depth>
struct BulkLoads : KernelBase<32> {
  static constexpr const char* kName = "calibration::BulkLoads";
  struct SharedStorage {
    Bytes16<std::size_t{Depth} * kPiece> slots;
    uint64_t bars[Depth];
  };
  struct Params {
    const uint8_t* src;
    int pieces;
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage& s) const {
    if (arch::lane_idx() != 0) return;
    for (int b = 0; b < Depth; ++b) arch::mbarrier_init(&s.bars[b], 1);
    arch::fence_mbarrier_init_release_cluster();
    for (int i = 0; i < p.pieces; ++i) {
      const int b = i % Depth;
      if (i >= Depth) {
        while (!arch::mbarrier_try_wait_parity(&s.bars[b], static_cast<uint32_t>(i / Depth - 1) & 1u)) {
        }
      }
      arch::mbarrier_arrive_expect_tx(&s.bars[b], kPiece);
      arch::bulk_copy_g2s(s.slots.bytes + std::size_t{kPiece} * b, p.src + int64_t{i} * kPiece, kPiece, &s.bars[b]);
    }
    for (int i = p.pieces > Depth ? p.pieces - Depth : 0; i < p.pieces; ++i) {
      while (!arch::mbarrier_try_wait_parity(&s.bars[i % Depth], static_cast<uint32_t>(i / Depth) & 1u)) {
      }
    }
  }
};

// NVLink: lane 0 of every block bulk-stores `pieces` pieces to dst (a peer's memory),
// up to 9 bulk groups in flight; block b writes pieces [b * pieces, (b + 1) * pieces).
struct PeerBulkStores : KernelBase<32> {
  static constexpr const char* kName = "calibration::PeerBulkStores";
  struct SharedStorage {
    Bytes16<kPiece> piece;
  };
  struct Params {
    uint8_t* dst;
    int pieces;
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage& s) const {
    if (arch::lane_idx() != 0) return;
    for (int i = 0; i < p.pieces; ++i) {
      arch::bulk_copy_s2g(p.dst + (int64_t{blockIdx.x} * p.pieces + i) * kPiece, s.piece.bytes, kPiece);
      arch::bulk_commit_group();
      arch::bulk_wait_group<8>();
    }
    arch::bulk_wait_group<0>();
  }
};

// Load latency: one thread follows `hops` pointers from `start` with plain loads;
// WithAcquire: each hop also reads a zero (zeros[i], a new one each hop: not a poll)
// with ld.acquire.gpu. out[0] = SM cycles, out[1] = the last pointer (keeps the chain).
template <bool WithAcquire>
struct PointerChase : KernelBase<1> {
  static constexpr const char* kName = "calibration::PointerChase";
  struct SharedStorage {};
  struct Params {
    const uint64_t* start;
    const uint64_t* zeros;  // [hops], WithAcquire only
    int hops;
    uint64_t* out;
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage&) const {
    uint64_t at = reinterpret_cast<uint64_t>(p.start);
    const auto t0 = static_cast<uint64_t>(clock64());
    for (int i = 0; i < p.hops; ++i) {
      at = arch::ld_global(reinterpret_cast<const uint64_t*>(at));
      if constexpr (WithAcquire) at += arch::ld_acquire_gpu(p.zeros + i);
    }
    const auto t1 = static_cast<uint64_t>(clock64());
    arch::st_global(p.out, t1 - t0);
    arch::st_global(p.out + 1, at);
  }
};

// Remote store latency: a flag in each device's memory, raised by the other device
// with st.release.sys and polled locally with ld.acquire.sys; the serving side raises
// first. Rounds first .. first + rounds - 1 (both flags hold first - 1 at the start,
// so that runs continue the count). One kernel per device, run at once.
struct FlagPingPong : KernelBase<1> {
  static constexpr const char* kName = "calibration::FlagPingPong";
  struct SharedStorage {};
  struct Params {
    uint32_t* mine;
    uint32_t* theirs;
    uint32_t first, rounds;
    bool serves;
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage&) const {
    for (uint32_t r = p.first; r != p.first + p.rounds; ++r) {
      if (p.serves) arch::st_release_sys(p.theirs, r);
      while (arch::ld_acquire_sys(p.mine) != r) {
      }
      if (!p.serves) arch::st_release_sys(p.theirs, r);
    }
  }
};

// Fences: one thread, `rounds` times: `stores` 4-byte stores to target[0..stores)
// (a peer's memory or the device's own), then fence.sc.sys (System) or
// fence.acq_rel.gpu (Gpu). out[0] = SM cycles.
enum class FenceScope : uint8_t { Gpu, System };
template <FenceScope Scope>
struct StoresThenFence : KernelBase<1> {
  static constexpr const char* kName = "calibration::StoresThenFence";
  struct SharedStorage {};
  struct Params {
    uint32_t* target;
    int stores;
    int rounds;
    uint64_t* out;
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage&) const {
    const auto t0 = static_cast<uint64_t>(clock64());
    for (int r = 0; r < p.rounds; ++r) {
      for (int i = 0; i < p.stores; ++i) arch::st_global(p.target + i, static_cast<uint32_t>(r));
      if constexpr (Scope == FenceScope::System) {
        arch::fence_sc_sys();
      } else {
        arch::fence_acq_rel_gpu();
      }
    }
    arch::st_global(p.out, static_cast<uint64_t>(clock64()) - t0);
  }
};

// Shared memory: 1024 threads each load `loads` x 16 bytes; sink[thread] keeps them.
struct SharedLoads : KernelBase<1024> {
  static constexpr const char* kName = "calibration::SharedLoads";
  struct alignas(16) V4 {
    uint32_t w[4];
  };
  struct SharedStorage {
    V4 v[1024];
  };
  struct Params {
    int loads;
    uint32_t* sink;
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage& s) const {
    uint32_t acc = 0;
    for (int i = 0; i < p.loads; ++i) acc += arch::ld_shared(&s.v[(threadIdx.x + i) % 1024]).w[0];
    arch::st_global(p.sink + threadIdx.x, acc);
  }
};

// Launch latency: a kernel that does nothing.
struct Empty : KernelBase<1> {
  static constexpr const char* kName = "calibration::Empty";
  struct SharedStorage {};
  struct Params {
    int unused;
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
  RAILYARD_DEVICE void operator()(const Params&, SharedStorage&) const {}
};

// __syncthreads and mbarrier round trips of 64 threads; thread 0 writes the SM cycles
// of `rounds` of each to out[0] and out[1].
struct Barriers : KernelBase<64> {
  static constexpr const char* kName = "calibration::Barriers";
  struct SharedStorage {
    uint64_t bar;
  };
  struct Params {
    int rounds;
    uint64_t* out;
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage& s) const {
    if (threadIdx.x == 0) arch::mbarrier_init(&s.bar, 64);
    __syncthreads();
    auto t0 = static_cast<uint64_t>(clock64());
    for (int i = 0; i < p.rounds; ++i) __syncthreads();
    if (threadIdx.x == 0) arch::st_global(p.out, static_cast<uint64_t>(clock64()) - t0);
    __syncthreads();
    t0 = static_cast<uint64_t>(clock64());
    for (int i = 0; i < p.rounds; ++i) {
      arch::mbarrier_arrive(&s.bar);
      while (!arch::mbarrier_try_wait_parity(&s.bar, static_cast<uint32_t>(i) & 1u)) {
      }
    }
    if (threadIdx.x == 0) arch::st_global(p.out + 1, static_cast<uint64_t>(clock64()) - t0);
  }
};

// A dependent chain of `rounds` shuffles by one warp (each lane takes its neighbour's
// value): the latency of a warp collective, what the routing loops of dispatch's
// SendStore pay per slot. Lane 0 writes the SM cycles to out[0] and the value to out[1]
// (so the chain is not optimised away).
struct ShuffleChain : KernelBase<32> {
  static constexpr const char* kName = "calibration::ShuffleChain";
  struct SharedStorage {};
  struct Params {
    int rounds;
    uint64_t* out;
  };
  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }
  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage&) const {
    const int next = static_cast<int>((threadIdx.x + 1) % 32);
    uint32_t x = threadIdx.x;
    const auto t0 = static_cast<uint64_t>(clock64());
    for (int i = 0; i < p.rounds; ++i) x = __shfl_sync(0xffffffffu, x, next);
    const auto t1 = static_cast<uint64_t>(clock64());
    if (threadIdx.x == 0) {
      arch::st_global(p.out, t1 - t0);
      arch::st_global(p.out + 1, static_cast<uint64_t>(x));
    }
  }
};

}  // namespace railyard::calibration
