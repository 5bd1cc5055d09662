// arch/thread.cuh (lane, warp, elect) and the warp collectives of cuda_compat.hpp
// (shuffles with widths, ballot/any/all), checked against expectations computed
// here from the CUDA programming guide's definitions.
#include "railyard/arch/thread.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "railyard/arch/memory.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using test::DeviceArray;
using test::reset_sim;
using test::run_kernel;

TEST(Thread, LaneAndWarpFollowLinearThreadIndex) {
  // A 2-D block whose rows (48 threads) straddle warps: warps pack the linear index.
  const sim::Dim3 block(48, 3);
  const unsigned n = block.count();
  for (uint64_t seed : test::seeds(4)) {
    reset_sim(seed);
    DeviceArray<uint32_t> lane(0, n, "lane"), warp(0, n, "warp");
    uint32_t* lane_out = lane.ptr;
    uint32_t* warp_out = warp.ptr;
    run_kernel(1, block, 0, [=] {
      const unsigned linear = threadIdx.x + threadIdx.y * 48;
      arch::st_global(lane_out + linear, arch::lane_idx());
      arch::st_global(warp_out + linear, arch::warp_idx());
    });
    for (unsigned y = 0; y < 3; ++y) {
      for (unsigned x = 0; x < 48; ++x) {
        const unsigned linear = y * 48 + x;
        EXPECT_EQ(lane[linear], linear % 32) << "x " << x << " y " << y;
        EXPECT_EQ(warp[linear], linear / 32) << "x " << x << " y " << y;
      }
    }
  }
}

TEST(Thread, ElectOneSyncElectsExactlyTheLowestLaneOfTheMask) {
  struct Case {
    uint32_t mask;
    uint32_t expected_lane;
  };
  const std::vector<Case> cases = {{0xffffffffu, 0}, {0xf0f0f0f0u, 4}, {0x80000000u, 31}, {0x00010100u, 8}};
  for (uint64_t seed : test::seeds(4)) {
    for (const Case& c : cases) {
      reset_sim(seed);
      DeviceArray<uint32_t> elected(0, 64, "elected");
      elected.fill(0);
      uint32_t* out = elected.ptr;
      const uint32_t mask = c.mask;
      run_kernel(1, 64, 0, [=] {
        if ((mask >> arch::lane_idx()) & 1u) {
          const bool me = arch::elect_one_sync(mask);
          arch::st_global(out + threadIdx.x, me ? 1u : 0u);
        }
      });
      for (unsigned t = 0; t < 64; ++t) {
        EXPECT_EQ(elected[t], t % 32 == c.expected_lane ? 1u : 0u)
            << "seed " << seed << " mask " << std::hex << c.mask << std::dec << " thread " << t;
      }
    }
  }
}

// Source lane of a shuffle by CUDA's rules: lanes form segments of `width`; idx
// wraps within the segment; up/down fall back to the caller's own lane when the
// source leaves the segment; xor may reach into an EARLIER segment but falls back
// when it would reach a later one (programming guide, and PTX shfl.bfly's
// j <= maxLane test).
enum class Shfl { Idx, Up, Down, Xor };
unsigned expected_source(Shfl kind, unsigned lane, int arg, unsigned width) {
  const unsigned segment = lane / width * width;
  switch (kind) {
    case Shfl::Idx: return segment + static_cast<unsigned>(arg) % width;
    case Shfl::Up: return lane - segment >= static_cast<unsigned>(arg) ? lane - arg : lane;
    case Shfl::Down: return lane - segment + arg < width ? lane + arg : lane;
    case Shfl::Xor: {
      const unsigned src = lane ^ static_cast<unsigned>(arg);
      return src < segment + width ? src : lane;
    }
  }
  return lane;
}

TEST(WarpCollectives, ShufflesWithWidths) {
  struct Case {
    Shfl kind;
    int arg;
    unsigned width;
  };
  const std::vector<Case> cases = {
      {Shfl::Idx, 3, 32}, {Shfl::Idx, 5, 8},  {Shfl::Idx, 9, 4},  {Shfl::Up, 1, 32}, {Shfl::Up, 3, 16},
      {Shfl::Down, 2, 8}, {Shfl::Down, 7, 32}, {Shfl::Xor, 5, 32}, {Shfl::Xor, 1, 2}, {Shfl::Xor, 16, 16}, {Shfl::Xor, 12, 8},
  };
  for (uint64_t seed : test::seeds(3)) {
    for (const Case& c : cases) {
      reset_sim(seed);
      DeviceArray<uint64_t> got(0, 64, "got");
      uint64_t* out = got.ptr;
      const Case k = c;
      run_kernel(1, 64, 0, [=] {
        // 64-bit values: shuffles move any type up to 8 bytes.
        const uint64_t mine = (uint64_t{threadIdx.x} << 40) | (0xabcull + threadIdx.x);
        uint64_t v = 0;
        switch (k.kind) {
          case Shfl::Idx: v = __shfl_sync(0xffffffffu, mine, k.arg, k.width); break;
          case Shfl::Up: v = __shfl_up_sync(0xffffffffu, mine, k.arg, k.width); break;
          case Shfl::Down: v = __shfl_down_sync(0xffffffffu, mine, k.arg, k.width); break;
          case Shfl::Xor: v = __shfl_xor_sync(0xffffffffu, mine, k.arg, k.width); break;
        }
        arch::st_global(out + threadIdx.x, v);
      });
      for (unsigned t = 0; t < 64; ++t) {
        const unsigned src = t / 32 * 32 + expected_source(c.kind, t % 32, c.arg, c.width);
        EXPECT_EQ(got[t], (uint64_t{src} << 40) | (0xabcull + src))
            << "kind " << static_cast<int>(c.kind) << " arg " << c.arg << " width " << c.width << " lane " << t;
      }
    }
  }
}

TEST(WarpCollectives, BallotAnyAll) {
  for (uint64_t seed : test::seeds(4)) {
    reset_sim(seed);
    DeviceArray<uint32_t> got(0, 64 * 5, "got");
    uint32_t* out = got.ptr;
    run_kernel(1, 64, 0, [=] {
      const unsigned lane = arch::lane_idx();
      const unsigned warp = arch::warp_idx();
      uint32_t* mine = out + threadIdx.x * 5;
      arch::st_global(mine + 0, __ballot_sync(0xffffffffu, lane % 3 == warp));
      arch::st_global(mine + 1, static_cast<uint32_t>(__any_sync(0xffffffffu, lane == 17 + warp)));
      arch::st_global(mine + 2, static_cast<uint32_t>(__all_sync(0xffffffffu, lane < 31)));
      arch::st_global(mine + 3, static_cast<uint32_t>(__all_sync(0xffffffffu, lane < 32)));
      // Only the lower half-warp takes part: lanes outside the mask do not count.
      if (lane < 16) arch::st_global(mine + 4, __ballot_sync(0x0000ffffu, 1));
    });
    for (unsigned t = 0; t < 64; ++t) {
      const unsigned warp = t / 32;
      uint32_t ballot = 0;
      for (unsigned l = 0; l < 32; ++l)
        if (l % 3 == warp) ballot |= 1u << l;
      EXPECT_EQ(got[t * 5 + 0], ballot) << "thread " << t;
      EXPECT_EQ(got[t * 5 + 1], 1u) << "thread " << t;
      EXPECT_EQ(got[t * 5 + 2], 0u) << "thread " << t;
      EXPECT_EQ(got[t * 5 + 3], 1u) << "thread " << t;
      if (t % 32 < 16) {
        EXPECT_EQ(got[t * 5 + 4], 0x0000ffffu) << "thread " << t;
      }
    }
  }
}

}  // namespace
}  // namespace railyard
