// NcclGinSetup linked against the NCCL library Railyard found (CUDA flavour): the
// library's version is checked against the headers' before anything else, and a
// buffer NCCL cannot take as a window is refused by name. Runs without a GPU: neither
// step reaches a device.
#include "railyard/runtime/nccl_gin_setup.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace railyard::runtime::gin {
namespace {

TEST(NcclGinSetup, ChecksTheLibraryThenRefusesAMisalignedWindow) {
  int runtime = 0;
  ASSERT_EQ(ncclGetVersion(&runtime), ncclSuccess);
  const std::string problem = version_problem(NCCL_VERSION_CODE, runtime);
  try {
    NcclGinSetup setup(nullptr, reinterpret_cast<void*>(uintptr_t{0x1001}), 4096, {});
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(problem, "") << "the library passed the version check";
    EXPECT_NE(std::string(e.what()).find("the buffer must be 4096-byte aligned"), std::string::npos) << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(problem, "") << e.what();
    EXPECT_NE(std::string(e.what()).find(problem), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace railyard::runtime::gin
