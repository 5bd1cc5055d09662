// Railyard public API, internal: which transport a Buffer's kernels use between NVLink
// domains (BufferOptions::transport), chosen on every rank and agreed by all.
#pragma once

#include <string>

#include "railyard/buffer.hpp"
#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/rdma.hpp"

namespace railyard::detail {

// What this rank has to choose from.
struct TransportCandidates {
  // This rank's NIC, or null where none was opened; `nic_problem` then says why.
  const runtime::rdma::NicAttributes* nic = nullptr;
  std::string nic_problem;
  // Whether a GIN lane can be made here; `gin_problem` says why not.
  bool gin = false;
  std::string gin_problem;
};

// This rank's choice (Transport::Auto's rule, buffer.hpp), or std::invalid_argument
// naming options.transport and what is missing.
Transport choose_transport(Transport requested, const TransportCandidates& candidates);

// Collective: each rank's problem with a step every rank takes (empty: none). Where a
// rank has one, every rank throws the same std::invalid_argument: "`what` on N
// rank(s):", then each such rank and its problem.
void throw_if_any_rank_failed(runtime::Bootstrap& bootstrap, const std::string& problem, const std::string& what);

// Collective: every rank's choose_transport, agreed. Every rank throws the same
// std::invalid_argument when a rank could not choose (naming the ranks and their
// reasons) or when the ranks chose differently (naming each rank's choice).
Transport agree_transport(runtime::Bootstrap& bootstrap, Transport requested, const TransportCandidates& candidates);

}  // namespace railyard::detail
