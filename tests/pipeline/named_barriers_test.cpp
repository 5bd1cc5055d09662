// pipeline/named_barriers.cuh: ids are distinct, 0 stays __syncthreads', and all
// fit the 16 hardware barriers. (Their behaviour is in tests/arch/barrier_test.cpp.)
#include "railyard/pipeline/named_barriers.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>

namespace railyard {
namespace {

using pipeline::NamedBarrier;

TEST(NamedBarriers, IdsAreDistinctAndFitTheHardware) {
  const NamedBarrier all[] = {NamedBarrier::G2sWarps, NamedBarrier::S2gWarps, NamedBarrier::RdmaWarps,
                              NamedBarrier::ReduceWarps};
  std::set<uint32_t> ids;
  for (NamedBarrier id : all) {
    const auto raw = static_cast<uint32_t>(id);
    EXPECT_NE(raw, 0u) << "id 0 belongs to __syncthreads";
    EXPECT_LT(raw, pipeline::kNumHardwareBarriers);
    EXPECT_TRUE(ids.insert(raw).second) << "duplicate id " << raw;
  }
  EXPECT_EQ(static_cast<uint32_t>(NamedBarrier::SyncThreads), 0u);
}

}  // namespace
}  // namespace railyard
