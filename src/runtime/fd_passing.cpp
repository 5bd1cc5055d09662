// Railyard runtime: SCM_RIGHTS descriptor passing over Unix seqpacket sockets.
#include "railyard/runtime/fd_passing.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <thread>

namespace railyard::runtime {
namespace {

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), "railyard fd passing: " + what);
}

// A name starting with '/' is a filesystem path; any other is abstract. Abstract
// names start with a NUL byte, and the length, not a terminator, ends them.
socklen_t socket_address(std::string_view name, sockaddr_un* addr) {
  const bool path = !name.empty() && name.front() == '/';
  const std::size_t room = sizeof(addr->sun_path) - 1;  // a NUL first (abstract) or last (path)
  if (name.empty() || name.size() > room)
    throw std::invalid_argument("railyard fd passing: " + std::string(path ? "socket path" : "abstract socket name") +
                                " '" + std::string(name) + "' is " + std::to_string(name.size()) +
                                " bytes; expected 1.." + std::to_string(room));
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (path) {
    std::memcpy(addr->sun_path, name.data(), name.size());
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + 1);
  }
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

UniqueFd new_socket() {
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw_errno("socket(AF_UNIX, SOCK_SEQPACKET)");
  return fd;
}

// poll() for `events` within `timeout`; false on timeout.
bool wait_for(int fd, short events, std::chrono::milliseconds timeout, const char* what) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) throw_errno(std::string("poll in ") + what);
  }
}

}  // namespace

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

SocketPair make_socket_pair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) throw_errno("socketpair");
  return SocketPair{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

UniqueFd listen_unix(std::string_view name) {
  sockaddr_un addr;
  const socklen_t len = socket_address(name, &addr);
  UniqueFd fd = new_socket();
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0)
    throw_errno("bind to socket '" + std::string(name) + "'");
  if (::listen(fd.get(), 64) != 0) throw_errno("listen on '" + std::string(name) + "'");
  return fd;
}

UniqueFd accept_unix(int listener, std::chrono::milliseconds timeout) {
  if (!wait_for(listener, POLLIN, timeout, "accept_unix"))
    throw std::runtime_error("railyard fd passing: no peer connected within " + std::to_string(timeout.count()) +
                             " ms");
  UniqueFd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (!fd.valid()) throw_errno("accept");
  return fd;
}

UniqueFd connect_unix(std::string_view name, std::chrono::milliseconds timeout) {
  sockaddr_un addr;
  const socklen_t len = socket_address(name, &addr);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    UniqueFd fd = new_socket();
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) == 0) return fd;
    // The listener may not exist yet (ECONNREFUSED) or its backlog is full (EAGAIN).
    if (errno != ECONNREFUSED && errno != EAGAIN && errno != ENOENT)
      throw_errno("connect to '" + std::string(name) + "'");
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("railyard fd passing: nobody listened on '" + std::string(name) + "' within " +
                               std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

uint64_t network_namespace_id() {
  struct stat st {};
  if (::stat("/proc/thread-self/ns/net", &st) != 0 && ::stat("/proc/self/ns/net", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

void send_fd(int socket, int fd, std::span<const std::byte> payload) {
  if (payload.size() > kMaxFdPayloadBytes)
    throw std::invalid_argument("railyard fd passing: payload of " + std::to_string(payload.size()) +
                                " bytes exceeds kMaxFdPayloadBytes (" + std::to_string(kMaxFdPayloadBytes) + ")");
  // A length prefix: SCM_RIGHTS needs at least one data byte, and the receiver checks
  // that it got the whole payload.
  std::vector<std::byte> data(sizeof(uint32_t) + payload.size());
  const auto size = static_cast<uint32_t>(payload.size());
  std::memcpy(data.data(), &size, sizeof(size));
  if (!payload.empty()) std::memcpy(data.data() + sizeof(size), payload.data(), payload.size());

  iovec iov{data.data(), data.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  for (;;) {
    if (::sendmsg(socket, &msg, MSG_NOSIGNAL) >= 0) return;
    if (errno != EINTR) throw_errno("sendmsg with SCM_RIGHTS (fd " + std::to_string(fd) + ")");
  }
}

ReceivedFd receive_fd(int socket, std::chrono::milliseconds timeout) {
  if (!wait_for(socket, POLLIN, timeout, "receive_fd"))
    throw std::runtime_error("railyard fd passing: no descriptor arrived within " + std::to_string(timeout.count()) +
                             " ms");
  std::vector<std::byte> data(sizeof(uint32_t) + kMaxFdPayloadBytes);
  iovec iov{data.data(), data.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) throw_errno("recvmsg");

  // Take ownership of any descriptor first, so that no error path below leaks it.
  ReceivedFd out;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
      out.fd.reset(fd);
    }
  }
  if (n == 0) throw std::runtime_error("railyard fd passing: the peer closed the socket before sending a descriptor");
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
    throw std::runtime_error("railyard fd passing: message truncated (payload over kMaxFdPayloadBytes, or more than "
                             "one descriptor)");
  if (!out.fd.valid())
    throw std::runtime_error("railyard fd passing: message of " + std::to_string(n) +
                             " bytes carried no file descriptor (was it sent with send_fd?)");
  uint32_t size = 0;
  if (static_cast<std::size_t>(n) < sizeof(size) ||
      (std::memcpy(&size, data.data(), sizeof(size)), static_cast<std::size_t>(n) != sizeof(size) + size))
    throw std::runtime_error("railyard fd passing: malformed message of " + std::to_string(n) +
                             " bytes (expected a 4-byte length prefix and that many payload bytes)");
  out.payload.assign(data.begin() + sizeof(size), data.begin() + n);
  return out;
}

}  // namespace railyard::runtime
