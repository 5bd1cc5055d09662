// Railyard simulator internals: the timed mode's resources and costs. Not a public
// header. docs/simulator.md ("Timed mode") describes the model; the constants are the
// devices' TimingModel (include/railyard/sim/timing.hpp).
//
// Every thread has a clock (Fiber::clock_ns). An operation first issues on its SM,
// then passes the resources it uses: a Pipe is one resource of fixed bandwidth that
// serves transfers in the order they reach it, so its total throughput is exact and
// each transfer's finish time includes the queue before it. A load returns at the
// latest of its pipes' finish times plus its latency; a store is posted (the thread
// goes on) and becomes visible at that time, which fences and release stores wait for.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "railyard/sim/device.hpp"
#include "railyard/sim/sim.hpp"

namespace railyard::sim::detail {

struct Fiber;
struct Block;

// A resource of fixed bandwidth, serving transfers first come, first served.
struct Pipe {
  double ns_per_byte = 0;
  double free_at = 0;
  double busy_ns = 0;  // since the last reset_busy()
  // A transfer of `bytes` ready at `start`: when its last byte has passed.
  double pass(double start, double bytes) {
    busy_ns += bytes * ns_per_byte;
    free_at = std::max(start, free_at) + bytes * ns_per_byte;
    return free_at;
  }
};

// Where an access goes: this block's shared memory, its own device's memory, or
// another device's (a peer's over NVLink, or pinned host memory: owner -1).
struct Target {
  enum class Kind : uint8_t { Shared, Local, Remote };
  Kind kind = Kind::Local;
  int owner = 0;
  uintptr_t sim_offset = 0;  // host address + sim_offset: the address on a GPU (Allocation::sim_base)
};

class Timing {
 public:
  bool enabled() const { return enabled_; }
  void reset(bool enabled);
  void add_device(const DeviceProps& props);
  const TimingModel& model(int device) const { return devices_[device].model; }
  double cycles_to_ns(int device, double cycles) const { return cycles / devices_[device].model.sm_clock_ghz; }
  uint64_t ns_to_cycles(int device, double ns) const {
    return static_cast<uint64_t>(ns * devices_[device].model.sm_clock_ghz);
  }

  // A block starts on a free SM of its device (its issue, shared-memory and TMA pipes).
  int take_sm(int device);
  void release_sm(int device, int sm);

  // Each pipe's busy time (sim::busy_time()), and a new count from zero.
  std::vector<BusyTime> busy() const;
  void reset_busy();  // and the wait profile
  // A thread of `device` waited `ns` at `loc` on `what` (index, value) (sim::wait_profile,
  // reset with the busy times).
  struct Waited {
    const char* what;
    int device;
    int64_t index, value;
  };
  void waited(const Waited& w, device::Loc loc, double ns);
  std::vector<WaitTotal> wait_profile() const;

  // Costs to the calling thread f (of block b on SM b->sm).
  // `acquire`: an ld.acquire (of scope `sys` or narrower above the block).
  void load(Fiber* f, Target where, const void* ptr, std::size_t bytes, bool strong, bool acquire, bool sys);
  // A release (store or atomic) of scope 0 block, 1 device, 2 system: above the block,
  // first waits until the thread's posted stores are visible (system: to other devices
  // too) and costs its fence's time; then the thread catches up (Engine::catch_up) and
  // the access issues.
  void release(Fiber* f, int scope);
  void store(Fiber* f, Target where, const void* ptr, std::size_t bytes, bool strong);
  void atomic(Fiber* f, Target where, const void* ptr, std::size_t bytes);
  void fence(Fiber* f, int scope);  // 0 block, 1 device, 2 system
  void cycles(Fiber* f, double n);  // a fixed cost in SM cycles
  // Bulk copies: the times their reads and writes complete.
  double bulk_g2s(Fiber* f, Target source, std::size_t bytes);
  struct S2G {
    double read_done, write_done;
  };
  S2G bulk_s2g(Fiber* f, Target destination, std::size_t bytes);

  // The simulated NICs (sim::nic_pass, doorbell_rung_ns, take_doorbell): their pipes,
  // and when each registered doorbell was first stored to since its agent took it.
  double nic_pass(int device, NicPipe pipe, double ready_ns, std::size_t bytes);
  void add_doorbell(const void* ptr, std::size_t bytes);
  void remove_doorbell(const void* ptr);
  double doorbell_rung_ns(const void* ptr) const;
  void take_doorbell(const void* ptr);
  // How many stores have hit a doorbell so far: what an agent's next event may follow.
  uint64_t doorbell_stores() const { return doorbell_stores_; }

 private:
  struct Sm {
    Pipe issue, smem, tma;
    std::vector<uintptr_t> l1;  // by set: the line held (its address / 128 + 1), 0: none
  };
  struct Device {
    TimingModel model;
    Pipe hbm, nvlink_out, nvlink_in;
    Pipe nic_tx, nic_rx, nic_pcie;
    std::vector<Sm> sms;
    std::vector<int> free_sms;
  };
  // The thread's operation issues on its SM: the time it leaves the issue pipe.
  double issue(Fiber* f);
  // Bytes moved between device `from` (reading) and device `to` (writing) memory, one
  // of them the thread's: the time the last byte has passed every pipe on the way.
  double move(int self, Target where, double start, std::size_t bytes, bool to_target);
  // Bytes through the thread's SM's shared memory from `start`, plus `latencies` times
  // its latency.
  double through_smem(Fiber* f, double start, std::size_t bytes, double latencies);
  // A release or fence: the thread waits until its posted stores (`remote`: to other
  // devices too) are visible.
  static void wait_for_stores(Fiber* f, bool remote);
  // Whether the thread's SM holds ptr's line in L1, which it fills on a miss.
  bool l1_hit(Fiber* f, uintptr_t sim_address);
  static void empty_l1(Sm& sm);
  Sm& sm_of(const Fiber* f);  // the SM the thread's block runs on
  // When the last strong store to `ptr` becomes visible (0: none in flight).
  double in_flight_until(const void* ptr) const;
  struct Doorbell {
    uintptr_t end = 0;
    double rung_ns = kNoEvent;  // the first store its agent has not taken
  };
  // The doorbell overlapping [ptr, ptr + bytes), if any.
  Doorbell* find_doorbell(const void* ptr, std::size_t bytes);

  bool enabled_ = false;
  std::vector<Device> devices_;
  // By label and line (string literals: one text may have several addresses).
  std::map<std::tuple<const char*, const char*, uint_least32_t>, WaitTotal> waits_;
  // Strong stores in flight: when each address's last one becomes visible.
  std::unordered_map<uintptr_t, double> visible_at_;
  uint64_t doorbell_stores_ = 0;
  std::map<uintptr_t, Doorbell> doorbells_;  // by start
};

}  // namespace railyard::sim::detail
