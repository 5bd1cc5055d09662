// Which NCCL libraries can serve kernels compiled against which NCCL headers
// (runtime/nccl_gin.hpp): GIN from 2.28.7; before 2.31 the library's version must be
// the headers'; from 2.31 any later library.
#include "railyard/runtime/nccl_gin.hpp"

#include <gtest/gtest.h>

namespace railyard::runtime::gin {
namespace {

TEST(NcclGinVersion, NamesVersionsAsNcclDoes) {
  EXPECT_EQ(version_name(22809), "2.28.9");
  EXPECT_EQ(version_name(23100), "2.31.0");
  EXPECT_EQ(version_name(22807), "2.28.7");
}

TEST(NcclGinVersion, BeforeTheStableDeviceAbiOnlyTheSameLibraryServes) {
  EXPECT_EQ(version_problem(22809, 22809), "");
  EXPECT_EQ(version_problem(22809, 23007),
            "Railyard was built against NCCL 2.28.9 but runs with NCCL 2.30.7; before NCCL 2.31.0 the device API "
            "needs the library of the headers Railyard was built with: run with NCCL 2.28.9, or rebuild Railyard "
            "against 2.30.7");
  EXPECT_EQ(version_problem(22809, 22807),
            "Railyard was built against NCCL 2.28.9 but runs with NCCL 2.28.7; the library must be 2.28.9");
}

TEST(NcclGinVersion, FromTheStableDeviceAbiLaterLibrariesServe) {
  EXPECT_EQ(version_problem(23100, 23100), "");
  EXPECT_EQ(version_problem(23100, 23204), "");
  EXPECT_EQ(version_problem(23100, 22809),
            "Railyard was built against NCCL 2.31.0 but runs with NCCL 2.28.9; the library must be 2.31.0 or later");
}

TEST(NcclGinVersion, HeadersWithoutGinAreRefused) {
  EXPECT_EQ(version_problem(22705, 22705),
            "Railyard was built against NCCL 2.27.5, which has no GIN (GPU-Initiated Networking); rebuild against "
            "NCCL 2.28.7 or later");
}

}  // namespace
}  // namespace railyard::runtime::gin
