// Railyard runtime: outcome agreement and fd exchange for registered-buffer creation.
#include "registered_buffer_exchange.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace railyard::runtime {

const char* to_string(RegisteredBufferStep step) {
  switch (step) {
    case RegisteredBufferStep::CheckConfig: return "check_config";
    case RegisteredBufferStep::Topology: return "topology";
    case RegisteredBufferStep::Allocate: return "allocate";
    case RegisteredBufferStep::ZeroFill: return "zero_fill";
    case RegisteredBufferStep::RegisterMemory: return "register_memory";
    case RegisteredBufferStep::Export: return "export";
    case RegisteredBufferStep::ExchangeHandles: return "exchange_handles";
    case RegisteredBufferStep::PassFds: return "pass_fds";
    case RegisteredBufferStep::Import: return "import";
    case RegisteredBufferStep::Destroy: return "destroy";
  }
  return "unknown";
}

namespace detail {
namespace {

// What a sender puts beside its descriptor: the receiver's token (proves the sender
// read the receiver's record from this exchange) and who is sending.
struct FdPayload {
  uint64_t token = 0;
  int32_t sender = -1;
  int32_t reserved = 0;
};

std::string hex64(uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

std::string ms(std::chrono::milliseconds t) { return std::to_string(t.count()) + " ms"; }

}  // namespace

std::vector<RankFailure> gather_failures(Bootstrap& bootstrap, const std::optional<StepFailure>& mine) {
  std::vector<RankFailure> failures;
  for (runtime::RankFailure& f :
       runtime::gather_failures(bootstrap, mine ? static_cast<int32_t>(mine->step) : 0, mine ? mine->message : ""))
    failures.push_back({f.rank, static_cast<RegisteredBufferStep>(f.code), std::move(f.message)});
  return failures;
}

RegisteredBufferError failures_error(const std::vector<RankFailure>& failures, int seen_by) {
  RegisteredBufferStep earliest = failures.front().step;
  std::vector<int> ranks;
  std::ostringstream os;
  os << "railyard RegisteredBuffer: creation failed";
  for (std::size_t i = 0; i < failures.size(); ++i) {
    const RankFailure& f = failures[i];
    earliest = std::min(earliest, f.step);
    ranks.push_back(f.rank);
    os << (i ? "; " : " ") << "on rank " << f.rank << " at step '" << to_string(f.step) << "': " << f.message;
  }
  os << " (seen by rank " << seen_by << "; every rank released its buffer)";
  return RegisteredBufferError(earliest, std::move(ranks), os.str());
}

SocketPath& SocketPath::operator=(SocketPath&& other) noexcept {
  if (this != &other) {
    if (!path_.empty()) ::unlink(path_.c_str());
    path_ = std::exchange(other.path_, {});
  }
  return *this;
}
SocketPath::~SocketPath() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

std::string fd_socket_dir(const std::string& option) {
  if (!option.empty()) return option;
  const char* env = std::getenv("RAILYARD_FD_SOCKET_DIR");
  return env ? std::string(env) : std::string();
}

FdListener listen_for_fds(int rank, const std::string& socket_dir) {
  std::random_device entropy;
  const uint64_t token = (uint64_t{entropy()} << 32 | entropy()) ^
                         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  FdListener out;
  out.token = token;
  const std::string leaf = "railyard-rb-" + std::to_string(::getpid()) + "-" + std::to_string(rank) + "-" + hex64(token);
  if (socket_dir.empty()) {
    out.name = leaf;
  } else {
    if (socket_dir.front() != '/')
      throw std::invalid_argument("railyard RegisteredBuffer: the fd socket directory '" + socket_dir +
                                  "' (RegisteredBufferOptions::fd_socket_dir or RAILYARD_FD_SOCKET_DIR) is not an "
                                  "absolute path; expected one every rank's container sees at the same path");
    out.name = socket_dir + (socket_dir.back() == '/' ? "" : "/") + leaf;
    if (out.name.size() >= kSocketNameBytes)
      throw std::invalid_argument("railyard RegisteredBuffer: the fd socket directory '" + socket_dir + "' is too " +
                                  "long: the socket path '" + out.name + "' is " + std::to_string(out.name.size()) +
                                  " bytes; expected at most " + std::to_string(kSocketNameBytes - 1) +
                                  " (a Unix socket path's limit)");
  }
  out.socket = listen_unix(out.name);
  if (!socket_dir.empty()) out.path = SocketPath(out.name);
  return out;
}

std::map<int, UniqueFd> exchange_fds(const FdExchange& exchange) {
  const auto deadline = std::chrono::steady_clock::now() + exchange.timeout;
  auto remaining = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };

  std::map<int, UniqueFd> received;
  std::string receive_error;
  std::thread receiver([&] {
    std::set<int> expected(exchange.peers.begin(), exchange.peers.end());
    try {
      while (!expected.empty()) {
        UniqueFd connection = accept_unix(exchange.listener, remaining());
        ReceivedFd got = receive_fd(connection.get(), remaining());
        FdPayload payload;
        if (got.payload.size() != sizeof(payload)) continue;  // not one of ours
        std::memcpy(&payload, got.payload.data(), sizeof(payload));
        if (payload.token != exchange.token || !expected.count(payload.sender)) continue;  // a stray connection
        received[payload.sender] = std::move(got.fd);
        expected.erase(payload.sender);
      }
    } catch (const std::exception& e) {
      receive_error = "no descriptor from rank(s) " + format_ranks({expected.begin(), expected.end()}) + " within " +
                      ms(exchange.timeout) + " (" + e.what() + ")";
    }
  });

  std::string send_error;
  // Kept open until the receivers are done: closing first is allowed by the socket
  // semantics, but an open connection keeps a failure at the receiver explainable.
  std::vector<UniqueFd> connections;
  for (int peer : exchange.peers) {
    try {
      UniqueFd connection = connect_unix(exchange.socket_names.at(static_cast<std::size_t>(peer)), remaining());
      const FdPayload payload{exchange.tokens.at(static_cast<std::size_t>(peer)), exchange.rank, 0};
      send_fd(connection.get(), exchange.fd, std::as_bytes(std::span<const FdPayload, 1>(&payload, 1)));
      connections.push_back(std::move(connection));
    } catch (const std::exception& e) {
      send_error = "sending to rank " + std::to_string(peer) + ": " + e.what();
      break;
    }
  }
  receiver.join();
  if (!send_error.empty() || !receive_error.empty())
    throw std::runtime_error("railyard fd exchange (rank " + std::to_string(exchange.rank) + "): " + send_error +
                             (send_error.empty() || receive_error.empty() ? "" : "; ") + receive_error);
  return received;
}

}  // namespace detail
}  // namespace railyard::runtime
