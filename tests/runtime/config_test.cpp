// runtime/config: BufferConfig::validate names each bad field and what it expected.
// (Agreement across ranks is in bootstrap_sim_test.cpp, where the ranks are.)
#include "railyard/runtime/config.hpp"

#include <gtest/gtest.h>

#include "railyard/reference/reference.hpp"

namespace railyard::runtime {
namespace {

static_assert(kFp8ScaleBlockElems == reference::kFp8ScaleBlockElems,
              "the runtime validates against the scale block the semantics define");

// The seed configuration: hidden 8192, BF16, 4096 tokens per rank, 2 experts per
// rank, top-k 8, one node of 8 GPUs.
BufferConfig seed_config() {
  return BufferConfig{.hidden = 8192,
                      .max_tokens_per_rank = 4096,
                      .num_ranks = 8,
                      .num_experts = 16,
                      .experts_per_rank = 2,
                      .ranks_per_domain = 8,
                      .dispatch_dtype = DType::BF16,
                      .combine_dtype = DType::BF16,
                      .max_top_k = 8};
}

std::string problems(const BufferConfig& config) {
  const Status status = config.validate();
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::InvalidArgument);
  return status.message();
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(BufferConfig, SeedAndDeepEpConfigurationsAreValid) {
  EXPECT_TRUE(seed_config().validate().ok()) << seed_config().validate().message();
  BufferConfig deepep = seed_config();  // hidden 7168, FP8 dispatch, 256 experts on 32 ranks in 4 nodes
  deepep.hidden = 7168;
  deepep.dispatch_dtype = DType::FP8_E4M3;
  deepep.num_ranks = 32;
  deepep.num_experts = 256;
  deepep.experts_per_rank = 8;
  EXPECT_TRUE(deepep.validate().ok()) << deepep.validate().message();
}

TEST(BufferConfig, HiddenMustMakeRowsMultiplesOf16Bytes) {
  BufferConfig c = seed_config();
  c.hidden = 7004;  // 14008 bytes of BF16
  const std::string text = problems(c);
  EXPECT_HAS(text, "hidden = 7004: a BF16 row is 14008 bytes, not a multiple of 16; expected hidden a multiple of 8");
  c.hidden = 0;
  EXPECT_HAS(problems(c), "hidden = 0; expected > 0");
}

TEST(BufferConfig, Fp8DispatchNeedsWholeScaleBlocks) {
  BufferConfig c = seed_config();
  c.dispatch_dtype = DType::FP8_E4M3;
  c.hidden = 7184;  // a 16-byte multiple in FP8 and BF16, but not 128 elements
  const std::string text = problems(c);
  EXPECT_HAS(text, "hidden = 7184 with FP8_E4M3 dispatch");
  EXPECT_HAS(text, "expected hidden a multiple of 128");
}

TEST(BufferConfig, ExpertsMustDivideAmongRanks) {
  BufferConfig c = seed_config();
  c.num_experts = 20;
  EXPECT_HAS(problems(c), "num_experts = 20 is not divisible by num_ranks = 8; expected a multiple of 8");
  c = seed_config();
  c.experts_per_rank = 4;
  EXPECT_HAS(problems(c), "experts_per_rank = 4; expected num_experts / num_ranks = 2");
}

TEST(BufferConfig, RanksMustFillNvlinkDomains) {
  BufferConfig c = seed_config();
  c.num_ranks = 12;
  c.num_experts = 24;
  c.experts_per_rank = 2;
  EXPECT_HAS(problems(c), "num_ranks = 12 is not a multiple of ranks_per_domain = 8");
}

TEST(BufferConfig, DtypesTopKAndLayoutVersion) {
  BufferConfig c = seed_config();
  c.combine_dtype = DType::FP8_E4M3;
  EXPECT_HAS(problems(c), "combine_dtype = FP8_E4M3; expected BF16");
  c = seed_config();
  c.dispatch_dtype = DType::FP32;
  EXPECT_HAS(problems(c), "dispatch_dtype = FP32; expected BF16 or FP8_E4M3");
  c = seed_config();
  c.max_top_k = 17;
  EXPECT_HAS(problems(c), "max_top_k = 17; expected 1..16 (num_experts)");
  c = seed_config();
  c.layout_version = kBufferLayoutVersion + 1;
  EXPECT_HAS(problems(c), "layout_version = " + std::to_string(kBufferLayoutVersion + 1) + "; expected " +
                              std::to_string(kBufferLayoutVersion));
}

TEST(BufferConfig, EveryProblemIsReportedAtOnce) {
  BufferConfig c = seed_config();
  c.hidden = 100;
  c.max_tokens_per_rank = -1;
  c.max_top_k = 0;
  const std::string text = problems(c);
  EXPECT_HAS(text, "hidden = 100");
  EXPECT_HAS(text, "max_tokens_per_rank = -1; expected > 0");
  EXPECT_HAS(text, "max_top_k = 0");
}

TEST(BufferConfig, FieldListCoversEveryField) {
  // check_agreement compares exactly these; a field added to the struct must be added here.
  const auto fields = config_fields(seed_config());
  ASSERT_EQ(fields.size(), 10u);
  EXPECT_STREQ(fields.front().name, "hidden");
  EXPECT_STREQ(fields.back().name, "layout_version");
  static_assert(sizeof(BufferConfig) == 8 * sizeof(int64_t) + 2 * sizeof(DType),
                "BufferConfig changed: update config_fields() and this count");
}

}  // namespace
}  // namespace railyard::runtime
