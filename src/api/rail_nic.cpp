// Railyard public API, internal: RailNic (rail_nic.hpp).
#include "rail_nic.hpp"

#include <exception>
#include <string>

namespace railyard::detail {

void RailNic::register_memory(const runtime::RegisteredRegion& region) {
  if (nic_ == nullptr) {
    try {
      owned_ = open_own_nic(region.device, local_index_);
    } catch (const std::exception& e) {
      if (!optional_) throw;
      problem_ = std::string("this rank's NIC could not be opened: ") + e.what();
      return;
    }
    nic_ = owned_.get();
  }
  registrar_.emplace(*nic_);
  registrar_->register_memory(region);
}

void RailNic::deregister_memory(const runtime::RegisteredRegion& region) noexcept {
  if (registrar_) registrar_->deregister_memory(region);
  registrar_.reset();
}

}  // namespace railyard::detail
