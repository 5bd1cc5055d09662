// Railyard simulator: host-side API.
//
// The simulator runs unmodified CUDA kernel source on the CPU. Every CUDA thread is a
// fiber; one engine thread runs all fibers of all simulated devices, choosing the
// interleaving with a seeded random scheduler. See docs/simulator.md.
//
// Host threads and the engine take turns ("stop the world"): the engine runs only
// while every participating host thread is blocked in a simulator call
// (synchronize, run_ranks, HostCondition). So the interleaving is a function of the
// seed and of the host program's sequence of calls, and host code may read and
// write simulated memory directly whenever it holds the world (i.e. is not blocked).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <source_location>
#include <stdexcept>
#include <string>
#include <vector>

#include "railyard/sim/timing.hpp"

namespace railyard::sim {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr Dim3() = default;
  constexpr Dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr unsigned count() const { return x * y * z; }
};

// What a simulated device reports about itself. Presets match the datasheets of the
// GPUs Railyard targets (src/sim/gpu_*.cpp, with the sources of their timing
// constants); tests may shrink them (e.g. fewer SMs).
struct DeviceProps {
  std::string name = "sim-H100";
  int sm_count = 132;
  int cc_major = 9, cc_minor = 0;
  std::size_t smem_per_block_optin_bytes = 232448;  // 227 KiB usable per block
  std::size_t global_mem_bytes = std::size_t{80} << 30;
  int max_threads_per_block = 1024;
  int max_blocks_per_sm = 1;  // resident blocks per SM the simulator allows
  int nvlink_domain = 0;      // devices with the same id are peer-capable
  TimingModel timing;         // the timed mode's costs (Config::timed)
};
DeviceProps h100_props();
DeviceProps b200_props();

// SequentiallyConsistent: every access happens at its scheduling point, in one global
// order. Weak: the same execution, plus a happens-before race detector with scopes that
// reports every read a PTX weak-memory execution could make stale (a DataRace fault,
// naming the write's and the read's lines). docs/simulator.md, "Weak memory".
enum class MemoryModel { SequentiallyConsistent, Weak };

struct Config {
  uint64_t seed = 1;
  // When no fiber can make progress but some are polling or in a timed wait, the
  // virtual clock jumps and the waiters run again, so their cycle budgets can expire.
  // The jumps are idle_warp_cycles for the first max_idle_rounds, then double while
  // some waiter reads clock64() between jumps (it times its wait), up to a clock of
  // 2^62 cycles. After
  // max_idle_rounds jumps in which no waiter read the clock, or at that limit, the
  // simulator reports a hang. docs/simulator.md, "Hangs and bounded waits".
  uint64_t idle_warp_cycles = uint64_t{1} << 20;
  uint64_t max_idle_rounds = 64;
  std::size_t fiber_stack_bytes = 256 * 1024;
  // Probability that a scheduling point where the fiber could go on (an ordered
  // store, an atomic, a fence, an arrival) hands the processor to another fiber.
  // Blocking points always do. 1 explores the most interleavings; scale tests lower
  // it to run faster, still seeded and reproducible.
  double preemption = 1.0;
  // Probability that, after a fiber's run, the next run goes to the next runnable
  // thread of the same block (in thread order, at most a warp's width ahead) instead
  // of a uniform pick among everything runnable. Its lanes' stacks and records are
  // still in the host's caches, so scale tests run faster; 0 (the default) keeps every
  // pick uniform, which explores the most interleavings.
  double locality = 0.0;
  // RAILYARD_SIM_MEMORY_MODEL=weak (or sc), when set, overrides this in reset().
  MemoryModel memory_model = MemoryModel::SequentiallyConsistent;
  // Timed mode (docs/simulator.md, "Timed mode"): every operation costs virtual time by
  // its device's TimingModel, every thread has its own clock, and the scheduler runs
  // whatever (thread, bulk copy or agent event, Agent) has the earliest time, deterministically (seed,
  // preemption and locality then play no part). clock64() and __nanosleep use the
  // thread's clock; recorded events carry times (elapsed_ns).
  bool timed = false;
};

// ProxyRace: a generic-proxy access and an async-proxy (bulk copy) access of the same
// bytes without the proxy fence or the completion wait that orders them
// (docs/simulator.md, "Async-proxy separation").
// DataRace (weak memory mode only): a read that a PTX weak-memory execution could make
// stale, a scope too narrow for its reader, or a doorbell rung before a system release
// (docs/simulator.md, "Weak memory").
enum class ErrorKind { Hang, OutOfBounds, Misaligned, Trap, Misuse, PeerAccess, ProxyRace, DataRace };
const char* to_string(ErrorKind kind);

// A kernel fault or a hang, reported to the host thread that synchronizes on the
// affected stream (like a sticky CUDA error). `what()` is the full report.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string report) : std::runtime_error(report), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Destroys every device, stream and allocation and starts over with `config`.
// Must be called with no host thread blocked in the simulator and no work pending.
void reset(const Config& config = {});
const Config& config();

// ---- devices and memory -------------------------------------------------------
int add_device(const DeviceProps& props = h100_props());
int device_count();
const DeviceProps& device_props(int device);

// Peer mapping (the NVLink model): after enable_peer_access(d, p), kernels on device
// d may access memory of device p. Requires both devices in the same nvlink_domain.
void enable_peer_access(int device, int peer);
bool peer_access_enabled(int device, int peer);

// Device memory: addressable by kernels of `device` and of devices that enabled
// peer access to it. Filled with a poison pattern (0xA5) on allocation.
void* malloc_device(int device, std::size_t bytes, std::string label = "");
// Pinned host memory: addressable by the host and by every device.
void* malloc_host(std::size_t bytes, std::string label = "");
void free(void* ptr);  // device or host allocation; freeing an unknown pointer is Misuse

// Makes caller-owned host memory [ptr, ptr + bytes) memory of `device` for kernels (as
// if the device had allocated it), until unregister_memory(ptr). The simulator never
// frees it. Lets a framework hand its own CPU tensors to simulated kernels. Misuse if
// the range overlaps a simulated allocation or registration.
void register_memory(int device, void* ptr, std::size_t bytes, std::string label = "");
void unregister_memory(void* ptr);  // Misuse unless ptr starts a registration

struct AllocationInfo {
  uintptr_t base = 0;
  std::size_t bytes = 0;
  int device = -1;  // -1: pinned host memory
  std::string label;
};
// The allocation containing [ptr, ptr+bytes), if any.
bool find_allocation(const void* ptr, AllocationInfo* out);
std::size_t live_allocation_count();
std::size_t live_allocation_bytes();

// ---- streams and events ---------------------------------------------------------
struct Stream {
  int id = -1;
  bool operator==(const Stream&) const = default;
};
struct Event {
  int id = -1;
};
Stream default_stream(int device);
Stream create_stream(int device);
int stream_device(Stream stream);

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  std::size_t dynamic_smem_bytes = 0;
  std::string name = "kernel";
};
// Enqueues a kernel: every thread of every block runs `body` (which reads the
// builtins threadIdx, blockIdx, ... of the calling fiber). Checks the launch
// configuration against the device limits and throws std::invalid_argument.
void launch(Stream stream, const LaunchConfig& config, std::function<void()> body);
void memcpy_async(Stream stream, void* dst, const void* src, std::size_t bytes);
void memset_async(Stream stream, void* dst, int value, std::size_t bytes);
Event record_event(Stream stream);
void stream_wait_event(Stream stream, Event event);

// Timed mode: simulated nanoseconds from `start` to `end`, both recorded and done.
// Misuse (std::logic_error) otherwise.
double elapsed_ns(Event start, Event end);
// Block until the work is done. Throw sim::Error if it faulted or hung.
void stream_synchronize(Stream stream);
void device_synchronize(int device);
void event_synchronize(Event event);
// Lets the engine run everything that can run now, then reports whether the stream is empty.
bool stream_query(Stream stream);

// ---- host threads ------------------------------------------------------------------
// Runs fn(rank) on n new host threads that participate from their first instant, so
// the engine waits for all of them; joins them and rethrows the first exception.
void run_ranks(int num_ranks, const std::function<void(int rank)>& fn);

// A condition variable for host threads that wait on other host threads (a bootstrap
// barrier, a host-side collective). While a participating thread waits in it, it
// counts as blocked, so the engine may run the kernels other threads launched. The
// thread that wakes the waiters hands its turn over explicitly: they count as running
// from notify_all() on, before the operating system runs them, so the engine starts
// at the same point of the host program in every run and a seed replays.
class HostCondition {
 public:
  HostCondition() = default;
  HostCondition(const HostCondition&) = delete;
  HostCondition& operator=(const HostCondition&) = delete;

  // Like std::condition_variable::wait_until with a predicate: `lock` (the mutex that
  // guards what ready() reads) is held on entry and on return. Returns ready().
  bool wait_until(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline,
                  const std::function<bool()>& ready);
  // Wakes every waiter. Call it with the waiters' mutex held, after changing what they
  // wait for.
  void notify_all();

 private:
  std::condition_variable cv_;
};

// ---- agents (the place for a simulated NIC) ------------------------------------
// An agent is stepped by the engine like a fiber: it may read and write simulated
// memory (e.g. poll a doorbell and move bytes between devices).
//
// By default (untimed) the seeded scheduler picks an agent among the runnable
// threads and copies, and when nothing else can run it steps every agent; step()
// returns true when it made progress, and an agent that returns false counts as idle.
//
// In the timed mode (Config::timed) an agent is a source of events in the one
// schedule: next_event_ns() says when its next event happens (kNoEvent: none until a
// thread writes what it watches, a doorbell say), and the engine calls step() exactly
// when that time is the earliest of every thread, bulk copy and agent (a copy, then an
// agent, then a thread on a tie); step() then runs that one event. The default
// next_event_ns() takes no part in the timed mode.
inline constexpr double kNoEvent = std::numeric_limits<double>::infinity();
class Agent {
 public:
  virtual ~Agent() = default;
  virtual bool step() = 0;
  virtual double next_event_ns() const { return kNoEvent; }
  virtual std::string describe() const = 0;  // for hang reports
};
void add_agent(Agent* agent);  // not owned; removed by reset() or remove_agent()
// Before an agent is destroyed ahead of the next reset() (a Buffer's own NIC): the
// engine stops stepping it. A no-op for an agent it does not hold.
void remove_agent(Agent* agent);
// Called from an agent's step() only: ends `device`'s work (its kernels and streams)
// with a fault of `kind`, as a kernel fault does; the host thread that synchronizes
// on it gets sim::Error(kind, report). A simulated NIC uses it for a request the real
// NIC would not execute (a doorbell rung before the WQE was written).
void agent_fault(int device, ErrorKind kind, const std::string& report);

// Called from an agent's step() only. In the weak memory mode an agent's accesses are
// checked like a thread's, as a thread outside every device called `agent` (no-ops in
// the sequentially consistent mode, but for agent_write's wake):
//  - agent_write records bytes the agent placed in simulated memory and, in both
//    modes, wakes the threads polling them: an agent calls it for every write (else
//    its pollers run again only at the next clock warp). Plain: payload, which a
//    kernel may read only once it knows the write (an acquire of something published
//    after it). Release: a strong store (a NIC's atomic, a CQE's owner word)
//    that publishes everything written before it to a thread that acquires it with a
//    system-scope load or fence; a narrower acquire is a scope fault.
//  - doorbell_release: what the last store to the doorbell at `ptr` released to the
//    system (register_doorbell); agent_read then checks the bytes the doorbell asked
//    for against it: a kernel write the release did not cover ends `device`'s work
//    with a DataRace (as agent_fault does) and agent_read returns false.
enum class AgentOrder { Plain, Release };
// Called from an agent's step() only: `bytes` an agent of device `from` (its NIC)
// placed in memory of device `to`, counted in traffic().nic_bytes (both modes).
void agent_count_bytes(int from, int to, std::size_t bytes);
void agent_write(const std::string& agent, const void* ptr, std::size_t bytes, AgentOrder order, const char* op,
                 std::source_location loc = std::source_location::current());
uint64_t doorbell_release(const void* ptr);
bool agent_read(int device, const std::string& agent, const void* ptr, std::size_t bytes, uint64_t released,
                const char* op, std::source_location loc = std::source_location::current());

// Timed mode, from an agent only. doorbell_rung_ns: when the earliest store to the
// doorbell at `ptr` (register_doorbell) that the agent has not taken was issued, by the
// storing thread's clock (kNoEvent: none); take_doorbell marks every store until now
// taken. An agent sees a doorbell when it takes it: the value stored last.
double doorbell_rung_ns(const void* ptr);
void take_doorbell(const void* ptr);
// Timed mode, from an agent only: `bytes` through one of device `device`'s NIC pipes
// (the port's transmit and receive directions, TimingModel::nic_gbps each, and the
// NIC's reads of GPU memory over PCIe, nic_pcie_gbps), ready at `ready_ns`: when the
// last byte has passed. Counted in busy_time().
enum class NicPipe { Tx, Rx, PcieRead };
double nic_pass(int device, NicPipe pipe, double ready_ns, std::size_t bytes);

// Marks [ptr, ptr + bytes) as an MMIO doorbell (a NIC's, say): in weak memory mode, a
// kernel store to it while the storing thread has writes not released to the system
// (no st.release.sys as the store itself, no fence.acq_rel.sys or fence.sc.sys since
// them) is a DataRace. Kept until unregister_doorbell(ptr) or reset().
void register_doorbell(void* ptr, std::size_t bytes);
void unregister_doorbell(void* ptr);

// ---- accounting -----------------------------------------------------------------------
// Bytes moved by kernels through the arch wrappers, by (executing device, owner of
// the memory). Owner -1 is pinned host memory. Reads and writes are counted apart.
struct Traffic {
  int num_devices = 0;
  std::vector<uint64_t> write_bytes;  // [device * (num_devices + 1) + (owner + 1)]
  std::vector<uint64_t> read_bytes;
  uint64_t written(int device, int owner) const {
    return write_bytes[static_cast<std::size_t>(device) * (num_devices + 1) + (owner + 1)];
  }
  uint64_t read(int device, int owner) const {
    return read_bytes[static_cast<std::size_t>(device) * (num_devices + 1) + (owner + 1)];
  }
  // Bytes agents (the simulated NICs) placed: a NIC of device `from` in memory of
  // device `to` (RDMA payload, 8 per atomic; agent_count_bytes).
  std::vector<uint64_t> nic_bytes;  // [from * num_devices + to]
  uint64_t nic_sent(int from, int to) const {
    return nic_bytes[static_cast<std::size_t>(from) * num_devices + static_cast<std::size_t>(to)];
  }
};
Traffic traffic();
// Also restarts busy_time()'s count.
void reset_traffic();

// Timed mode: how long each resource of a device's timing model was busy since reset()
// or reset_traffic() (the sum of the transfers' bytes over its bandwidth, queued ones
// included). Per-SM resources are the busiest SM's. A resource busy for most of an
// operation's time is what bounds it; none near 100% means latency does.
struct BusyTime {
  double hbm_ns = 0, nvlink_out_ns = 0, nvlink_in_ns = 0;
  double sm_issue_ns = 0, sm_smem_ns = 0, sm_tma_ns = 0;
  double nic_tx_ns = 0, nic_rx_ns = 0, nic_pcie_ns = 0;  // the device's simulated NIC (nic_pass)
};
std::vector<BusyTime> busy_time();  // by device; empty outside the timed mode

// Timed mode: how long the kernels' threads spent in pipeline::timeout_while since
// reset() or reset_traffic(), by what they waited on (the wait's label) and where (the
// kernel line that waited): how many waits took any time (the first check's own cost
// included, so a condition met at once counts too), their sum over threads and the
// longest. Ordered by total, longest first. It says which role waits on which other,
// where a busy time says only what is saturated.
struct WaitTotal {
  std::string what;
  std::string where;  // file:line
  uint64_t waits = 0;
  double total_ns = 0, max_ns = 0;
  // The longest wait's: its kernel's device, and the wait's two numbers (WaitTarget).
  int longest_device = -1;
  int64_t longest_index = -1, longest_value = -1;
};
std::vector<WaitTotal> wait_profile();  // empty outside the timed mode

struct Stats {
  uint64_t scheduler_steps = 0;
  uint64_t fibers_run = 0;
  uint64_t async_ops_completed = 0;
  uint64_t virtual_cycles = 0;
  // A hash of every scheduling decision in order (which thread of which block of
  // which device ran, which bulk copy or agent was stepped, each clock warp): two
  // runs with the same digest ran the same interleaving.
  uint64_t schedule_digest = 0;
};
Stats stats();

}  // namespace railyard::sim
