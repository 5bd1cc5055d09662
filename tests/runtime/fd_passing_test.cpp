// runtime/fd_passing: descriptors really cross process boundaries (fork), over a
// socket pair and over the abstract-namespace rendezvous, and misuse fails clearly.
#include "railyard/runtime/fd_passing.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace railyard::runtime {
namespace {

using namespace std::chrono_literals;

UniqueFd memfd_with(const std::string& text) {
  UniqueFd fd(::memfd_create("railyard-fd-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::pwrite(fd.get(), text.data(), text.size(), 0), static_cast<ssize_t>(text.size()));
  return fd;
}

std::string read_all(int fd, std::size_t bytes) {
  std::string out(bytes, '\0');
  const ssize_t n = ::pread(fd, out.data(), bytes, 0);
  out.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return out;
}

std::span<const std::byte> as_bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

// Waits for the child and returns its exit code (-1 if it did not exit normally).
int join(pid_t pid) {
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The child reports through its exit code: 0 ok, otherwise which check failed. It
// never returns into the test framework (_exit).
TEST(FdPassing, ChildProcessReceivesTheDescriptorAndWritesThroughIt) {
  SocketPair sockets = make_socket_pair();
  UniqueFd memfd = memfd_with("railyard");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    sockets.first.reset();
    int code = 0;
    try {
      ReceivedFd got = receive_fd(sockets.second.get(), 10s);
      const std::string payload(reinterpret_cast<const char*>(got.payload.data()), got.payload.size());
      if (payload != "handle-bytes") code = 2;
      else if (read_all(got.fd.get(), 8) != "railyard") code = 3;
      else if (::pwrite(got.fd.get(), "CHILD", 5, 0) != 5) code = 4;
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  sockets.second.reset();
  send_fd(sockets.first.get(), memfd.get(), as_bytes("handle-bytes"));
  EXPECT_EQ(join(pid), 0) << "1: receive threw, 2: payload, 3: content, 4: write";
  // The child wrote through its duplicate of the descriptor: one open file, two processes.
  EXPECT_EQ(read_all(memfd.get(), 8), "CHILDard");
}

TEST(FdPassing, RendezvousByAbstractNameAcrossProcesses) {
  const std::string name = "railyard-fd-test-" + std::to_string(::getpid());
  UniqueFd listener = listen_unix(name);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    listener.reset();
    int code = 0;
    try {
      UniqueFd conn = connect_unix(name, 10s);
      UniqueFd memfd = memfd_with("from the child");
      send_fd(conn.get(), memfd.get(), as_bytes("rank 1"));
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  UniqueFd conn = accept_unix(listener.get(), 10s);
  ReceivedFd got = receive_fd(conn.get(), 10s);
  EXPECT_EQ(join(pid), 0);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.payload.data()), got.payload.size()), "rank 1");
  // The sender has exited and closed its copy; ours keeps the file alive.
  EXPECT_EQ(read_all(got.fd.get(), 14), "from the child");
}

TEST(FdPassing, EmptyPayloadRoundTrips) {
  SocketPair sockets = make_socket_pair();
  UniqueFd memfd = memfd_with("x");
  send_fd(sockets.first.get(), memfd.get());
  ReceivedFd got = receive_fd(sockets.second.get(), 1s);
  EXPECT_TRUE(got.fd.valid());
  EXPECT_TRUE(got.payload.empty());
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

TEST(FdPassing, MisuseFailsWithClearMessages) {
  {
    SocketPair sockets = make_socket_pair();
    const char data[8] = "no fd";
    ASSERT_EQ(::send(sockets.first.get(), data, sizeof(data), 0), static_cast<ssize_t>(sizeof(data)));
    EXPECT_NE(error_of([&] { receive_fd(sockets.second.get(), 1s); }).find("carried no file descriptor"),
              std::string::npos);
  }
  {
    SocketPair sockets = make_socket_pair();
    sockets.first.reset();
    EXPECT_NE(error_of([&] { receive_fd(sockets.second.get(), 1s); }).find("closed the socket"), std::string::npos);
  }
  {
    SocketPair sockets = make_socket_pair();
    EXPECT_NE(error_of([&] { receive_fd(sockets.second.get(), 20ms); }).find("no descriptor arrived within 20 ms"),
              std::string::npos);
  }
  EXPECT_NE(error_of([] { connect_unix("railyard-nobody-listens-here", 30ms); }).find("nobody listened"),
            std::string::npos);
  {
    SocketPair sockets = make_socket_pair();
    const std::string big(kMaxFdPayloadBytes + 1, 'x');
    EXPECT_NE(error_of([&] { send_fd(sockets.first.get(), 0, as_bytes(big)); }).find("exceeds kMaxFdPayloadBytes"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace railyard::runtime
