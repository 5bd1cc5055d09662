// kernels/common/launch.hpp in the simulator, and the railyard::Status it returns:
//  - check_all_blocks_resident refuses block counts outside 1..SM count and shared
//    memory beyond the device's opt-in limit, naming the value and the limit;
//  - launch<Kernel> refuses less shared memory than the kernel type needs, and turns
//    a launch the simulator refuses (more shared memory than the device allows, a
//    zero grid) into LaunchFailed carrying the simulator's reason;
//  - Status: every code's name, the factories, to_string().
// Status is host code, tested here because the launchers are what produce it and
// only the simulator tests are measured for coverage.
#include "kernels/common/launch.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/examples/row_gather.cuh"
#include "tests/arch/sim_harness.hpp"

namespace railyard {
namespace {

// Any kernel type will do; this one needs a few KiB of shared memory.
using Kernel = examples::RowGather<2, 1024>;

constexpr int kSmCount = 4;
constexpr std::size_t kSmemOptin = 2048;  // less than Kernel needs
static_assert(Kernel::shared_memory_bytes() > kSmemOptin);

// A fresh simulator with one small device: kSmCount SMs, kSmemOptin bytes a block.
sim::Stream small_device() {
  sim::reset({.seed = 1});
  sim::DeviceProps props = sim::h100_props();
  props.sm_count = kSmCount;
  props.smem_per_block_optin_bytes = kSmemOptin;
  return sim::default_stream(sim::add_device(props));
}

// The status `st` has `code` and its message is `message` exactly ("" for Ok).
void expect_status(const Status& st, StatusCode code, const std::string& message) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_EQ(st.message(), message);
}

TEST(Status, EveryCodeHasItsName) {
  struct Row {
    StatusCode code;
    const char* name;
  };
  const std::vector<Row> rows = {{StatusCode::Ok, "Ok"},
                                 {StatusCode::InvalidArgument, "InvalidArgument"},
                                 {StatusCode::Unsupported, "Unsupported"},
                                 {StatusCode::LaunchFailed, "LaunchFailed"},
                                 {StatusCode::Timeout, "Timeout"},
                                 {static_cast<StatusCode>(99), "?"}};
  for (const Row& row : rows) EXPECT_STREQ(to_string(row.code), row.name);
}

TEST(Status, FactoriesAndToString) {
  struct Row {
    Status status;
    StatusCode code;
    std::string text;  // to_string()
  };
  const std::vector<Row> rows = {
      {Status(), StatusCode::Ok, "Ok"},
      {Status::success(), StatusCode::Ok, "Ok"},
      {Status::invalid_argument("bad x"), StatusCode::InvalidArgument, "InvalidArgument: bad x"},
      {Status::unsupported("no y"), StatusCode::Unsupported, "Unsupported: no y"},
      {Status::launch_failed("refused"), StatusCode::LaunchFailed, "LaunchFailed: refused"},
      {Status(StatusCode::Timeout, "peer 3"), StatusCode::Timeout, "Timeout: peer 3"},
  };
  for (const Row& row : rows) {
    EXPECT_EQ(row.status.code(), row.code) << row.text;
    EXPECT_EQ(row.status.ok(), row.code == StatusCode::Ok) << row.text;
    EXPECT_EQ(row.status.to_string(), row.text);
  }
}

TEST(KernelLaunch, AllBlocksResidentNeedsBlocksWithinTheSmCountAndSmemWithinTheOptinLimit) {
  const sim::Stream stream = small_device();
  struct Row {
    int num_blocks;
    std::size_t smem_bytes;
    StatusCode code;
    std::string message;
  };
  const std::string blocks_expected = "; expected 1..4 (the device's SM count)";
  const std::vector<Row> rows = {
      {1, 0, StatusCode::Ok, ""},
      {kSmCount, kSmemOptin, StatusCode::Ok, ""},
      {0, 16, StatusCode::InvalidArgument, "k: num_blocks is 0" + blocks_expected},
      {-3, 16, StatusCode::InvalidArgument, "k: num_blocks is -3" + blocks_expected},
      {kSmCount + 1, 16, StatusCode::InvalidArgument, "k: num_blocks is 5" + blocks_expected},
      {1, kSmemOptin + 1, StatusCode::Unsupported,
       "k: needs 2049 bytes of shared memory per block; the device allows 2048"},
      {kSmCount, Kernel::shared_memory_bytes(), StatusCode::Unsupported,
       "k: needs " + std::to_string(Kernel::shared_memory_bytes()) +
           " bytes of shared memory per block; the device allows 2048"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE("num_blocks " + std::to_string(row.num_blocks) + " smem " + std::to_string(row.smem_bytes));
    expect_status(kernels::check_all_blocks_resident("k", row.num_blocks, row.smem_bytes, stream), row.code,
                  row.message);
  }
}

TEST(KernelLaunch, RefusesLessSharedMemoryThanTheKernelNeedsOrALaunchTheDeviceRefuses) {
  const sim::Stream stream = small_device();
  const Kernel::Params params = Kernel::to_params(examples::RowGatherArguments{}, 1);
  const std::size_t needs = Kernel::shared_memory_bytes();
  const std::string sim_refuses = "RowGather: railyard::sim::launch('RowGather'): ";
  struct Row {
    unsigned grid;
    std::size_t smem_bytes;
    StatusCode code;
    std::string message;
  };
  const std::vector<Row> rows = {
      {1, needs - 1, StatusCode::InvalidArgument,
       "RowGather: launch with " + std::to_string(needs - 1) + " bytes of shared memory, needs " +
           std::to_string(needs)},
      {1, 0, StatusCode::InvalidArgument,
       "RowGather: launch with 0 bytes of shared memory, needs " + std::to_string(needs)},
      // Enough for the kernel, more than the device allows: the simulator refuses.
      {1, needs, StatusCode::LaunchFailed,
       sim_refuses + "dynamic shared memory of " + std::to_string(needs) +
           " bytes exceeds the device's 2048 bytes per block"},
      {0, needs, StatusCode::LaunchFailed,
       sim_refuses + "grid (0,1,1) has a zero dimension; expected every dimension >= 1"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE("grid " + std::to_string(row.grid) + " smem " + std::to_string(row.smem_bytes));
    expect_status(kernels::launch<Kernel>(params, dim3(row.grid), dim3(Kernel::kMaxThreadsPerBlock), row.smem_bytes,
                                          stream),
                  row.code, row.message);
  }
  sim::stream_synchronize(stream);  // nothing was enqueued, nothing faulted
}

}  // namespace
}  // namespace railyard
