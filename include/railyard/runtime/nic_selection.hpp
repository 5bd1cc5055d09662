// Railyard runtime: which RDMA NIC each GPU uses (the RDMA transport's "NIC per GPU").
//
// A GPU should send through the NIC nearest to it on PCIe: one under the same switch
// reaches its memory peer to peer without crossing the CPU's root complex. The
// kernel's sysfs says where every device sits: /sys/bus/pci/devices/<bus id> and
// /sys/class/infiniband/<nic>/device are links into /sys/devices/pci<domain>:<bus>/...,
// whose path lists every bridge above the device. The distance between two devices is
// the number of links from each up to their deepest common ancestor; devices under
// different root complexes share none and are as far apart as possible.
//
// A user mapping (BufferOptions, or RAILYARD_NICS="mlx5_0,mlx5_3,..." by local GPU
// index) overrides the choice; each named NIC must exist. Host only; reads sysfs under
// a root that tests point at a fake tree.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "railyard/runtime/rdma.hpp"

namespace railyard::runtime {

struct RdmaNic {
  std::string name;      // e.g. "mlx5_0"
  std::string pci_path;  // resolved sysfs path of its PCI function
  bool port_active = false;  // some port reports state ACTIVE
};

// The RDMA devices under <sysfs_root>/class/infiniband, sorted by name, each with its
// resolved PCI path and port state. Empty when there is none (or no such directory).
std::vector<RdmaNic> list_rdma_nics(const std::string& sysfs_root = "/sys");

// The resolved sysfs path of the PCI device `bus_id` ("0000:17:00.0", as
// cudaDeviceGetPCIBusId writes it, any case). std::runtime_error naming the path when
// it does not exist.
std::string pci_path_of(const std::string& bus_id, const std::string& sysfs_root = "/sys");

// Links from `a` and from `b` up to their deepest common PCI ancestor (0: the same
// device), or kUnrelated when they are under different root complexes.
inline constexpr int kUnrelated = 1 << 20;
int pci_distance(const std::string& a, const std::string& b);

struct NicChoice {
  std::string nic;
  int distance = kUnrelated;
  std::string why;  // for logs: "nearest on PCIe (distance 2)", "RAILYARD_NICS[3]", ...
};

// The NIC for the GPU at `gpu_pci_path`, local GPU index `local_index` on its host:
// `mapping[local_index]` when a mapping is given (std::invalid_argument naming the
// mapping when it is too short or names a NIC not in `nics`); otherwise the nearest
// NIC with an active port (any NIC when none is active), ties going to the
// (local_index mod ties)-th of the tied NICs by name, so GPUs that share a switch with
// two NICs spread over both. std::runtime_error when `nics` is empty.
NicChoice choose_nic(const std::string& gpu_pci_path, int local_index, const std::vector<RdmaNic>& nics,
                     const std::optional<std::vector<std::string>>& mapping = std::nullopt);

// RAILYARD_NICS split at commas, or nothing when unset or empty.
std::optional<std::vector<std::string>> nic_mapping_from_env();

// RAILYARD_NIC_ATOMIC_ORDER ("native" or "big-endian"): how the NICs a Buffer opens
// itself add 8-byte atomics, which verbs cannot query (railyard-rdma-probe finds it on
// the wire, docs/rdma-bringup.md). Nothing when unset or empty; std::invalid_argument
// naming the variable and the values it takes otherwise.
std::optional<rdma::AtomicOrder> atomic_order_from_env();

}  // namespace railyard::runtime
