// kernels/examples/row_gather.cuh through its launcher (src/kernels/row_gather.cu):
// the simulator's result equals a plain host gather bit for bit, for several row
// sizes (pieces per row from 1 to 3), row counts, block counts, stage counts and
// seeds; exactly the needed bytes move; bad arguments are refused or trapped.
#include "kernels/examples/row_gather.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/launch.hpp"
#include "kernels/examples/row_gather.cuh"
#include "tests/arch/sim_harness.hpp"
#include "tests/kernels/refusals.hpp"

namespace railyard {
namespace {

using examples::RowGatherArguments;
using test::DeviceArray;
using test::reset_sim;

struct Case {
  uint32_t row_bytes;
  int64_t num_src_rows;
  int64_t num_rows;
  int num_blocks;
};

// Fills src with seeded random bytes and index with random rows (repeats allowed),
// runs `launch`, and compares dst with the host gather. Also checks the traffic.
template <class Launch>
void check_gather(uint64_t seed, const Case& c, Launch&& launch) {
  reset_sim(seed);
  std::mt19937_64 rng(seed * 31 + c.row_bytes);
  const std::size_t src_bytes = static_cast<std::size_t>(c.num_src_rows) * c.row_bytes;
  const std::size_t dst_bytes = static_cast<std::size_t>(c.num_rows) * c.row_bytes;
  DeviceArray<uint8_t> src(0, src_bytes, "gather_src");
  DeviceArray<int32_t> index(0, static_cast<std::size_t>(c.num_rows) + 1, "gather_index");
  DeviceArray<uint8_t> dst(0, dst_bytes + 16, "gather_dst");
  for (std::size_t i = 0; i < src_bytes; ++i) src[i] = static_cast<uint8_t>(rng());
  for (int64_t r = 0; r < c.num_rows; ++r) index[r] = static_cast<int32_t>(rng() % c.num_src_rows);
  std::memset(dst.ptr, 0x5a, dst.bytes());

  std::vector<uint8_t> expected(dst_bytes + 16, 0x5a);
  for (int64_t r = 0; r < c.num_rows; ++r)
    std::memcpy(expected.data() + r * c.row_bytes, src.ptr + static_cast<std::size_t>(index[r]) * c.row_bytes,
                c.row_bytes);

  RowGatherArguments args;
  args.src = src.ptr;
  args.num_src_rows = c.num_src_rows;
  args.index = index.ptr;
  args.dst = dst.ptr;
  args.num_rows = c.num_rows;
  args.row_bytes = c.row_bytes;
  sim::reset_traffic();
  const Status status = launch(args);
  ASSERT_TRUE(status.ok()) << status.to_string();
  sim::stream_synchronize(sim::default_stream(0));

  const std::string where = "seed " + std::to_string(seed) + " row_bytes " + std::to_string(c.row_bytes) +
                            " rows " + std::to_string(c.num_rows) + " blocks " + std::to_string(c.num_blocks);
  ASSERT_EQ(std::memcmp(dst.ptr, expected.data(), expected.size()), 0) << where;
  const sim::Traffic traffic = sim::traffic();
  EXPECT_EQ(traffic.read(0, 0), dst_bytes + static_cast<uint64_t>(c.num_rows) * sizeof(int32_t)) << where;
  EXPECT_EQ(traffic.written(0, 0), dst_bytes) << where;
}

const std::vector<Case> kCases = {
    {16, 5, 1, 1},       // the smallest row
    {272, 50, 37, 3},    // rows much smaller than a slot, uneven chunks
    {8192, 9, 11, 4},    // exactly one slot per row
    {20000, 7, 6, 2},    // three pieces per row, the last one short
    {4096, 64, 130, 8},  // more blocks than SMs would need, chunks of 17 rows
    {1024, 3, 5, 16},    // more blocks than rows: some blocks get nothing
};

TEST(RowGather, EqualsTheHostGatherForEveryCompiledStageCount) {
  for (int stages : examples::kRowGatherStageOptions) {
    for (uint64_t seed : test::seeds(3)) {
      for (const Case& c : kCases) {
        check_gather(seed, c, [&](const RowGatherArguments& args) {
          return examples::launch_row_gather(args, c.num_blocks, stages, sim::default_stream(0));
        });
      }
    }
  }
}

TEST(RowGather, SmallSlotsAndAnOddStageCountSplitRowsIntoManyPieces) {
  // Instantiated here rather than in the launcher: 3 stages of 256-byte slots, so a
  // 2000-byte row travels in 8 pieces and the ring wraps mid-row.
  using Kernel = examples::RowGather<3, 256>;
  for (uint64_t seed : test::seeds(6)) {
    for (const Case& c : {Case{2000, 10, 9, 2}, Case{256, 4, 20, 3}, Case{48, 100, 64, 1}}) {
      check_gather(seed, c, [&](const RowGatherArguments& args) {
        EXPECT_TRUE(Kernel::can_implement(args).ok());
        return kernels::launch<Kernel>(Kernel::to_params(args, c.num_blocks), dim3(c.num_blocks),
                                       dim3(Kernel::kMaxThreadsPerBlock), Kernel::shared_memory_bytes(),
                                       sim::default_stream(0));
      });
    }
  }
}

// The launcher's arguments: the gather's and the launch's.
struct GatherCall {
  RowGatherArguments args;
  int num_blocks = 1;
  int num_stages = 2;
};

TEST(RowGather, RefusesArgumentsItCannotHandle) {
  reset_sim(1);
  DeviceArray<uint8_t> buf(0, 4096, "buf");
  DeviceArray<int32_t> index(0, 4, "index");
  GatherCall base;
  base.args = RowGatherArguments{buf.ptr, 4, index.ptr, buf.ptr + 2048, 4, 32};
  using Kernel = examples::RowGather<2, examples::kRowGatherSlotBytes>;
  ASSERT_TRUE(Kernel::can_implement(base.args).ok());
  using R = test::Refusal<GatherCall>;
  const StatusCode bad = StatusCode::InvalidArgument;
  const std::string negative = "RowGather: negative row count";
  const std::string null = "RowGather: null src, index or dst";
  const std::string tma = "RowGather: src and dst must be 16-byte aligned (TMA)";
  const std::vector<R> rows = {
      {"24-byte rows", [](auto& c) { c.args.row_bytes = 24; }, bad,
       "RowGather: row_bytes 24 is not a positive multiple of 16"},
      {"empty rows", [](auto& c) { c.args.row_bytes = 0; }, bad,
       "RowGather: row_bytes 0 is not a positive multiple of 16"},
      {"negative num_rows", [](auto& c) { c.args.num_rows = -1; }, bad, negative},
      {"negative num_src_rows", [](auto& c) { c.args.num_src_rows = -1; }, bad, negative},
      {"no src", [](auto& c) { c.args.src = nullptr; }, bad, null},
      {"no index", [](auto& c) { c.args.index = nullptr; }, bad, null},
      {"no dst", [](auto& c) { c.args.dst = nullptr; }, bad, null},
      {"misaligned src", [](auto& c) { c.args.src = test::shift_bytes(c.args.src, 8); }, bad, tma},
      {"misaligned dst", [](auto& c) { c.args.dst = test::shift_bytes(c.args.dst, 8); }, bad, tma},
      {"misaligned index", [](auto& c) { c.args.index = test::shift_bytes(c.args.index, 2); }, bad,
       "RowGather: index must be 4-byte aligned"},
      {"no blocks", [](auto& c) { c.num_blocks = 0; }, bad, "RowGather: num_blocks 0 must be positive"},
      {"3 stages", [](auto& c) { c.num_stages = 3; }, StatusCode::Unsupported,
       "RowGather: num_stages 3 is not compiled (choose 1, 2 or 4)"},
      // Nothing to gather: null pointers and any stage count are fine, nothing is launched.
      {"no rows", [](auto& c) { c = GatherCall{RowGatherArguments{nullptr, 0, nullptr, nullptr, 0, 32}, 1, 3}; },
       StatusCode::Ok, ""},
  };
  const sim::Stream stream = sim::default_stream(0);
  test::expect_refusals(base, rows, [&](const GatherCall& c) {
    return examples::launch_row_gather(c.args, c.num_blocks, c.num_stages, stream);
  });
  sim::stream_synchronize(stream);
}

TEST(RowGather, IndexOutOfRangeTraps) {
  reset_sim(1);
  DeviceArray<uint8_t> src(0, 4 * 64, "src"), dst(0, 4 * 64, "dst");
  DeviceArray<int32_t> index(0, 4, "index");
  for (int i = 0; i < 4; ++i) index[i] = i;
  index[2] = 4;  // one past the last source row
  RowGatherArguments args{src.ptr, 4, index.ptr, dst.ptr, 4, 64};
  const std::string report = test::expect_sim_error(sim::ErrorKind::Trap, [&] {
    ASSERT_TRUE(examples::launch_row_gather(args, 1, 2, sim::default_stream(0)).ok());
    sim::stream_synchronize(sim::default_stream(0));
  });
  EXPECT_NE(report.find("index out of"), std::string::npos) << report;
}

}  // namespace
}  // namespace railyard
