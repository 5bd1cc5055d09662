// Railyard runtime: a Bootstrap over TCP, for ranks in different processes or on
// different hosts that have no torch.distributed or NCCL communicator yet (the RDMA
// bring-up probe across two nodes, docs/rdma-bringup.md). Rank 0 listens on `port`
// (every local address) and every other rank connects to `host:port`, retrying until
// the timeout, so the ranks may start in any order. Collectives go through rank 0: it
// receives every rank's bytes, in rank order, and sends the whole back.
//
// Every wait is bounded by the timeout; a peer that closes its connection or never
// comes is a BootstrapError naming the rank, the address and the call.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "railyard/runtime/bootstrap.hpp"

namespace railyard::runtime {

struct TcpBootstrapOptions {
  std::string host = "127.0.0.1";  // rank 0's address, as the other ranks reach it
  int port = 0;                    // rank 0's port (1..65535)
  int rank = 0;
  int size = 2;
  std::chrono::milliseconds timeout = std::chrono::minutes(2);
};

class TcpBootstrap final : public Bootstrap {
 public:
  // Connects the group; std::invalid_argument naming a bad option, BootstrapError
  // when the group cannot be formed in time.
  explicit TcpBootstrap(const TcpBootstrapOptions& options);
  ~TcpBootstrap() override;
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  void barrier() override;

 protected:
  void allgather_same_size(std::span<const std::byte> mine, std::span<std::byte> all) override;

 private:
  void send_all(int fd, const void* data, std::size_t bytes, int peer, const char* what);
  void receive_all(int fd, void* data, std::size_t bytes, int peer, const char* what);
  [[noreturn]] void fail(const std::string& what) const;

  TcpBootstrapOptions options_;
  std::chrono::steady_clock::time_point deadline_;  // of the call in progress
  std::vector<int> peers_;  // rank 0: the connection to rank r at [r] (-1 at [0]); others: [0] only
};

}  // namespace railyard::runtime
