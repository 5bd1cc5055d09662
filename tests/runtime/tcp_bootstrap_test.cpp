// The TCP bootstrap (runtime/tcp_bootstrap.hpp) between threads of this process over
// the loopback interface: allgather and barrier in rank order whichever rank starts
// first; a rank that never comes, a rank 0 that never listens and a rank that leaves
// are errors naming them within the timeout; bad options name themselves.
#include "railyard/runtime/tcp_bootstrap.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace railyard::runtime {
namespace {

using namespace std::chrono_literals;

// A port nothing listens on right now (bound, read back, closed).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST(TcpBootstrap, ThreeRanksAllgatherInRankOrderWhicheverStartsFirst) {
  const int port = free_port(), n = 3;
  std::vector<std::vector<std::byte>> got(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = n - 1; r >= 0; --r) {  // rank 0 last: the others retry until it listens
    threads.emplace_back([&, r] {
      try {
        TcpBootstrap b({.host = "localhost", .port = port, .rank = r, .size = n, .timeout = 20s});
        const std::vector<std::byte> mine(static_cast<std::size_t>(5), std::byte(0x10 + r));
        got[static_cast<std::size_t>(r)] = b.allgather(mine);
        b.barrier();
        // Different byte counts: every rank gets the same error, none hangs.
        const std::vector<std::byte> uneven(static_cast<std::size_t>(r + 1), std::byte{0});
        errors[static_cast<std::size_t>(r)] = error_of([&] { b.allgather(uneven); });
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = std::string("unexpected: ") + e.what();
      }
    });
    if (r == 1) std::this_thread::sleep_for(100ms);
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(got[static_cast<std::size_t>(r)].size(), 15u) << "rank " << r << ": " << errors[static_cast<std::size_t>(r)];
    for (int from = 0; from < n; ++from)
      for (int i = 0; i < 5; ++i)
        EXPECT_EQ(got[static_cast<std::size_t>(r)][static_cast<std::size_t>(from * 5 + i)], std::byte(0x10 + from));
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("1 bytes on rank 0; 2 bytes on rank 1; 3 bytes on rank 2"), std::string::npos)
        << "rank " << r << ": " << errors[static_cast<std::size_t>(r)];
  }
}

TEST(TcpBootstrap, RankThatNeverComesIsAnErrorWithinTheTimeout) {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { TcpBootstrap b({.port = port, .rank = 0, .size = 2, .timeout = 300ms}); });
  EXPECT_NE(e.find("only 0 of 1 ranks connected to port " + std::to_string(port)), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(TcpBootstrap, RankZeroThatNeverListensIsNamed) {
  const int port = free_port();
  const std::string e = error_of([&] { TcpBootstrap b({.port = port, .rank = 1, .size = 2, .timeout = 300ms}); });
  EXPECT_NE(e.find("could not connect to rank 0 at 127.0.0.1:" + std::to_string(port)), std::string::npos) << e;
}

TEST(TcpBootstrap, RankThatLeavesIsNamed) {
  const int port = free_port();
  std::unique_ptr<TcpBootstrap> one;
  std::thread t([&] { one = std::make_unique<TcpBootstrap>(TcpBootstrapOptions{.port = port, .rank = 1, .size = 2, .timeout = 10s}); });
  TcpBootstrap zero({.port = port, .rank = 0, .size = 2, .timeout = 10s});
  t.join();
  one.reset();
  const std::string e = error_of([&] { zero.barrier(); });
  EXPECT_NE(e.find("from rank 1: it closed the connection"), std::string::npos) << e;
}

TEST(TcpBootstrap, BadOptionsNameThemselves) {
  EXPECT_NE(error_of([] { TcpBootstrap b({.port = 5000, .rank = 2, .size = 2}); }).find("rank is 2; expected 0..1"),
            std::string::npos);
  EXPECT_NE(error_of([] { TcpBootstrap b({.port = 0, .rank = 0, .size = 2}); }).find("port is 0; expected 1..65535"),
            std::string::npos);
  EXPECT_NE(error_of([] { TcpBootstrap b({.port = 5000, .rank = 0, .size = 0}); }).find("size is 0"),
            std::string::npos);
}

}  // namespace
}  // namespace railyard::runtime
