// The meeting point of one railyard.sim.run's rank threads (simulator flavour only):
// rounds in which every rank deposits bytes and takes everyone's. It serves the
// Buffers' bootstraps and railyard.sim's public barrier and collectives.
//
// Two properties a plain threading barrier lacks:
//  - a waiting rank is in a sim::HostWaitScope, so the simulator's engine runs the
//    kernels the other ranks launched (without it a rank waiting here stalls them all);
//  - abort(): a rank that fails marks the group broken and wakes every waiting peer,
//    which raises at once (and so does every later round) instead of timing out.
#pragma once

#include <railyard/runtime/bootstrap.hpp>
#include <railyard/runtime/sim_bootstrap.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace railyard::python {

class SimRendezvous {
 public:
  SimRendezvous(int num_ranks, std::chrono::milliseconds timeout)
      : n_(num_ranks), timeout_(timeout), slots_(static_cast<std::size_t>(num_ranks)),
        arrived_(static_cast<std::size_t>(num_ranks), false) {}

  int size() const { return n_; }

  // One round: every rank's bytes, in rank order (each rank may pass a different
  // count). BootstrapError when the group is broken or a peer does not come in time.
  std::vector<std::vector<std::byte>> exchange(int rank, std::span<const std::byte> mine, const char* what) {
    wait(rank, [&] { return !copying_; }, what);  // the previous round is still being read
    uint64_t round;
    {
      std::lock_guard lock(mutex_);
      round = round_;
      slots_[static_cast<std::size_t>(rank)].assign(mine.begin(), mine.end());
      arrived_[static_cast<std::size_t>(rank)] = true;
      if (++num_arrived_ == n_) {
        copying_ = true;
        cv_.notify_all();
      }
    }
    wait(rank, [&] { return copying_ && round_ == round; }, what);
    std::lock_guard lock(mutex_);
    std::vector<std::vector<std::byte>> all = slots_;
    if (++num_departed_ == n_) {
      num_arrived_ = num_departed_ = 0;
      copying_ = false;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ++round_;
      cv_.notify_all();
    }
    return all;
  }

  // Breaks the group: every rank waiting now, and every later round, raises `why`.
  void abort(int rank, const std::string& why) {
    std::lock_guard lock(mutex_);
    if (broken_.empty()) broken_ = "railyard.sim: rank " + std::to_string(rank) + " failed: " + why;
    cv_.notify_all();
  }

  // A runtime::Bootstrap of rank `rank` over this rendezvous (for a Buffer).
  std::unique_ptr<runtime::Bootstrap> bootstrap(std::shared_ptr<SimRendezvous> self, int rank) {
    runtime::CallbackBootstrap::Options o;
    o.rank = rank;
    o.size = n_;
    o.callbacks.allgather = [self, rank](std::span<const std::byte> mine, std::span<std::byte> all) {
      const auto parts = self->exchange(rank, mine, "a Buffer's allgather");
      for (std::size_t r = 0; r < parts.size(); ++r)
        if (!mine.empty()) std::memcpy(all.data() + r * mine.size(), parts[r].data(), mine.size());
    };
    o.callbacks.barrier = [self, rank] { self->exchange(rank, {}, "a Buffer's barrier"); };
    return std::make_unique<runtime::CallbackBootstrap>(std::move(o));
  }

 private:
  template <class Ready>
  void wait(int rank, const Ready& ready, const char* what) {
    {
      std::lock_guard lock(mutex_);
      if (!broken_.empty()) throw runtime::BootstrapError(broken_);
      if (ready()) return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    bool timed_out = false;
    // The lock is taken inside the wait scope and released before it ends.
    runtime::sim_blocking_wait()([&] {
      std::unique_lock lock(mutex_);
      timed_out = !cv_.wait_until(lock, deadline, [&] { return ready() || !broken_.empty(); });
    });
    std::lock_guard lock(mutex_);
    if (!broken_.empty()) throw runtime::BootstrapError(broken_);
    if (timed_out && !ready()) {
      std::vector<int> missing;
      for (int r = 0; r < n_; ++r)
        if (!arrived_[static_cast<std::size_t>(r)]) missing.push_back(r);
      broken_ = "railyard.sim: rank " + std::to_string(rank) + " waited " + std::to_string(timeout_.count()) +
                " ms in " + what + " for rank(s) " + runtime::format_ranks(missing) +
                ", which never arrived (railyard.sim.run(timeout=) sets the wait)";
      cv_.notify_all();
      throw runtime::BootstrapError(broken_);
    }
  }

  const int n_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::vector<std::byte>> slots_;
  std::vector<bool> arrived_;
  int num_arrived_ = 0;
  int num_departed_ = 0;
  bool copying_ = false;
  uint64_t round_ = 0;
  std::string broken_;
};

}  // namespace railyard::python
