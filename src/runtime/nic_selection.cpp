// Railyard runtime: which RDMA NIC each GPU uses (include/railyard/runtime/nic_selection.hpp).
#include "railyard/runtime/nic_selection.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace railyard::runtime {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  for (char c : text) {
    if (c == separator) {
      parts.push_back(part);
      part.clear();
    } else {
      part += c;
    }
  }
  parts.push_back(part);
  return parts;
}

// The path's components from its PCI root complex ("pci0000:00") on; empty when the
// path holds none (not a PCI device).
std::vector<std::string> pci_components(const std::string& path) {
  const std::vector<std::string> parts = split(path, '/');
  const auto root = std::find_if(parts.begin(), parts.end(), [](const std::string& p) { return p.rfind("pci", 0) == 0; });
  std::vector<std::string> out(root, parts.end());
  std::erase(out, std::string());
  return out;
}

bool any_port_active(const fs::path& nic_dir) {
  std::error_code ec;
  for (const fs::directory_entry& port : fs::directory_iterator(nic_dir / "ports", ec)) {
    std::ifstream state(port.path() / "state");
    std::string line;
    if (std::getline(state, line) && line.find("ACTIVE") != std::string::npos) return true;
  }
  return false;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::vector<RdmaNic> list_rdma_nics(const std::string& sysfs_root) {
  std::vector<RdmaNic> nics;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(fs::path(sysfs_root) / "class" / "infiniband", ec)) {
    RdmaNic nic;
    nic.name = entry.path().filename().string();
    const fs::path device = fs::canonical(entry.path() / "device", ec);
    nic.pci_path = ec ? std::string() : device.string();
    nic.port_active = any_port_active(entry.path());
    nics.push_back(std::move(nic));
  }
  std::sort(nics.begin(), nics.end(), [](const RdmaNic& a, const RdmaNic& b) { return a.name < b.name; });
  return nics;
}

std::string pci_path_of(const std::string& bus_id, const std::string& sysfs_root) {
  const fs::path link = fs::path(sysfs_root) / "bus" / "pci" / "devices" / lower(bus_id);
  std::error_code ec;
  const fs::path resolved = fs::canonical(link, ec);
  if (ec) throw std::runtime_error("railyard NIC selection: " + link.string() + " does not resolve (" + ec.message() +
                                   "); expected the sysfs entry of the GPU's PCI bus id " + bus_id);
  return resolved.string();
}

int pci_distance(const std::string& a, const std::string& b) {
  const std::vector<std::string> pa = pci_components(a), pb = pci_components(b);
  if (pa.empty() || pb.empty() || pa.front() != pb.front()) return kUnrelated;
  std::size_t common = 0;
  while (common < pa.size() && common < pb.size() && pa[common] == pb[common]) ++common;
  return static_cast<int>((pa.size() - common) + (pb.size() - common));
}

NicChoice choose_nic(const std::string& gpu_pci_path, int local_index, const std::vector<RdmaNic>& nics,
                     const std::optional<std::vector<std::string>>& mapping) {
  if (nics.empty()) throw std::runtime_error("railyard NIC selection: no RDMA device found (/sys/class/infiniband is empty)");
  const auto distance_to = [&](const RdmaNic& nic) { return nic.pci_path.empty() ? kUnrelated : pci_distance(gpu_pci_path, nic.pci_path); };
  if (mapping) {
    const std::string where = "the NIC mapping (RAILYARD_NICS or BufferOptions)";
    if (local_index < 0 || static_cast<std::size_t>(local_index) >= mapping->size())
      throw std::invalid_argument("railyard NIC selection: " + where + " names " + std::to_string(mapping->size()) +
                                  " NICs; expected one per local GPU, at least " + std::to_string(local_index + 1));
    const std::string& name = (*mapping)[static_cast<std::size_t>(local_index)];
    const auto it = std::find_if(nics.begin(), nics.end(), [&](const RdmaNic& n) { return n.name == name; });
    if (it == nics.end()) {
      std::string known;
      for (const RdmaNic& n : nics) known += (known.empty() ? "" : ", ") + n.name;
      throw std::invalid_argument("railyard NIC selection: " + where + " names '" + name + "' for local GPU " +
                                  std::to_string(local_index) + "; expected one of " + known);
    }
    return {name, distance_to(*it), where + "[" + std::to_string(local_index) + "]"};
  }
  const bool any_active = std::any_of(nics.begin(), nics.end(), [](const RdmaNic& n) { return n.port_active; });
  int best = kUnrelated + 1;
  std::vector<const RdmaNic*> tied;
  for (const RdmaNic& nic : nics) {
    if (any_active && !nic.port_active) continue;
    const int d = distance_to(nic);
    if (d < best) tied.clear(), best = d;
    if (d == best) tied.push_back(&nic);
  }
  const RdmaNic& chosen = *tied[static_cast<std::size_t>(std::max(local_index, 0)) % tied.size()];
  std::string why = best == kUnrelated ? "no NIC shares a PCI root complex with the GPU"
                                       : "nearest on PCIe (distance " + std::to_string(best) + ")";
  if (tied.size() > 1) why += ", one of " + std::to_string(tied.size()) + " tied, by local GPU index";
  if (!any_active) why += "; no port is ACTIVE";
  return {chosen.name, best, why};
}

std::optional<std::vector<std::string>> nic_mapping_from_env() {
  const char* value = std::getenv("RAILYARD_NICS");
  if (value == nullptr || *value == '\0') return std::nullopt;
  return split(value, ',');
}

std::optional<rdma::AtomicOrder> atomic_order_from_env() {
  const char* value = std::getenv("RAILYARD_NIC_ATOMIC_ORDER");
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::string v = value;
  if (v == "native") return rdma::AtomicOrder::Native;
  if (v == "big-endian") return rdma::AtomicOrder::BigEndian;
  throw std::invalid_argument("RAILYARD_NIC_ATOMIC_ORDER is '" + v + "'; expected native or big-endian");
}

}  // namespace railyard::runtime
