// Railyard runtime (internal): the two exchanges a registered buffer's creation needs
// beyond the bootstrap's allgather:
//  - gather_failures: after every step that can fail on one rank alone, the ranks
//    exchange their outcomes, so that all of them throw the same error (naming the
//    failed step and ranks) and roll back together instead of leaving peers waiting;
//  - exchange_fds: each rank of a domain sends its POSIX fd handle to every domain peer
//    and receives theirs, over Unix sockets whose abstract names and tokens travelled
//    in the handle allgather.
// Plain host code (sockets and the bootstrap), compiled into both flavour libraries
// with registered_buffer.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "railyard/runtime/bootstrap.hpp"
#include "railyard/runtime/fd_passing.hpp"
#include "railyard/runtime/registered_buffer.hpp"

namespace railyard::runtime::detail {

struct StepFailure {
  RegisteredBufferStep step{};
  std::string message;
};
struct RankFailure {
  int rank = -1;
  RegisteredBufferStep step{};
  std::string message;
};

// Collective: every rank passes its own outcome (nullopt: success); returns the failed
// ranks' outcomes in rank order, identical on every rank. One 8-byte allgather when all
// succeeded, a second one carrying the messages otherwise.
std::vector<RankFailure> gather_failures(Bootstrap& bootstrap, const std::optional<StepFailure>& mine);

// The error every rank throws for `failures` (not empty): the earliest step, the
// failed ranks, each rank's message, and which rank saw it.
RegisteredBufferError failures_error(const std::vector<RankFailure>& failures, int seen_by);

// A socket name, abstract or a path, is at most 107 bytes (sockaddr_un::sun_path).
inline constexpr std::size_t kSocketNameBytes = 108;

// Removes a filesystem socket when its listener goes away (abstract names need nothing).
class SocketPath {
 public:
  SocketPath() = default;
  explicit SocketPath(std::string path) : path_(std::move(path)) {}
  SocketPath(SocketPath&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  SocketPath& operator=(SocketPath&& other) noexcept;
  SocketPath(const SocketPath&) = delete;
  SocketPath& operator=(const SocketPath&) = delete;
  ~SocketPath();

 private:
  std::string path_;
};

struct FdListener {
  UniqueFd socket;
  std::string name;  // abstract, or a path under the socket directory
  // Random, sent back by every peer that connects: a connection carrying another
  // token is not part of this exchange and is refused.
  uint64_t token = 0;
  SocketPath path;  // unlinks `name` when it is a path
};
// The directory fd sockets rendezvous in: `option` if not empty, else the environment's
// RAILYARD_FD_SOCKET_DIR, else empty (abstract sockets).
std::string fd_socket_dir(const std::string& option);
// Listens on a fresh name unique to this process, rank and moment: abstract when
// `socket_dir` is empty, else a socket file in that directory.
FdListener listen_for_fds(int rank, const std::string& socket_dir);

struct FdExchange {
  int rank = -1;
  int listener = -1;        // this rank's FdListener::socket
  uint64_t token = 0;       // this rank's FdListener::token
  int fd = -1;              // the descriptor this rank sends to each peer
  std::vector<int> peers;   // the ranks this one sends to and receives from
  std::vector<std::string> socket_names;  // by rank (entries of `peers` are used)
  std::vector<uint64_t> tokens;           // by rank
  std::chrono::milliseconds timeout{60000};
};
// Sends `fd` to every peer and returns every peer's descriptor, by rank. A receiving
// thread accepts while this one connects, so no rank waits on a full listen backlog
// (72 ranks per domain exceed it). Throws std::runtime_error naming the peer on timeout.
std::map<int, UniqueFd> exchange_fds(const FdExchange& exchange);

}  // namespace railyard::runtime::detail
