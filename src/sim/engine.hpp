// Railyard simulator internals: the engine that runs every simulated CUDA thread as a
// fiber under a seeded scheduler. Not a public header.
#pragma once

#include <atomic>
#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <source_location>
#include <sys/types.h>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "proxy.hpp"
#include "railyard/sim/device.hpp"
#include "railyard/sim/sim.hpp"
#include "timing.hpp"
#include "weak_memory.hpp"

namespace railyard::sim::detail {

namespace bctx = boost::context;
using device::Loc;

// xoshiro256** seeded through splitmix64: small, fast and identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed = 1);
  uint64_t next();
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }

 private:
  uint64_t s_[4];
};

struct Block;
struct KernelRun;

// "file:line" of a source location, the file relative to the repository, for reports.
std::string format_loc(const Loc& loc);

// What a blocked or waiting fiber waits for; formatted only for reports.
struct WaitInfo {
  enum class Kind : uint8_t { None, Barrier, Warp, Mbarrier, Poll, BulkGroup, Sleep };
  Kind kind = Kind::None;
  const void* addr = nullptr;
  uint64_t a = 0, b = 0;
  const char* what = "";
  Loc loc{};
};

enum class FiberState : uint8_t {
  Runnable,
  Parked,     // idle poll or sleep: runnable again once anything makes progress
  TimedWait,  // mbarrier try_wait: woken by the barrier's phase or by a clock warp
  Blocked,    // barrier, warp collective, bulk group: woken only by its condition
  Done,
};

// A bulk async-group of one thread. A shared-to-global copy first reads shared
// memory, later writes global memory: wait_group.read waits for the reads only.
struct BulkGroup {
  unsigned pending_reads = 0;   // copies that have not read their source yet
  unsigned pending_writes = 0;  // copies whose writes have not landed yet
};

struct Fiber {
  Block* block = nullptr;
  unsigned tid = 0;  // linear thread index in the block
  // Its kernel's device and its block's linear index, for Stats::schedule_digest: the
  // scheduler reads them without touching the block or the kernel.
  int device = 0;
  unsigned block_linear = 0;
  Dim3 thread_idx;
  FiberState state = FiberState::Runnable;
  bctx::fiber context;  // the fiber while suspended
  bctx::fiber sink;     // the scheduler while the fiber runs
  WaitInfo wait;
  uint64_t park_epoch = 0;
  bool timed_out = false;  // set when a clock warp ends a timed wait
  bool woken_by_warp = false;  // ran again only because the clock warped; cleared when it waits again
  // Idle-poll detection: what this fiber's ordered loads saw since it last changed
  // memory. A load that sees the same value again is an idle poll. `memory`: the value
  // is the bytes at addr (false: an mbarrier's completed phases).
  struct PollRecord {
    const void* addr;
    std::size_t bytes;
    uint64_t value[2];
    bool memory;
  };
  std::vector<PollRecord> polls;
  // Parks in a row with nothing new seen in between (idle_poll saw only values it had
  // seen, and the fiber wrote nothing); from the second on, a fiber that polls memory
  // only sleeps until one of those bytes is written (Engine::watch).
  uint32_t idle_parks = 0;
  bool watching = false;  // parked in Engine::watching_, woken by a write to its polls
  // Bulk async-groups of this thread: the open group and the committed ones, oldest first.
  std::deque<BulkGroup> groups;
  // Whether this thread waited for its bulk stores' reads before exiting: groups it
  // committed, the newest of them holding a store, and how many it has waited to read.
  uint64_t groups_committed = 0, last_store_group = 0, groups_read_waited = 0;
  bool open_group_has_store = false;
  bool unfenced_mbarrier_inits = false;  // it initialised an mbarrier and has not fenced since
  Loc last_bulk_store{};
  // Warp collective in progress: where to deliver the lanes' values.
  uint64_t* collective_out = nullptr;
  // Async-proxy tracking (proxy.hpp): this thread's index in the kernel, its state,
  // and what it knows of mbarrier phases (by the barrier's id in the block: phases it
  // saw complete itself or learnt of through a barrier, collective or mbarrier).
  uint32_t kernel_thread = 0;
  ThreadProxyState* proxy = nullptr;
  std::vector<uint64_t> phases_seen;
  WeakThread weak;  // weak memory mode (weak_memory.hpp)
  // Timed mode (timing.hpp): its clock, and when its posted stores to its own device's
  // memory and to other devices' are all visible (fences and release stores wait).
  double clock_ns = 0;
  double local_stores_done_ns = 0, remote_stores_done_ns = 0;
  std::size_t runnable_index = 0;
  std::size_t wait_index = 0;  // in Engine's parked_ or timed_ list, while in one
  // Its stack, and AddressSanitizer's fake stack while it is switched out.
  const void* stack_bottom = nullptr;
  std::size_t stack_bytes = 0;
  void* asan_fake_stack = nullptr;

  Fiber() = default;
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  ~Fiber();  // unwinds a suspended fiber's stack
};

struct NamedBarrier {
  unsigned expected = 0;  // 0: idle
  unsigned arrived = 0;
  std::vector<Fiber*> waiters;
  std::vector<uint64_t> phases_seen;  // joined from the arrivals, handed to every participant
  uint64_t weak_known = 0;            // the same for the weak memory mode's knowledge
};

struct WarpCollective {
  uint32_t mask = 0;
  uint32_t arrived = 0;
  const char* what = nullptr;
  uint64_t values[32] = {};
  Fiber* waiters[32] = {};
  unsigned num_waiters = 0;
};

struct Mbarrier {
  unsigned expected_arrivals = 0;
  unsigned pending_arrivals = 0;
  int64_t tx_count = 0;         // expected minus completed transaction bytes
  uint64_t phases_completed = 0;
  std::vector<Fiber*> waiters;
  // Its index in Fiber::phases_seen, given when a bulk copy first completes on it: only
  // such barriers' phases say that shared memory holds a copy's bytes.
  static constexpr uint32_t kNoId = UINT32_MAX;
  uint32_t id = kNoId;
  // What the arrivals of the current phase knew of mbarrier phases, and what those of
  // the last completed phase knew: a waiter that sees the phase complete learns it.
  std::vector<uint64_t> phases_arrived, phases_released;
  uint64_t weak_arrived = 0, weak_released = 0;  // the same for the weak memory mode's knowledge
  // The thread that initialised it, until that thread's fence.mbarrier_init or
  // fence.proxy.async of shared memory makes the initialisation visible to the async
  // proxy (bulk copies complete transactions on it through that proxy).
  const Fiber* init_unfenced_by = nullptr;
  Loc init_loc{};
};

struct Block {
  KernelRun* kernel = nullptr;
  Dim3 idx;
  uint32_t first_thread = 0;  // the kernel-wide index of its thread 0
  std::unique_ptr<uint8_t, void (*)(void*)> smem{nullptr, &std::free};
  std::size_t smem_bytes = 0;
  std::vector<std::unique_ptr<Fiber>> fibers;
  unsigned live_fibers = 0;
  unsigned pending_async = 0;
  NamedBarrier barriers[16];
  std::vector<WarpCollective> warp_collectives[32];  // in progress, by warp
  std::unordered_map<uintptr_t, Mbarrier> mbarriers;  // by address; references stay valid
  // The same barriers by 8-byte word of shared memory (null: none), made at the first
  // init: every arrive and wait looks its barrier up.
  std::vector<Mbarrier*> mbarrier_at;
  Mbarrier* find_mbarrier(uintptr_t addr) const {
    const std::size_t word = (addr - reinterpret_cast<uintptr_t>(smem.get())) / 8;
    return word < mbarrier_at.size() ? mbarrier_at[word] : nullptr;
  }
  uint32_t next_mbarrier_id = 0;  // the next Mbarrier::id
  std::vector<uint64_t> collective_phases;  // scratch of warp_collective, kept for its capacity
  std::vector<SharedGranule> proxy_granules;  // dynamic shared memory by 16 bytes, made on first use
  std::vector<WordRecord> weak_words;         // weak mode: dynamic shared memory by word, made on first use
  int sm = 0;                                 // timed mode: the SM it runs on
};

struct KernelRun {
  int device = 0;
  int stream = 0;
  uint64_t launch_id = 0;
  LaunchConfig config;
  std::function<void()> body;
  unsigned next_block = 0;  // linear index of the next block to make resident
  unsigned blocks_total = 0;
  unsigned blocks_done = 0;
  std::vector<std::unique_ptr<Block>> resident;
  std::vector<ThreadProxyState> proxy_threads;  // by linear thread index in the kernel
  double start_ns = 0, end_ns = 0;  // timed mode: launch done, last thread or copy done
};

struct AsyncOp {
  enum class Kind : uint8_t { G2S, S2G };
  Kind kind;
  Block* block;
  Fiber* issuer;
  void* dst;
  const void* src;
  uint32_t bytes;
  uint64_t* bar;     // G2S: the mbarrier that receives complete_tx
  BulkGroup* group;  // S2G: the issuing thread's group it counts in
  Loc loc;
  // S2G completes in two scheduler steps: the shared-memory read (into `data`),
  // then the global write.
  std::shared_ptr<std::vector<uint8_t>> data = nullptr;
  // Timed mode: when the copy's source read (S2G) and its write complete.
  double read_ns = 0, ready_ns = 0;
  double next_ns() const { return kind == Kind::S2G && !data ? read_ns : ready_ns; }
};

struct StreamOp {
  enum class Kind : uint8_t { Kernel, Memcpy, Memset, EventRecord, EventWait };
  Kind kind = Kind::Kernel;
  std::shared_ptr<KernelRun> kernel;
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  int value = 0;
  int event = -1;
};

struct StreamState {
  int device = 0;
  std::deque<StreamOp> ops;
  bool head_started = false;  // the head op is a kernel already running
  double time_ns = 0;         // timed mode: when its last op finished
};

struct DeviceState {
  DeviceProps props;
  std::vector<bool> peer;  // peer[p]: this device may access device p
  int default_stream = -1;
  unsigned resident_blocks = 0;
  bool faulted = false;
  ErrorKind fault_kind = ErrorKind::Misuse;
  std::string fault_report;
  uint64_t allocations = 0;  // made on this device (allocate and register_range)
};

struct Allocation {
  uintptr_t base;
  std::size_t bytes;
  int device;
  std::string label;
  bool owned = true;  // false: registered caller memory (register_memory), never freed here
  std::size_t mapped_bytes = 0;  // owned: the length of its mapping (0: from aligned_alloc)
  // Where it would be on a GPU, independent of the host's heap: device memory numbered
  // by allocation order on its device, each at a 64 GiB boundary (host memory: 0). The
  // timed L1 indexes its sets by it, so that timed figures do not move with the host
  // process's layout.
  uintptr_t sim_base = 0;
};

// A host thread waiting in the simulator for a condition the engine can satisfy.
struct HostWaiter {
  std::function<bool()> ready;  // evaluated by the engine under the world lock
  bool wants_quiescence = false;  // stream_query: satisfied once nothing can progress
  bool satisfied = false;
};

// A participating host thread asleep in a HostCondition until another host thread
// wakes it. `released`: the waker has counted it as running again (hand-over).
struct HostSleeper {
  const void* condition = nullptr;
  bool released = false;
};

// Guard-paged fiber stacks, kept for reuse: a kernel starts and retires thousands of
// threads, and mapping and unmapping a stack for each one costs more than running it.
class StackPool {
 public:
  explicit StackPool(std::size_t stack_bytes = 256 * 1024) : allocator_(stack_bytes), stack_bytes_(stack_bytes) {}
  ~StackPool();
  // A stack, from the free ones or newly mapped; a mapping that fails (the process's
  // memory mappings at vm.max_map_count, or its address space at its limit) throws a
  // std::runtime_error that says so.
  bctx::stack_context allocate();
  void deallocate(bctx::stack_context& sctx);
  void release_all();  // unmaps the free stacks

 private:
  std::string stack_failure() const;  // why allocate() failed, and what to do
  bctx::protected_fixedsize_stack allocator_;
  std::size_t stack_bytes_;
  std::size_t mapped_ = 0;  // stacks mapped, in use or free
  std::vector<bctx::stack_context> free_;
};

// The stack allocator handed to each fiber: a reference to the engine's pool.
// It tells the fiber where its stack is (for AddressSanitizer's switch annotations).
struct PooledStack {
  StackPool* pool;
  Fiber* fiber;
  bctx::stack_context allocate() {
    bctx::stack_context sctx = pool->allocate();
    fiber->stack_bottom = static_cast<char*>(sctx.sp) - sctx.size;
    fiber->stack_bytes = sctx.size;
    return sctx;
  }
  void deallocate(bctx::stack_context& sctx) { pool->deallocate(sctx); }
};

// A source file's name relative to the project (kernels/..., include/...), as reports
// print it.
std::string project_file(const char* path);

class Engine {
 public:
  // Every hook asks for the engine, several times per access: after the first call
  // this is one load.
  static Engine& get() {
    Engine* e = instance_.load(std::memory_order_acquire);
    return e ? *e : create();
  }

  // ---- world protocol (host side); all take the world lock ----
  std::unique_lock<std::mutex> acquire();                  // make the calling thread active
  void block_until(std::unique_lock<std::mutex>& lock, std::function<bool()> ready,
                   bool wants_quiescence = false);
  // A participating host thread joins rank threads, which leave the world themselves.
  // Returns false if the thread does not participate.
  bool begin_host_wait();
  void end_host_wait();
  // A participating host thread sleeps in a HostCondition (false if it does not
  // participate) and wakes; release_host_sleepers counts the condition's sleepers as
  // running again, on behalf of the host thread that wakes them.
  bool begin_host_sleep(HostSleeper& sleeper);
  void end_host_sleep(HostSleeper& sleeper);
  void release_host_sleepers(const void* condition);
  void add_preassigned(int n);
  void adopt_preassigned();
  void leave();  // a participating thread ends

  // ---- host API implementation (world lock held by caller) ----
  void reset(const Config& config);
  const Config& config() const { return config_; }
  int add_device(const DeviceProps& props);
  void enable_peer(int device, int peer);
  void* allocate(int device, std::size_t bytes, std::string label);
  void deallocate(void* ptr);
  void register_range(int device, void* ptr, std::size_t bytes, std::string label);
  void unregister_range(void* ptr);
  const Allocation* find(const void* ptr) const;
  uintptr_t sim_base_for(int device);  // the next Allocation::sim_base of `device`
  const Allocation* nearest_below(const void* ptr) const;
  int new_stream(int device);
  int new_event(int device);
  int event_count() const { return static_cast<int>(events_done_.size()); }
  int event_device(int event) const { return event_device_[event]; }
  int stream_count() const { return static_cast<int>(streams_.size()); }
  bool device_idle(int device) const;
  void enqueue(int stream, StreamOp op);
  bool stream_empty(int stream) const;
  bool event_done(int event) const { return events_done_[event]; }
  void throw_if_faulted(int device) const;
  int stream_device(int stream) const { return streams_.at(stream).device; }
  const DeviceState& device(int id) const { return devices_.at(id); }
  int device_count() const { return static_cast<int>(devices_.size()); }
  std::size_t live_allocations() const { return allocations_.size(); }
  std::size_t live_bytes() const;
  void add_agent(Agent* agent) {
    agents_.push_back(agent);
    agents_cached_ = false;
  }
  void remove_agent(Agent* agent) {
    std::erase(agents_, agent);
    agents_cached_ = false;
  }
  // An agent's step() (engine thread) ends a device's work with a fault.
  void agent_fault(int device, ErrorKind kind, const std::string& report) { fault_device(device, kind, report); }
  Traffic traffic() const;
  void reset_traffic();
  Stats stats() const { return stats_; }
  bool quiescent() const { return quiescent_; }

  // ---- device side (engine thread, world held by the engine) ----
  Fiber* current() const { return current_; }
  void yield_runnable();                    // stay runnable, let others run
  // Timed mode: a thread whose clock has run past the scheduler's time (a release's
  // wait, a barrier's cost) yields until it is the earliest, so that its next access
  // meets the pipes in time order.
  void catch_up();
  void yield_parked(const WaitInfo& wait);  // idle until anything makes progress
  void yield_blocked(const WaitInfo& wait);  // until woken explicitly
  bool yield_timed(const WaitInfo& wait);  // until woken (true) or clock warp (false)
  void wake(Fiber* f);
  void progress() { ++epoch_; }
  // Something wrote [ptr, ptr + bytes): progress, and the fibers watching those bytes
  // wake if what they polled there changed.
  void wrote(const void* ptr, std::size_t bytes) {
    ++epoch_;
    if (!watched_pages_.empty()) wake_watchers(reinterpret_cast<uintptr_t>(ptr), bytes);
  }
  [[noreturn]] void fault(ErrorKind kind, const std::string& message, Loc loc);
  void count_traffic(int device, int owner, std::size_t bytes, bool write);
  void count_nic_bytes(int from, int to, std::size_t bytes);
  void issue_async(const AsyncOp& op);
  uint64_t clock() const { return stats_.virtual_cycles; }
  uint64_t read_clock() {  // clock64(): a fiber that reads the clock may be timing a wait
    ++clock_reads_;
    if (timing_.enabled()) return timing_.ns_to_cycles(current_->device, current_->clock_ns);
    return stats_.virtual_cycles;
  }
  ProxyTracker& proxy() { return proxy_; }
  WeakMemory& weak() { return weak_; }
  Timing& timing() { return timing_; }
  // Timed mode: the time of what happens now (the running thread's clock, else the
  // completing copy's time), and the time between two recorded events.
  double event_time() const { return current_ != nullptr ? current_->clock_ns : now_ns_; }
  double elapsed_ns(int start, int end) const { return event_time_ns_[end] - event_time_ns_[start]; }
  Mbarrier* mbarrier(uint64_t* bar, Loc loc, bool must_exist);
  void complete_tx(Mbarrier& bar, uint32_t bytes);
  void arrive(Mbarrier& bar, unsigned count);
  std::string where(const Fiber* f) const;

 private:
  Engine();
  static Engine& create();
  static inline std::atomic<Engine*> instance_{nullptr};
  void engine_main();
  void run_until_pause();
  bool step();  // false when nothing can run without a clock warp
  bool step_timed();
  bool idle();  // step() when nothing can run now
  void run_fiber(Fiber* f);
  void admit();
  void start_block(KernelRun& k);
  void retire_finished();
  void check_bulk_reads_at_exit(Fiber* f);
  void complete_async(std::size_t index);
  Fiber* neighbour_to_run();
  Fiber* pop_earliest_fiber();         // timed mode
  std::size_t earliest_async();        // timed mode
  std::size_t earliest_agent();        // timed mode
  void record_decision(uint64_t what, uint64_t a, uint64_t b, uint64_t c);
  void warp_or_hang();
  bool pause_for_quiescence();
  bool recheck_parked();
  bool may_warp();
  void warp_clock();
  void report_hang();
  std::string hang_report() const;
  std::string waits_report() const;
  void fault_device(int device, ErrorKind kind, const std::string& report);
  void destroy_kernel(KernelRun& k);
  void finish_head(int stream);
  void check_host_waiters();
  void make_runnable(Fiber* f);
  void remove_runnable(Fiber* f);
  static void add_waiting(std::vector<Fiber*>& list, Fiber* f);
  static void remove_waiting(std::vector<Fiber*>& list, Fiber* f);
  void unpark(Fiber* f);  // a parked fiber (not watching) runs again
  bool watch(Fiber* f);   // a parked fiber watches its polls instead, if it may
  void unwatch(Fiber* f);
  void wake_watchers(uintptr_t addr, std::size_t bytes);
  void wake_all_watchers();
  bool has_work() const;
  bool world_ready() const;

  // world protocol
  std::mutex mutex_;
  std::condition_variable cv_;
  int participants_ = 0;
  int blocked_ = 0;
  int preassigned_ = 0;
  std::vector<HostSleeper*> sleepers_;  // participants asleep in a HostCondition, not yet released
  std::atomic<int> active_{0};  // participants_ - blocked_, read lock-free by the engine
  bool engine_running_ = false;
  std::vector<HostWaiter*> host_waiters_;
  std::thread thread_;

  // simulated world
  Config config_;
  Rng rng_;
  std::vector<DeviceState> devices_;
  std::vector<StreamState> streams_;
  std::vector<int> admission_order_;  // stream ids by (device, creation on that device)
  std::vector<bool> events_done_;
  std::vector<int> event_device_;
  std::map<uintptr_t, Allocation> allocations_;
  std::vector<std::shared_ptr<KernelRun>> kernels_;  // running
  uint64_t next_launch_id_ = 0;
  std::vector<Fiber*> runnable_;
  // Timed mode: runnable_ again, as a min-heap on (clock, order of becoming runnable).
  // A runnable thread's clock does not change, so the heap holds exactly runnable_.
  struct TimedEntry {
    double clock_ns;
    uint64_t order;
    Fiber* fiber;
    bool operator>(const TimedEntry& o) const {
      return clock_ns != o.clock_ns ? clock_ns > o.clock_ns : order > o.order;
    }
  };
  std::vector<TimedEntry> by_clock_;
  uint64_t runnable_order_ = 0;
  std::vector<Fiber*> parked_;
  std::vector<Fiber*> timed_;
  // Parked fibers that poll memory and have parked twice with nothing new: they sleep
  // until a write changes a value they polled (watched_pages_: by 4 KiB page of each
  // polled address, the fibers watching it), a clock warp, or the host's next turn.
  // Without this, every progress anywhere reran every parked poller, so a step's cost
  // grew with the group's waiting threads.
  std::vector<Fiber*> watching_;
  std::unordered_map<uintptr_t, std::vector<Fiber*>> watched_pages_;
  std::vector<AsyncOp> async_;
  std::vector<Agent*> agents_;
  // Timed mode: the copy whose next step is earliest (valid while async_cached_) and
  // the agent whose next event is earliest, with its time (valid while agents_cached_
  // and no doorbell was stored to since). A copy's time changes only when it steps, an
  // agent's only when an agent steps, a doorbell is rung or the host held the world,
  // so the scheduler rescans them only then instead of at every step.
  std::size_t earliest_async_ = 0;
  bool async_cached_ = false;
  std::size_t earliest_agent_ = 0;
  double earliest_agent_ns_ = 0;
  bool agents_cached_ = false;
  uint64_t doorbell_stores_seen_ = 0;
  std::unique_ptr<StackPool> stacks_ = std::make_unique<StackPool>();
  Fiber* current_ = nullptr;
  Fiber* last_run_ = nullptr;  // the fiber of the last run, while its block is resident
  struct PendingFault {
    bool set = false;
    ErrorKind kind = ErrorKind::Misuse;
    std::string report;
    int device = 0;
  } pending_fault_;
  uint64_t epoch_ = 1;
  uint64_t unpark_epoch_ = 0;
  uint64_t warp_epoch_ = 0;
  uint64_t recheck_epoch_ = 0;   // the epoch of the last recheck_parked() round
  unsigned rechecks_in_epoch_ = 0;  // recheck rounds run in that epoch
  uint64_t idle_rounds_ = 0;         // clock warps since the last progress
  uint64_t rounds_without_clock_ = 0;  // of those, rounds in which no waiter read the clock
  uint64_t warp_cycles_ = 0;         // the next warp's jump
  uint64_t clock_reads_ = 0;         // clock64() calls, ever
  uint64_t warp_clock_reads_ = 0;    // clock_reads_ at the last warp
  bool admission_dirty_ = false;
  bool quiescent_ = false;
  std::vector<uint64_t> traffic_write_, traffic_read_;
  std::vector<uint64_t> traffic_nic_;  // [from * devices + to]
  ProxyTracker proxy_;
  WeakMemory weak_;
  Timing timing_;
  double now_ns_ = 0;                  // timed mode: the time of the last thread run or copy step
  std::vector<double> event_time_ns_;  // timed mode: by event
  Stats stats_;
};

// Thrown inside a fiber to end it when the kernel faults; caught at the fiber's entry.
struct KernelFault {};

}  // namespace railyard::sim::detail
