// runtime/nic_selection on a fake sysfs tree (label host): PCI distances counted by
// hand from the tree below, the nearest active NIC per GPU, ties spread by local GPU
// index, the user mapping and every error.
//
//   devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0   GPU 0 (under switch 01:00.0)
//                                              /0000:02:01.0   mlx5_0 (same switch)
//   devices/pci0000:00/0000:00:02.0/0000:03:00.0              GPU 1
//                                  /0000:04:00.0              mlx5_1, mlx5_2 (same bridge as GPU 1)
//   devices/pci0000:80/0000:80:01.0/0000:81:00.0              mlx5_3 (other root complex)
#include "railyard/runtime/nic_selection.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace railyard::runtime {
namespace {

namespace fs = std::filesystem;
#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

const std::string kGpu0 = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0";
const std::string kGpu1 = "pci0000:00/0000:00:02.0/0000:03:00.0";

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("railyard_sysfs_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    add_pci(kGpu0, "0000:02:00.0");
    add_pci(kGpu1, "0000:03:00.0");
    add_nic("mlx5_0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0", true);
    add_nic("mlx5_1", "pci0000:00/0000:00:02.0/0000:04:00.0", true);
    add_nic("mlx5_2", "pci0000:00/0000:00:02.0/0000:04:00.1", true);
    add_nic("mlx5_3", "pci0000:80/0000:80:01.0/0000:81:00.0", true);
  }
  void TearDown() override { fs::remove_all(root_); }

  void add_pci(const std::string& path, const std::string& bus_id) {
    fs::create_directories(root_ / "devices" / path);
    fs::create_directories(root_ / "bus/pci/devices");
    fs::create_symlink(root_ / "devices" / path, root_ / "bus/pci/devices" / bus_id);
  }
  void add_nic(const std::string& name, const std::string& path, bool active) {
    fs::create_directories(root_ / "devices" / path);
    const fs::path nic = root_ / "class/infiniband" / name;
    fs::create_directories(nic / "ports/1");
    fs::create_symlink(root_ / "devices" / path, nic / "device");
    std::ofstream(nic / "ports/1/state") << (active ? "4: ACTIVE\n" : "1: DOWN\n");
  }
  std::string sysfs() const { return root_.string(); }
  std::string pci(const std::string& path) const { return fs::canonical(root_ / "devices" / path).string(); }

  fs::path root_;
};

TEST_F(FakeSysfs, ListsNicsSortedWithTheirPciPathAndPortState) {
  add_nic("mlx5_10", "pci0000:80/0000:80:01.0/0000:81:00.1", false);
  const std::vector<RdmaNic> nics = list_rdma_nics(sysfs());
  ASSERT_EQ(nics.size(), 5u);
  EXPECT_EQ(nics[0].name, "mlx5_0");
  EXPECT_EQ(nics[0].pci_path, pci("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0"));
  EXPECT_TRUE(nics[0].port_active);
  EXPECT_EQ(nics[2].name, "mlx5_10");
  EXPECT_FALSE(nics[2].port_active);
  EXPECT_TRUE(list_rdma_nics((root_ / "nothing").string()).empty());
}

TEST_F(FakeSysfs, PciPathOfResolvesTheBusIdInAnyCase) {
  EXPECT_EQ(pci_path_of("0000:02:00.0", sysfs()), pci(kGpu0));
  EXPECT_EQ(pci_path_of("0000:03:00.0", sysfs()), pci(kGpu1));
  try {
    pci_path_of("0000:99:00.0", sysfs());
    ADD_FAILURE() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(e.what(), "bus/pci/devices/0000:99:00.0 does not resolve");
    EXPECT_HAS(e.what(), "GPU's PCI bus id 0000:99:00.0");
  }
}

TEST(PciDistance, CountsLinksToTheDeepestCommonAncestor) {
  const std::string base = "/sys/devices/";
  EXPECT_EQ(pci_distance(base + kGpu0, base + kGpu0), 0);
  // 02:00.0 and 02:01.0 under switch 01:00.0: one link each.
  EXPECT_EQ(pci_distance(base + kGpu0, base + "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0"), 2);
  // GPU 1 (03:00.0) and 04:00.0 under bridge 00:02.0.
  EXPECT_EQ(pci_distance(base + kGpu1, base + "pci0000:00/0000:00:02.0/0000:04:00.0"), 2);
  // GPU 0 and 04:00.0 meet at the root complex: 3 links up, 2 down.
  EXPECT_EQ(pci_distance(base + kGpu0, base + "pci0000:00/0000:00:02.0/0000:04:00.0"), 5);
  EXPECT_EQ(pci_distance(base + kGpu0, base + "pci0000:80/0000:80:01.0/0000:81:00.0"), kUnrelated);
  EXPECT_EQ(pci_distance(base + kGpu0, "/sys/devices/virtual/net/lo"), kUnrelated);
}

TEST_F(FakeSysfs, ChoosesTheNearestActiveNicAndSpreadsTies) {
  const std::vector<RdmaNic> nics = list_rdma_nics(sysfs());
  const NicChoice gpu0 = choose_nic(pci(kGpu0), 0, nics);
  EXPECT_EQ(gpu0.nic, "mlx5_0");
  EXPECT_EQ(gpu0.distance, 2);
  EXPECT_EQ(gpu0.why, "nearest on PCIe (distance 2)");
  // GPU 1 ties between mlx5_1 and mlx5_2: by local index.
  EXPECT_EQ(choose_nic(pci(kGpu1), 1, nics).nic, "mlx5_2");
  EXPECT_EQ(choose_nic(pci(kGpu1), 2, nics).nic, "mlx5_1");
  EXPECT_HAS(choose_nic(pci(kGpu1), 1, nics).why, "one of 2 tied");
}

TEST_F(FakeSysfs, SkipsNicsWhosePortsAreDownUnlessAllAre) {
  std::vector<RdmaNic> nics = list_rdma_nics(sysfs());
  nics[0].port_active = false;  // mlx5_0, nearest to GPU 0
  EXPECT_EQ(choose_nic(pci(kGpu0), 0, nics).nic, "mlx5_1") << "next nearest active (distance 5)";
  EXPECT_EQ(choose_nic(pci(kGpu0), 0, nics).distance, 5);
  for (RdmaNic& n : nics) n.port_active = false;
  const NicChoice none_active = choose_nic(pci(kGpu0), 0, nics);
  EXPECT_EQ(none_active.nic, "mlx5_0");
  EXPECT_HAS(none_active.why, "no port is ACTIVE");
}

TEST_F(FakeSysfs, AMappingOverridesAndIsChecked) {
  const std::vector<RdmaNic> nics = list_rdma_nics(sysfs());
  const std::vector<std::string> mapping{"mlx5_3", "mlx5_0"};
  const NicChoice c = choose_nic(pci(kGpu0), 0, nics, mapping);
  EXPECT_EQ(c.nic, "mlx5_3");
  EXPECT_EQ(c.distance, kUnrelated);
  EXPECT_HAS(c.why, "[0]");
  try {
    choose_nic(pci(kGpu0), 2, nics, mapping);
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_HAS(e.what(), "names 2 NICs; expected one per local GPU, at least 3");
  }
  try {
    choose_nic(pci(kGpu0), 0, nics, std::vector<std::string>{"mlx5_9"});
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_HAS(e.what(), "names 'mlx5_9' for local GPU 0; expected one of mlx5_0, mlx5_1, mlx5_2, mlx5_3");
  }
  try {
    choose_nic(pci(kGpu0), 0, {});
    ADD_FAILURE() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(e.what(), "no RDMA device found");
  }
}

TEST(NicMapping, ComesFromRailyardNics) {
  ::unsetenv("RAILYARD_NICS");
  EXPECT_FALSE(nic_mapping_from_env());
  ::setenv("RAILYARD_NICS", "", 1);
  EXPECT_FALSE(nic_mapping_from_env());
  ::setenv("RAILYARD_NICS", "mlx5_0,mlx5_3", 1);
  EXPECT_EQ(nic_mapping_from_env(), (std::vector<std::string>{"mlx5_0", "mlx5_3"}));
  ::unsetenv("RAILYARD_NICS");
}

TEST(NicAtomicOrder, ComesFromRailyardNicAtomicOrder) {
  ::unsetenv("RAILYARD_NIC_ATOMIC_ORDER");
  EXPECT_FALSE(atomic_order_from_env());
  ::setenv("RAILYARD_NIC_ATOMIC_ORDER", "big-endian", 1);
  EXPECT_EQ(atomic_order_from_env(), rdma::AtomicOrder::BigEndian);
  ::setenv("RAILYARD_NIC_ATOMIC_ORDER", "native", 1);
  EXPECT_EQ(atomic_order_from_env(), rdma::AtomicOrder::Native);
  ::setenv("RAILYARD_NIC_ATOMIC_ORDER", "little", 1);
  try {
    atomic_order_from_env();
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_HAS(e.what(), "RAILYARD_NIC_ATOMIC_ORDER is 'little'; expected native or big-endian");
  }
  ::unsetenv("RAILYARD_NIC_ATOMIC_ORDER");
}

}  // namespace
}  // namespace railyard::runtime
