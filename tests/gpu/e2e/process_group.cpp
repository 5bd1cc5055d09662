// The socket-pair hub bootstrap of process_group.hpp.
#include "process_group.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>

namespace railyard::e2e {
namespace {

// Reads or writes exactly `bytes`; false on EOF or error.
bool write_all(int fd, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n, bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, std::size_t bytes) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n, bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

// A rank's side: one socket to the hub. The hub waits as long as its timeout; the
// rank waits for the hub without one (the hub closing the socket ends the wait).
class ProcessBootstrap final : public runtime::Bootstrap {
 public:
  ProcessBootstrap(int rank, int size, int fd) : rank_(rank), size_(size), fd_(fd) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override {
    const std::byte one{1};
    std::vector<std::byte> all(static_cast<std::size_t>(size_));
    allgather_same_size(std::span<const std::byte>(&one, 1), all);
  }

 protected:
  void allgather_same_size(std::span<const std::byte> mine, std::span<std::byte> all) override {
    const uint64_t bytes = mine.size();
    if (!write_all(fd_, &bytes, sizeof(bytes)) || !write_all(fd_, mine.data(), mine.size()) ||
        !read_all(fd_, all.data(), all.size()))
      throw runtime::BootstrapError("railyard e2e bootstrap: rank " + std::to_string(rank_) +
                                    " lost the hub (another rank exited or timed out)");
  }

 private:
  int rank_, size_, fd_;
};

// Waits until `fd` is readable; false on timeout.
bool wait_readable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
    if (n < 0 && errno == EINTR) continue;
    return n > 0;
  }
}

// The parent's relay: rounds until some rank closes its socket (normally: all exit
// after their last round) or a round times out.
void relay(const std::vector<int>& fds, std::chrono::milliseconds timeout) {
  const std::size_t n = fds.size();
  for (;;) {
    std::vector<uint8_t> all;
    uint64_t round_bytes = 0;
    for (std::size_t r = 0; r < n; ++r) {
      uint64_t bytes = 0;
      if (!wait_readable(fds[r], timeout)) {
        std::fprintf(stderr, "railyard e2e bootstrap: rank %zu did not join a round within %lld ms\n", r,
                     static_cast<long long>(timeout.count()));
        return;
      }
      if (!read_all(fds[r], &bytes, sizeof(bytes))) return;  // rank r exited
      if (r == 0) round_bytes = bytes, all.resize(n * bytes);
      if (bytes != round_bytes) {
        std::fprintf(stderr, "railyard e2e bootstrap: rank %zu sent %llu bytes, rank 0 %llu\n", r,
                     static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(round_bytes));
        return;
      }
      if (!read_all(fds[r], all.data() + r * bytes, bytes)) return;
    }
    for (std::size_t r = 0; r < n; ++r)
      if (!write_all(fds[r], all.data(), all.size())) return;
  }
}

// Waits up to `timeout` for `pid` to exit; false if it is still running.
bool wait_exit(pid_t pid, std::chrono::milliseconds timeout, int* status) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const pid_t got = ::waitpid(pid, status, WNOHANG);
    if (got == pid) return true;
    if (got < 0 && errno != EINTR) return true;  // not our child any more
    if (std::chrono::steady_clock::now() > deadline) return false;
    ::usleep(10000);
  }
}

}  // namespace

std::string ProcessExit::describe() const {
  return "rank " + std::to_string(rank) +
         (signal ? ": killed by signal " + std::to_string(signal) : ": exit " + std::to_string(exit_code));
}

std::vector<ProcessExit> run_processes(int num_ranks, std::chrono::milliseconds timeout,
                                       const std::function<int(int rank, runtime::Bootstrap& bootstrap)>& fn) {
  std::vector<int> hub_fds, rank_fds;
  for (int r = 0; r < num_ranks; ++r) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
      throw std::runtime_error(std::string("railyard e2e: socketpair failed: ") + std::strerror(errno));
    hub_fds.push_back(pair[0]), rank_fds.push_back(pair[1]);
  }
  std::fflush(stdout), std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < num_ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("railyard e2e: fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      for (int q = 0; q < num_ranks; ++q) {
        ::close(hub_fds[q]);
        if (q != r) ::close(rank_fds[q]);
      }
      int code = 1;
      try {
        ProcessBootstrap bootstrap(r, num_ranks, rank_fds[r]);
        code = fn(r, bootstrap);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(stdout), std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  for (int fd : rank_fds) ::close(fd);
  relay(hub_fds, timeout);
  for (int fd : hub_fds) ::close(fd);  // ranks still in a round get EOF
  std::vector<ProcessExit> exits;
  for (int r = 0; r < num_ranks; ++r) {
    int status = 0;
    if (!wait_exit(pids[r], timeout, &status)) {
      std::fprintf(stderr, "railyard e2e: rank %d did not exit within %lld ms of the group's end; killing it\n", r,
                   static_cast<long long>(timeout.count()));
      ::kill(pids[r], SIGKILL);
      while (::waitpid(pids[r], &status, 0) < 0 && errno == EINTR) {
      }
    }
    ProcessExit e{.rank = r};
    if (WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
    exits.push_back(e);
  }
  return exits;
}

}  // namespace railyard::e2e
