// runtime/rdma (label sim): what a machine without a ConnectX NIC can check of the
// rdma-core implementation (the rest needs hardware; docs/design-internode.md): opening
// a NIC that does not exist is an RdmaError naming it and listing the NICs there are,
// not a crash or a hang. The device API's NIC hooks say in the simulator why they do
// not exist there.
#include "railyard/runtime/rdma.hpp"

#include <gtest/gtest.h>

#include "railyard/runtime/device_api.hpp"

namespace railyard::runtime::rdma {
namespace {

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(RdmaMlx5, OpeningANicThatDoesNotExistNamesItAndWhatExists) {
  try {
    open_mlx5("railyard_no_such_nic");
    ADD_FAILURE() << "opened a NIC that does not exist";
  } catch (const RdmaError& e) {
    EXPECT_HAS(e.what(), "railyard_no_such_nic");
    const std::string message = e.what();
    EXPECT_TRUE(message.find("; found ") != std::string::npos || message.find("ibv_get_device_list failed") !=
                                                                      std::string::npos)
        << message;
  }
}

TEST(RdmaMlx5, SimulatorDeviceApiHasNoDmabufOrIoMemory) {
  int dummy = 0;
  try {
    gpu::export_dmabuf(&dummy, sizeof dummy);
    ADD_FAILURE() << "expected DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_HAS(e.what(), "registers memory by pointer");
  }
  try {
    gpu::map_io_memory(&dummy, sizeof dummy);
    ADD_FAILURE() << "expected DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_HAS(e.what(), "simulated allocations");
  }
}

}  // namespace
}  // namespace railyard::runtime::rdma
