// The registered buffer's two exchanges (src/runtime/registered_buffer_exchange.hpp),
// on ranks that are plain threads (no simulator, no GPU):
//  - gather_failures: no failure costs one round and returns nothing; failures on some
//    ranks come back identical on every rank, and the error names the earliest step,
//    every failed rank and its message;
//  - exchange_fds: every rank of a 72-rank domain (an NVL72, beyond the listen
//    backlog) receives every peer's descriptor, each a duplicate of the sender's memfd;
//    a stray connection with the wrong token is ignored; a silent peer is a timeout
//    naming it.
#include "src/runtime/registered_buffer_exchange.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <thread>

#include "registered_buffer_test_util.hpp"

namespace railyard::runtime {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank, bootstrap) on n plain threads.
void on_threads(int n, const std::function<void(int rank, Bootstrap& boot)>& fn) {
  auto group = InProcessGroup::create({.num_ranks = n, .timeout = 20s});
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto boot = group->bootstrap(r);
      fn(r, *boot);
    });
  for (auto& t : threads) t.join();
}

TEST(RegisteredBufferExchange, GatherFailures) {
  constexpr int n = 4;
  std::mutex mutex;
  std::vector<std::vector<detail::RankFailure>> seen(n);
  std::vector<std::string> messages(n);
  on_threads(n, [&](int rank, Bootstrap& boot) {
    EXPECT_TRUE(detail::gather_failures(boot, std::nullopt).empty());
    std::optional<detail::StepFailure> mine;
    if (rank == 3) mine = detail::StepFailure{RegisteredBufferStep::Allocate, "out of memory"};
    if (rank == 1) mine = detail::StepFailure{RegisteredBufferStep::ZeroFill, std::string(5000, 'x')};
    auto failures = detail::gather_failures(boot, mine);
    const std::string message = detail::failures_error(failures, rank).what();
    std::lock_guard lock(mutex);
    seen[rank] = std::move(failures);
    messages[rank] = message;
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(seen[r].size(), 2u);
    EXPECT_EQ(seen[r][0].rank, 1);
    EXPECT_EQ(seen[r][0].step, RegisteredBufferStep::ZeroFill);
    EXPECT_EQ(seen[r][0].message, std::string(2048, 'x')) << "long messages are cut, not dropped";
    EXPECT_EQ(seen[r][1].rank, 3);
    EXPECT_EQ(seen[r][1].message, "out of memory");
    EXPECT_HAS(messages[r], "on rank 3 at step 'allocate': out of memory");
    EXPECT_HAS(messages[r], "on rank 1 at step 'zero_fill': xxx");
    EXPECT_HAS(messages[r], "(seen by rank " + std::to_string(r) + ";");
  }
  std::vector<detail::RankFailure> f = {{1, RegisteredBufferStep::Import, "a"},
                                        {2, RegisteredBufferStep::Allocate, "b"}};
  const RegisteredBufferError e = detail::failures_error(f, 0);
  EXPECT_EQ(e.step(), RegisteredBufferStep::Allocate) << "the earliest step";
  EXPECT_EQ(e.failed_ranks(), (std::vector<int>{1, 2}));
}

// An anonymous file holding `text`: a descriptor whose identity the receiver can check.
UniqueFd memfd_with(const std::string& text) {
  UniqueFd fd(::memfd_create("railyard-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::write(fd.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  return fd;
}
std::string read_all(int fd) {
  char buf[64] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

struct NameRecord {
  char name[detail::kSocketNameBytes];
  uint64_t token;
};

// Every rank listens, allgathers (name, token), then exchanges with every other rank.
std::map<int, UniqueFd> exchange_on(int rank, Bootstrap& boot, int fd, std::chrono::milliseconds timeout,
                                    const std::vector<int>& peers) {
  detail::FdListener listener = detail::listen_for_fds(rank, "");
  NameRecord mine{};
  std::snprintf(mine.name, sizeof(mine.name), "%s", listener.name.c_str());
  mine.token = listener.token;
  const std::vector<NameRecord> all = allgather_value(boot, mine);
  detail::FdExchange x{.rank = rank, .listener = listener.socket.get(), .token = listener.token, .fd = fd,
                       .peers = peers, .timeout = timeout};
  for (const NameRecord& r : all) {
    x.socket_names.emplace_back(r.name);
    x.tokens.push_back(r.token);
  }
  return detail::exchange_fds(x);
}

TEST(RegisteredBufferExchange, SeventyTwoRanksExchangeDescriptors) {
  constexpr int n = 72;
  std::atomic<int> checked{0};
  on_threads(n, [&](int rank, Bootstrap& boot) {
    const UniqueFd mine = memfd_with("memory of rank " + std::to_string(rank));
    std::vector<int> peers;
    for (int p = 0; p < n; ++p)
      if (p != rank) peers.push_back(p);
    const std::map<int, UniqueFd> got = exchange_on(rank, boot, mine.get(), 30s, peers);
    ASSERT_EQ(got.size(), static_cast<std::size_t>(n - 1));
    for (const auto& [peer, fd] : got) {
      EXPECT_EQ(read_all(fd.get()), "memory of rank " + std::to_string(peer)) << "rank " << rank;
      ++checked;
    }
    boot.barrier();  // keep every descriptor open until all are read
  });
  EXPECT_EQ(checked.load(), n * (n - 1));
}

TEST(RegisteredBufferExchange, StrayConnectionIsIgnoredAndSilentPeerTimesOut) {
  std::string error;
  on_threads(2, [&](int rank, Bootstrap& boot) {
    const UniqueFd mine = memfd_with("rank " + std::to_string(rank));
    if (rank == 1) {
      // Rank 1 listens (so rank 0's send succeeds) but only ever sends a message with
      // the wrong token, as a stranger on the same abstract name would.
      detail::FdListener listener = detail::listen_for_fds(rank, "");
      NameRecord rec{};
      std::snprintf(rec.name, sizeof(rec.name), "%s", listener.name.c_str());
      rec.token = listener.token;
      const std::vector<NameRecord> all = allgather_value(boot, rec);
      const UniqueFd c = connect_unix(all[0].name, 5s);
      const struct {
        uint64_t token;
        int32_t sender, reserved;
      } wrong{all[0].token + 1, 1, 0};
      send_fd(c.get(), mine.get(), std::as_bytes(std::span(&wrong, 1)));
      boot.barrier();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      exchange_on(rank, boot, mine.get(), 300ms, {1});
      ADD_FAILURE() << "rank 1 never sent a valid descriptor";
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    boot.barrier();
  });
  EXPECT_HAS(error, "railyard fd exchange (rank 0): no descriptor from rank(s) 1 within 300 ms");
}

}  // namespace
}  // namespace railyard::runtime

namespace railyard::runtime {
namespace {

// The socket directory (RegisteredBufferOptions::fd_socket_dir, RAILYARD_FD_SOCKET_DIR):
// a socket file there, removed with its listener; a relative or too long directory is
// refused naming both settings.
TEST(RegisteredBufferExchange, SocketFilesInTheSocketDirectory) {
  char dir_template[] = "/tmp/railyard-sockets-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  {
    const detail::FdListener listener = detail::listen_for_fds(3, dir);
    EXPECT_EQ(listener.name.rfind(dir + "/railyard-rb-", 0), 0u) << listener.name;
    EXPECT_EQ(::access(listener.name.c_str(), F_OK), 0) << listener.name;
    const UniqueFd c = connect_unix(listener.name, 1s);
    EXPECT_TRUE(c.valid());
  }
  EXPECT_EQ(::rmdir(dir.c_str()), 0) << "the socket file must be gone with its listener";
  const auto error = [](const std::string& socket_dir) {
    try {
      detail::listen_for_fds(0, socket_dir);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error("shared/sockets"),
            "railyard RegisteredBuffer: the fd socket directory 'shared/sockets' (RegisteredBufferOptions::fd_socket_dir "
            "or RAILYARD_FD_SOCKET_DIR) is not an absolute path; expected one every rank's container sees at the same "
            "path");
  const std::string long_dir = "/" + std::string(90, 'd');
  EXPECT_NE(error(long_dir).find("railyard RegisteredBuffer: the fd socket directory '" + long_dir +
                                 "' is too long: the socket path '"),
            std::string::npos);
  EXPECT_NE(error(long_dir).find("; expected at most 107 (a Unix socket path's limit)"), std::string::npos);
  ::setenv("RAILYARD_FD_SOCKET_DIR", "/from/the/environment", 1);
  EXPECT_EQ(detail::fd_socket_dir(""), "/from/the/environment");
  EXPECT_EQ(detail::fd_socket_dir("/from/the/option"), "/from/the/option");
  ::unsetenv("RAILYARD_FD_SOCKET_DIR");
  EXPECT_EQ(detail::fd_socket_dir(""), "");
}

}  // namespace
}  // namespace railyard::runtime
