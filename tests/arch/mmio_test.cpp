// arch/mmio.cuh: the doorbell store.
//  - it writes its 8 bytes in order, and counts them as traffic;
//  - in weak memory mode, ringing a registered doorbell while the thread's earlier
//    write is not released to the system is reported, and a fence.acq_rel.sys before
//    the ring silences it (the rule a NIC's doorbell needs).
#include "railyard/arch/mmio.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "railyard/arch/memory.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

using test::DeviceArray;
using test::run_kernel;

TEST(Mmio, DoorbellStoreWritesItsEightBytesInOrder) {
  test::reset_sim(1);
  DeviceArray<uint64_t> uar(0, 1, "uar");
  uar.fill(0);
  uint64_t* u = uar.ptr;
  sim::reset_traffic();
  run_kernel(1, 1, 0, [=] { arch::st_mmio_relaxed_sys(u, uint64_t{0x0807060504030201}); });
  const auto* bytes = reinterpret_cast<const uint8_t*>(uar.ptr);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(bytes[i], i + 1);
  EXPECT_EQ(sim::traffic().written(0, 0), 8u);
}

void ring(uint64_t seed, bool fenced) {
  unsetenv("RAILYARD_SIM_MEMORY_MODEL");  // the test chooses the weak mode itself
  sim::reset({.seed = seed, .memory_model = sim::MemoryModel::Weak});
  sim::add_device(sim::h100_props());
  DeviceArray<uint64_t> wqe(0, 2, "wqe"), uar(0, 1, "uar");
  sim::register_doorbell(uar.ptr, sizeof(uint64_t));
  uint64_t *w = wqe.ptr, *u = uar.ptr;
  run_kernel(1, 1, 0, [=] {
    arch::st_global(w, uint64_t{42});
    if (fenced) arch::fence_acq_rel_sys();
    arch::st_mmio_relaxed_sys(u, uint64_t{1});
  });
  sim::unregister_doorbell(uar.ptr);
}

TEST(Mmio, WeakModeReportsADoorbellRungBeforeTheRelease) {
  for (uint64_t seed : test::seeds(3)) {
    const std::string report = test::expect_sim_error(sim::ErrorKind::DataRace, [&] { ring(seed, false); });
    EXPECT_NE(report.find("st.mmio.relaxed.sys.global.b64"), std::string::npos) << report;
    EXPECT_NO_THROW(ring(seed, true)) << "seed " << seed;
  }
}

}  // namespace
}  // namespace railyard
