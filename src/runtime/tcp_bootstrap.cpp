// Railyard runtime: the TCP bootstrap (include/railyard/runtime/tcp_bootstrap.hpp).
#include "railyard/runtime/tcp_bootstrap.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace railyard::runtime {
namespace {

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Waits until `fd` is ready for `events`; false when the deadline passed first.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

TcpBootstrap::TcpBootstrap(const TcpBootstrapOptions& options) : options_(options) {
  if (options.size < 1) throw std::invalid_argument("railyard TCP bootstrap: size is " + std::to_string(options.size) + "; expected at least 1");
  if (options.rank < 0 || options.rank >= options.size)
    throw std::invalid_argument("railyard TCP bootstrap: rank is " + std::to_string(options.rank) + "; expected 0.." +
                                std::to_string(options.size - 1));
  if (options.port < 1 || options.port > 65535)
    throw std::invalid_argument("railyard TCP bootstrap: port is " + std::to_string(options.port) +
                                "; expected 1..65535");
  deadline_ = Clock::now() + options.timeout;
  peers_.assign(options.rank == 0 ? static_cast<std::size_t>(options.size) : 1u, -1);
  if (options.size == 1) return;
  if (options.rank == 0) {
    int listener = ::socket(AF_INET6, SOCK_STREAM, 0);
    if (listener < 0) fail(std::string("socket: ") + std::strerror(errno));
    const int yes = 1, no = 0;
    ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    ::setsockopt(listener, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof no);  // IPv4 peers too
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(options.port));
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, options.size) != 0) {
      const std::string why = std::strerror(errno);
      close_fd(listener);
      fail("bind or listen on port " + std::to_string(options.port) + ": " + why);
    }
    try {
      for (int accepted = 1; accepted < options.size; ++accepted) {
        if (!wait_ready(listener, POLLIN, deadline_))
          fail("only " + std::to_string(accepted - 1) + " of " + std::to_string(options.size - 1) +
               " ranks connected to port " + std::to_string(options.port) + " within the timeout");
        int fd = ::accept(listener, nullptr, nullptr);
        if (fd < 0) fail(std::string("accept: ") + std::strerror(errno));
        int32_t rank = -1;
        receive_all(fd, &rank, sizeof rank, -1, "a connecting rank's number");
        if (rank <= 0 || rank >= options.size || peers_[static_cast<std::size_t>(rank)] >= 0) {
          ::close(fd);
          fail("a connection announced rank " + std::to_string(rank) + "; expected a rank 1.." +
               std::to_string(options.size - 1) + " not yet connected");
        }
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
        peers_[static_cast<std::size_t>(rank)] = fd;
      }
    } catch (...) {
      close_fd(listener);
      for (int& fd : peers_) close_fd(fd);
      throw;
    }
    close_fd(listener);
    return;
  }
  // Other ranks: connect to rank 0, retrying while it is not listening yet.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(options.port);
  if (const int rc = ::getaddrinfo(options.host.c_str(), port.c_str(), &hints, &found); rc != 0)
    fail("cannot resolve host '" + options.host + "': " + ::gai_strerror(rc));
  std::string last_error = "no address";
  int fd = -1;
  while (fd < 0 && Clock::now() < deadline_) {
    for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        last_error = std::strerror(errno);
        close_fd(fd);
      }
    }
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::freeaddrinfo(found);
  if (fd < 0) fail("could not connect to rank 0 at " + options.host + ":" + port + " within the timeout: " + last_error);
  const int yes = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  peers_[0] = fd;
  const int32_t rank = options.rank;
  send_all(fd, &rank, sizeof rank, 0, "this rank's number");
}

TcpBootstrap::~TcpBootstrap() {
  for (int& fd : peers_) close_fd(fd);
}

void TcpBootstrap::fail(const std::string& what) const {
  throw BootstrapError("railyard TCP bootstrap (rank " + std::to_string(options_.rank) + " of " +
                       std::to_string(options_.size) + ", rank 0 at " + options_.host + ":" +
                       std::to_string(options_.port) + "): " + what);
}

void TcpBootstrap::send_all(int fd, const void* data, std::size_t bytes, int peer, const char* what) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    if (!wait_ready(fd, POLLOUT, deadline_))
      fail(std::string("sending ") + what + " to rank " + std::to_string(peer) + ": timed out");
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(std::string("sending ") + what + " to rank " + std::to_string(peer) + ": " + std::strerror(errno));
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void TcpBootstrap::receive_all(int fd, void* data, std::size_t bytes, int peer, const char* what) {
  auto* p = static_cast<char*>(data);
  const std::string from = peer < 0 ? std::string("a connecting rank") : "rank " + std::to_string(peer);
  while (bytes > 0) {
    if (!wait_ready(fd, POLLIN, deadline_)) fail(std::string("waiting for ") + what + " from " + from + ": timed out");
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) fail(std::string("waiting for ") + what + " from " + from + ": it closed the connection");
    if (n < 0) fail(std::string("waiting for ") + what + " from " + from + ": " + std::strerror(errno));
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void TcpBootstrap::allgather_same_size(std::span<const std::byte> mine, std::span<std::byte> all) {
  deadline_ = Clock::now() + options_.timeout;
  const std::size_t n = mine.size();
  const auto at = [&](int r) { return all.data() + static_cast<std::size_t>(r) * n; };
  if (n > 0) std::memcpy(at(options_.rank), mine.data(), n);
  if (options_.size == 1) return;
  if (options_.rank == 0) {
    for (int r = 1; r < options_.size; ++r) receive_all(peers_[static_cast<std::size_t>(r)], at(r), n, r, "allgather bytes");
    for (int r = 1; r < options_.size; ++r)
      send_all(peers_[static_cast<std::size_t>(r)], all.data(), all.size(), r, "allgather result");
  } else {
    send_all(peers_[0], mine.data(), n, 0, "allgather bytes");
    receive_all(peers_[0], all.data(), all.size(), 0, "allgather result");
  }
}

void TcpBootstrap::barrier() { barrier_by_allgather(); }

}  // namespace railyard::runtime
