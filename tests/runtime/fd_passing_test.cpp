// runtime/fd_passing: descriptors really cross process boundaries (fork), over a
// socket pair and over the abstract-namespace rendezvous, and misuse fails clearly.
#include "railyard/runtime/fd_passing.hpp"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <optional>
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

// One container per GPU puts ranks in different network namespaces. A child in its own
// (unshare(CLONE_NEWNET), which needs CAP_SYS_ADMIN) cannot reach the parent's abstract
// name, but reaches a socket file in a directory both see, and its descriptor arrives.
TEST(FdPassing, ASocketFileCrossesNetworkNamespacesWhereAnAbstractNameDoesNot) {
  char dir_template[] = "/tmp/railyard-fd-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string abstract_name = "railyard-fd-netns-test-" + std::to_string(::getpid());
  const std::string path = dir + "/socket";
  UniqueFd abstract_listener = listen_unix(abstract_name);
  UniqueFd path_listener = listen_unix(path);
  enum : int { kSent = 0, kAbstractReached = 1, kSendFailed = 2, kNoNamespace = 77 };
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    abstract_listener.reset();
    path_listener.reset();
    if (::unshare(CLONE_NEWNET) != 0) ::_exit(kNoNamespace);
    try {
      connect_unix(abstract_name, 200ms);
      ::_exit(kAbstractReached);
    } catch (const std::exception&) {
    }
    try {
      UniqueFd conn = connect_unix(path, 10s);
      UniqueFd memfd = memfd_with("from another network namespace");
      send_fd(conn.get(), memfd.get(), as_bytes("rank 1"));
    } catch (...) {
      ::_exit(kSendFailed);
    }
    ::_exit(kSent);
  }
  std::optional<ReceivedFd> got;
  std::string error;
  try {
    UniqueFd conn = accept_unix(path_listener.get(), 10s);
    got = receive_fd(conn.get(), 10s);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int code = join(pid);
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
  if (code == kNoNamespace) GTEST_SKIP() << "unshare(CLONE_NEWNET) is not permitted here (needs CAP_SYS_ADMIN)";
  ASSERT_EQ(code, kSent) << (code == kAbstractReached ? "the abstract name was reachable from another network namespace"
                                                       : "the child could not send through the socket file");
  ASSERT_TRUE(got.has_value()) << error;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got->payload.data()), got->payload.size()), "rank 1");
  EXPECT_EQ(read_all(got->fd.get(), 30), "from another network namespace");
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
  EXPECT_EQ(error_of([] { listen_unix("/" + std::string(107, 'x')); }),
            "railyard fd passing: socket path '/" + std::string(107, 'x') + "' is 108 bytes; expected 1..107");
  {
    SocketPair sockets = make_socket_pair();
    const std::string big(kMaxFdPayloadBytes + 1, 'x');
    EXPECT_NE(error_of([&] { send_fd(sockets.first.get(), 0, as_bytes(big)); }).find("exceeds kMaxFdPayloadBytes"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace railyard::runtime
