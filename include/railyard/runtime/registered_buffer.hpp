// Railyard runtime: the registered buffer, the one peer-visible allocation of a rank.
//
// Every rank of an expert-parallel group creates one, collectively, at start-up. Its
// size is the caller's: the path that uses it (src/api's, for a Buffer) adds up its
// regions for the agreed config (docs/buffers.md). It is allocated as shareable device
// memory on the current device, zero-filled (the kernels' flags and sequence numbers
// start at 0), and mapped into every other rank of the same NVLink domain, so that a
// kernel can store into any peer's buffer through peer_ptr(peer).
//
// Creation is collective and fails collectively: every step that can fail on one rank
// alone (allocation, zero fill, memory registration, export, fd passing, import) is
// followed by a round in which the ranks exchange their outcomes, so a failure on rank
// 3 becomes the same RegisteredBufferError on every rank, naming the step and rank 3,
// and every rank releases what it acquired. A rank that never arrives (crashed before
// the call) is caught by the bootstrap's timeout instead.
//
// Destruction is collective too: unmap the peers' buffers, barrier (every peer has
// unmapped ours and, its streams being synchronized, stopped writing into it), free our
// own. Nothing else in Railyard allocates device memory on its own: outputs, scratch
// and handles come from the caller's Allocator (allocator.hpp).
//
// Compiled per flavour (railyard_runtime_sim, railyard_runtime_cuda), like device_api.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "railyard/runtime/config.hpp"
#include "railyard/runtime/device_api.hpp"
#include "railyard/runtime/memory_registrar.hpp"
#include "railyard/runtime/topology.hpp"

namespace railyard::runtime {

class Bootstrap;

// The steps of creating (and destroying) a registered buffer, in order; errors name them.
enum class RegisteredBufferStep : int32_t {
  CheckConfig = 1,      // BufferConfig::check_agreement, then the caller's size of it
  Topology = 2,         // detect or take the topology; it must match the config
  Allocate = 3,         // gpu::shareable_malloc of required_bytes on the current device
  ZeroFill = 4,         // memset 0 and synchronize
  RegisterMemory = 5,   // every MemoryRegistrar (RDMA; none by default)
  Export = 6,           // gpu::export_handle (+ a socket to receive peers' fds on)
  ExchangeHandles = 7,  // allgather of handles, host ids and socket names
  PassFds = 8,          // POSIX fds to and from every domain peer (CUDA VMM on one host)
  Import = 9,           // gpu::import_handle of every domain peer's buffer
  Destroy = 10,         // unmap, deregister, barrier, free
};
const char* to_string(RegisteredBufferStep step);

class RegisteredBufferError : public std::runtime_error {
 public:
  RegisteredBufferError(RegisteredBufferStep step, std::vector<int> failed_ranks, const std::string& message)
      : std::runtime_error(message), step_(step), failed_ranks_(std::move(failed_ranks)) {}
  // The earliest step that failed (on any rank).
  RegisteredBufferStep step() const { return step_; }
  // The ranks on which a step failed; empty when a collective step failed everywhere
  // alike (a configuration mismatch, a bootstrap timeout), whose cause is nested
  // (std::rethrow_if_nested rethrows the ConfigMismatchError, BootstrapError, ...).
  const std::vector<int>& failed_ranks() const { return failed_ranks_; }

 private:
  RegisteredBufferStep step_;
  std::vector<int> failed_ranks_;
};

struct RegisteredBufferOptions {
  // Empty: detect_topology(bootstrap, topology_options). Either way the topology must
  // have config.num_ranks ranks in domains of config.ranks_per_domain, on every rank.
  std::optional<Topology> topology;
  TopologyOptions topology_options;
  // Empty: the best the device offers (see ShareableMallocRequest::handle_type).
  std::optional<ShareableHandleType> handle_type;
  // How long a rank waits for a domain peer's file descriptor (PosixFd handles only).
  // Collective rounds are bounded by the bootstrap's own timeout.
  std::chrono::milliseconds fd_timeout = std::chrono::seconds(60);
  // Where PosixFd handles rendezvous. Empty: the environment's RAILYARD_FD_SOCKET_DIR,
  // and if that is unset too, abstract Unix sockets, which do not cross network
  // namespaces. Ranks in different network namespaces (one container per GPU) need a
  // directory that every rank's container sees at this path (a shared mount); each
  // rank's socket file there is removed when creation ends.
  std::string fd_socket_dir;
  // RDMA registrars (see MemoryRegistrar); none within one NVLink domain.
  std::vector<std::shared_ptr<MemoryRegistrar>> registrars;
  // Test hook: called on this rank before each creation step; an exception it throws
  // is that step's failure on this rank (how tests inject an allocation failure on
  // one rank). Before a collective step (CheckConfig, Topology, ExchangeHandles) the
  // rank then never joins the collective, as if it had crashed: the others fail on
  // the bootstrap's timeout.
  std::function<void(RegisteredBufferStep step)> before_step;
};

// The bytes of one rank's registered buffer for an agreed config: the caller's
// formula (for a Buffer, its path's layout; see src/api/path.hpp). Called on every rank
// once the config is agreed, so every rank computes the same; an exception from it
// (a config past the layout's limits) fails creation at step CheckConfig on every rank
// alike, and so does a size of 0.
using RequiredBytes = std::function<std::size_t(const BufferConfig& config)>;

class RegisteredBuffer {
 public:
  // Collective over `bootstrap` (every rank calls it); allocates required_bytes(config)
  // on the current device. `bootstrap` must outlive the buffer: destruction uses it.
  // Throws RegisteredBufferError on every rank, having released everything, on failure.
  RegisteredBuffer(const BufferConfig& config, const RequiredBytes& required_bytes, Bootstrap& bootstrap,
                   const RegisteredBufferOptions& options = {});
  // Collective: destroy() unless already destroyed; errors are printed, not thrown.
  ~RegisteredBuffer();
  RegisteredBuffer(RegisteredBuffer&& other) noexcept;
  RegisteredBuffer& operator=(RegisteredBuffer&&) = delete;  // would hide a collective destroy
  RegisteredBuffer(const RegisteredBuffer&) = delete;
  RegisteredBuffer& operator=(const RegisteredBuffer&) = delete;

  // Collective: unmaps every peer, deregisters, waits for every rank, frees this rank's
  // memory. The caller has synchronized every stream that used the buffer. Throws
  // RegisteredBufferError (step Destroy) after releasing all it could.
  void destroy();
  bool valid() const { return state_ != nullptr; }

  int rank() const;
  const BufferConfig& config() const;
  const Topology& topology() const;
  std::size_t bytes() const;         // required_bytes(config()), as the caller asked
  std::size_t mapped_bytes() const;  // what the device actually reserved
  ShareableHandleType handle_type() const;
  int device() const;

  // This rank's buffer, and `peer`'s as mapped into this rank's device: `peer` is a
  // rank of the group in this rank's NVLink domain (itself included).
  // std::out_of_range otherwise.
  uint8_t* local_ptr() const;
  uint8_t* peer_ptr(int peer) const;
  // The domain's buffers indexed by domain-local rank, as kernels take them, and this
  // rank's index among them.
  std::span<uint8_t* const> domain_ptrs() const;
  int domain_rank() const;

 private:
  struct State;
  const State& state(const char* what) const;
  std::unique_ptr<State> state_;
};

}  // namespace railyard::runtime
