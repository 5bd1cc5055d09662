// Railyard runtime: bootstrap, the host-side collectives a group of ranks needs to
// set itself up (exchange configurations, memory handles, topology). Byte-oriented
// and slow by design: it runs at initialisation, never on the dispatch/combine path.
//
// Implementations:
//  - InProcessGroup: ranks are threads of one process (the simulator's run_ranks).
//    The generic part knows nothing of the simulator; sim_bootstrap.hpp makes a
//    group whose waits let the simulator's engine run.
//  - CallbackBootstrap: two std::function slots the Python layer fills from
//    torch.distributed.
//  - NcclBootstrap (nccl_bootstrap.hpp, when NCCL is found): over a caller's ncclComm_t.
//
// Every allgather first exchanges the byte counts, so ranks that pass different sizes
// all get the same BootstrapError instead of a hang or a torn buffer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace railyard::runtime {

class BootstrapError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Every rank's `mine`, in rank order: size() * mine.size() bytes. Throws
  // BootstrapError on every rank when the ranks passed different byte counts.
  std::vector<std::byte> allgather(std::span<const std::byte> mine);
  virtual void barrier() = 0;

 protected:
  // The transport's allgather, called only once every rank is known to pass
  // mine.size() bytes; `all` has size() * mine.size() bytes.
  virtual void allgather_same_size(std::span<const std::byte> mine, std::span<std::byte> all) = 0;
  // A barrier for transports that have none of their own: an allgather of one byte.
  void barrier_by_allgather();
};

// Allgathers one trivially copyable value per rank.
template <class T>
std::vector<T> allgather_value(Bootstrap& bootstrap, const T& value) {
  static_assert(std::is_trivially_copyable_v<T>);
  const std::vector<std::byte> bytes = bootstrap.allgather(std::as_bytes(std::span<const T, 1>(&value, 1)));
  std::vector<T> out(static_cast<std::size_t>(bootstrap.size()));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// One failed rank's outcome of a step every rank takes (gather_failures).
struct RankFailure {
  int rank = -1;
  int32_t code = 0;  // the caller's step code, never 0
  std::string message;
};

// Collective: after a step that can fail on one rank alone, every rank passes its own
// outcome (code 0: success; otherwise the caller's step code and a message) and gets
// the failed ranks' outcomes in rank order, identical on every rank, so that all of
// them throw the same error instead of leaving peers waiting in the next collective.
// One 8-byte allgather when all succeeded, a second one carrying the messages
// (each cut at 2048 bytes) otherwise.
std::vector<RankFailure> gather_failures(Bootstrap& bootstrap, int32_t code, const std::string& message);

// ---- in-process ---------------------------------------------------------------------
// The shared state of a group of ranks that are threads of one process. Create it
// once, then give each rank thread its bootstrap(rank).
class InProcessGroup : public std::enable_shared_from_this<InProcessGroup> {
 public:
  // How a rank sleeps until another rank wakes it: a condition variable. The default
  // is std::condition_variable's; the simulator's (sim_bootstrap.hpp) lets the engine
  // run kernels while a rank waits and hands the waker's turn to the woken ranks.
  class Waiting {
   public:
    virtual ~Waiting() = default;
    // With `lock` (the group's mutex) held on entry and on return: sleeps until
    // ready() or the deadline; returns ready().
    virtual bool wait_until(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline,
                            const std::function<bool()>& ready) = 0;
    // With the group's mutex held, after a change the waiters wait for.
    virtual void notify_all() = 0;
  };

  struct Options {
    int num_ranks = 1;
    // A rank that waits longer for the others fails, naming the ranks that never
    // arrived, instead of hanging (a rank that threw before a collective, say).
    std::chrono::milliseconds timeout = std::chrono::minutes(5);
    // Null: std::condition_variable. One per group.
    std::unique_ptr<Waiting> waiting;
  };

  static std::shared_ptr<InProcessGroup> create(Options options);
  // The bootstrap rank `rank` uses; it keeps the group alive.
  std::unique_ptr<Bootstrap> bootstrap(int rank);
  int num_ranks() const { return options_.num_ranks; }

  // One round in which every rank deposits `mine` (each rank any byte count) and gets
  // every rank's bytes, in rank order. BootstrapError on timeout or a broken group.
  std::vector<std::vector<std::byte>> exchange(int rank, std::span<const std::byte> mine, const char* what);
  // Breaks the group: every rank waiting in it now, and every later round, throws
  // BootstrapError("<who> rank <rank> failed: <why>") at once instead of timing out.
  void abort(int rank, const std::string& why, const std::string& who = "railyard in-process bootstrap:");

 private:
  explicit InProcessGroup(Options options);
  // Waits (through options_.waiting) until `ready` holds; BootstrapError on timeout or
  // when another rank broke the group.
  void wait_until(int rank, const std::function<bool()>& ready, const char* what);
  std::string missing_ranks() const;  // callers hold mutex_

  Options options_;
  std::mutex mutex_;
  std::vector<std::vector<std::byte>> slots_;
  std::vector<bool> arrived_;
  int num_arrived_ = 0;
  int num_departed_ = 0;
  bool round_complete_ = false;  // every rank deposited; ranks are copying out
  uint64_t round_ = 0;
  std::string broken_;  // why the group is unusable, after a timeout or abort()
};

// ---- callback (torch.distributed from Python) ----------------------------------------
class CallbackBootstrap final : public Bootstrap {
 public:
  struct Callbacks {
    // Fills `all` (size * mine.size() bytes) with every rank's `mine`, in rank order.
    std::function<void(std::span<const std::byte> mine, std::span<std::byte> all)> allgather;
    std::function<void()> barrier;
  };
  struct Options {
    int rank = 0;
    int size = 1;
    Callbacks callbacks;
  };
  explicit CallbackBootstrap(Options options);

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  void barrier() override;

 protected:
  void allgather_same_size(std::span<const std::byte> mine, std::span<std::byte> all) override;

 private:
  Options options_;
};

// "0-2,5,7": a compact list of ranks for error messages.
std::string format_ranks(const std::vector<int>& ranks);

}  // namespace railyard::runtime
