// Railyard public API, internal: the transport between NVLink domains (transport_choice.hpp).
#include "transport_choice.hpp"

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace railyard::detail {

namespace {
std::string nic_not_driven(const TransportCandidates& c) {
  return c.nic == nullptr ? c.nic_problem
                          : "this rank's NIC is not one the GPU can drive itself (no IBGDA: "
                            "NicAttributes::gpu_initiated is false)";
}
}  // namespace

Transport choose_transport(Transport requested, const TransportCandidates& c) {
  const bool mlx5 = c.nic != nullptr && c.nic->gpu_initiated;
  switch (requested) {
    case Transport::Mlx5:
      if (mlx5) return Transport::Mlx5;
      throw std::invalid_argument("railyard Buffer: options.transport is Transport::Mlx5, but " + nic_not_driven(c) +
                                  "; expected Transport::Gin or Auto there");
    case Transport::Gin:
      if (c.gin) return Transport::Gin;
      throw std::invalid_argument("railyard Buffer: options.transport is Transport::Gin, but " + c.gin_problem);
    case Transport::Auto:
      if (mlx5) return Transport::Mlx5;
      if (c.gin) return Transport::Gin;
      throw std::invalid_argument("railyard Buffer: options.transport is Transport::Auto, and neither transport is "
                                  "available: mlx5: " +
                                  nic_not_driven(c) + "; gin: " + c.gin_problem);
  }
  throw std::invalid_argument("railyard Buffer: options.transport is " + std::to_string(static_cast<int>(requested)) +
                              "; expected Transport::Auto, Mlx5 or Gin");
}

void throw_if_any_rank_failed(runtime::Bootstrap& bootstrap, const std::string& problem, const std::string& what) {
  const std::vector<runtime::RankFailure> failed = runtime::gather_failures(bootstrap, problem.empty() ? 0 : 1, problem);
  if (failed.empty()) return;
  std::string message = what + " on " + std::to_string(failed.size()) + " rank(s):";
  for (const runtime::RankFailure& f : failed) message += " rank " + std::to_string(f.rank) + ": " + f.message + ";";
  throw std::invalid_argument(message);
}

Transport agree_transport(runtime::Bootstrap& bootstrap, Transport requested, const TransportCandidates& c) {
  Transport mine = Transport::Auto;
  std::string problem;
  try {
    mine = choose_transport(requested, c);
  } catch (const std::invalid_argument& e) {
    problem = e.what();
  }
  throw_if_any_rank_failed(bootstrap, problem, "railyard Buffer: no transport between NVLink domains");
  const std::vector<Transport> all = runtime::allgather_value(bootstrap, mine);
  for (const Transport t : all) {
    if (t == all[0]) continue;
    std::string message = "railyard Buffer: the ranks chose different transports between NVLink domains "
                          "(options.transport " + std::string(to_string(requested)) + "):";
    for (std::size_t r = 0; r < all.size(); ++r)
      message += " rank " + std::to_string(r) + " " + to_string(all[r]) + ",";
    message.back() = ';';
    throw std::invalid_argument(message + " expected the same NICs, or one transport named on every rank");
  }
  return mine;
}

}  // namespace railyard::detail
