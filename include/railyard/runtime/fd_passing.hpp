// Railyard runtime: passing POSIX file descriptors between processes on one host.
//
// CUDA VMM memory exported with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR is an fd, and
// an fd number means nothing in another process: the kernel has to duplicate it into
// the receiver, which only a Unix-domain socket message with SCM_RIGHTS does. The
// sockets here are SOCK_SEQPACKET so that one send is one receive (the payload never
// arrives split from its descriptor). Host only; no CUDA, no simulator.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace railyard::runtime {

// Owns one file descriptor and closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SocketPair {
  UniqueFd first;
  UniqueFd second;
};
// Two connected SOCK_SEQPACKET Unix sockets (survive fork; one end per process).
SocketPair make_socket_pair();

// Rendezvous by name, exchanged over the bootstrap. A name is either abstract (Linux's
// abstract socket namespace: nothing on the file system to clean up after a crash,
// but visible only within one network namespace) or, when it starts with '/', a
// filesystem path (visible to every process that sees the directory, across network
// namespaces: one container per GPU; the listener's owner unlinks it). At most 107 bytes.
UniqueFd listen_unix(std::string_view name);
// Waits up to `timeout` for a peer to connect.
UniqueFd accept_unix(int listener, std::chrono::milliseconds timeout);
// Retries until the listener exists or `timeout` passes (peers start in any order).
UniqueFd connect_unix(std::string_view name, std::chrono::milliseconds timeout);

// This process's network namespace (the inode of /proc/self/ns/net); 0 where unknown.
uint64_t network_namespace_id();

// Sends one message carrying `fd` (duplicated into the receiver by the kernel) and
// `payload` (at most kMaxFdPayloadBytes; say what the fd is, e.g. a handle's bytes).
inline constexpr std::size_t kMaxFdPayloadBytes = 4096;
void send_fd(int socket, int fd, std::span<const std::byte> payload = {});

struct ReceivedFd {
  UniqueFd fd;
  std::vector<std::byte> payload;
};
// Blocks up to `timeout` for one message from send_fd. Throws std::runtime_error when
// the message carries no descriptor, was truncated, or the peer closed the socket.
ReceivedFd receive_fd(int socket, std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace railyard::runtime
