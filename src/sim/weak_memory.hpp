// Railyard simulator internals: the weak-memory mode, a happens-before race detector
// with scopes. Not a public header.
//
// With Config::memory_model == Weak the simulator still performs every access in one
// global order, but it also checks each read against what a PTX weak-memory execution
// could return instead: a plain load of bytes another thread wrote, with no chain of
// release/acquire, fence or barrier between the two, could be stale on a GPU, and is
// reported as a DataRace fault naming both source lines. So every read that could be
// stale is reported, not one stale outcome sampled.
//
// Knowledge is a scalar clock. `now` counts tracked writes; a thread knows every write
// up to its `frontier`, and K = max(frontier, lastwrite) is what it can hand on. Release
// operations publish K, acquire operations take it in, barriers join it. Scalars
// over-approximate (knowing one writer's write at time t counts as knowing every write
// up to t), so some races go unreported; none is reported that a happens-before chain
// orders. docs/simulator.md ("Weak memory") states the rules and their PTX sources.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "railyard/sim/device.hpp"
#include "range_map.hpp"

namespace railyard::sim::detail {

struct Block;
struct Fiber;
struct KernelRun;
using device::Loc;
using device::Order;
using device::Scope;

// Scopes as indices: 0 the block (cta), 1 the device (gpu), 2 the system.
constexpr std::size_t kScopes = 3;

// One thread's knowledge. Times are values of WeakMemory's event counter.
struct WeakThread {
  uint64_t id = 0;         // launch id << 32 | thread index in the kernel: unique per reset
  uint64_t block_key = 0;  // launch id << 32 | block index in the grid
  int device = 0;
  uint64_t lastwrite = 0;  // its latest tracked write
  uint64_t lastread = 0;   // its latest plain read
  const char* lastwrite_op = "";
  Loc lastwrite_loc{};
  uint64_t frontier = 0;   // every write at a time <= frontier happens before its next access
  // By the scope that relates the reader to the writer: knowledge its relaxed loads
  // read since (a fence of that scope or wider acquires it), and knowledge its last
  // fence of that scope or wider released (carried by its later relaxed stores).
  uint64_t pending[kScopes] = {0, 0, 0};
  uint64_t released[kScopes] = {0, 0, 0};
  uint64_t bulk_landed = 0;  // landing time of its latest shared->global copy that landed
  // What its bulk copies know: its knowledge at its last fence.proxy.async of global
  // memory (or its start). An acquire orders the generic proxy only; the copies it
  // issues after one see the acquired writes only once such a fence follows it.
  uint64_t async_frontier = 0;
  uint64_t knowledge() const { return std::max({frontier, lastwrite, lastread}); }
};

// The last plain write of a 4-byte word, and its last plain read (kept by ranges of
// words: a bulk copy's row is one record).
struct Access {
  uint64_t time = 0;    // 0: none
  uint64_t thread = 0;  // WeakThread::id
  const char* op = "";
  Loc loc{};
};
struct WordRecord {
  Access write, read;
};

// A block's shared memory: a record per word, dense (a zero record is none), with
// RangeMap's operations; words are numbered by address like global memory's.
class DenseWords {
 public:
  DenseWords(WordRecord* records, uintptr_t first_word) : records_(records), base_(first_word) {}
  template <class Fn>
  void for_each(uintptr_t first, uintptr_t last, Fn&& fn) const {
    for (uintptr_t i = first; i < last; ++i) fn(i, i + 1, records_[i - base_]);
  }
  void assign(uintptr_t first, uintptr_t last, const WordRecord& value) {
    std::fill(records_ + (first - base_), records_ + (last - base_), value);
  }
  void erase(uintptr_t first, uintptr_t last) { assign(first, last, WordRecord{}); }
  template <class Fn>
  void update(uintptr_t first, uintptr_t last, Fn&& fn) {
    for (uintptr_t i = first; i < last; ++i) fn(records_[i - base_]);
  }

 private:
  WordRecord* records_;
  uintptr_t base_;
};

// The last strong store (relaxed, volatile, release, atomic) of an address: what an
// acquire that reads its value learns, by the scope relating reader and writer.
struct SyncRecord {
  uint64_t time = 0;
  uint64_t writer = 0;
  uint64_t block_key = 0;
  int device = 0;
  Scope scope = Scope::Block;
  uint64_t knows[kScopes] = {0, 0, 0};
  const char* op = "";
  Loc loc{};
};

class WeakMemory {
 public:
  static constexpr std::size_t kWordBytes = 4;

  bool enabled() const { return enabled_; }
  void reset(bool enabled);
  // No kernel runs: the records go (a later kernel's threads know all of them).
  void forget();

  void start_thread(Fiber* f);
  void load(Fiber* f, const void* ptr, std::size_t bytes, Order order, Scope scope, const char* op, Loc loc);
  void store(Fiber* f, const void* ptr, std::size_t bytes, Order order, Scope scope, const char* op, Loc loc);
  // An atomic read-modify-write; `wrote`: it changed the value (a failed CAS only reads).
  void rmw(Fiber* f, const void* ptr, std::size_t bytes, Scope scope, bool wrote, const char* op, Loc loc);
  void fence(Fiber* f, const char* op);
  // The scope of a fence (0 block, 1 device, 2 system), from the name its wrapper passes.
  static std::size_t fence_scope(const char* op);
  // fence.proxy.async of global memory: its later bulk copies know what it knows.
  static void proxy_fence_global(Fiber* f);

  // Barriers: each participant joins its knowledge into the barrier's; those that
  // wait learn the join.
  static void join(uint64_t& into, const Fiber* f);
  static void learn(Fiber* f, uint64_t knowledge);
  static void warp_join(Block* b, unsigned warp, uint32_t mask);

  // Bulk copies: a global->shared copy reads its source like a plain load at issue
  // (recorded as its issuer's read) and leaves its destination to the async-proxy
  // tracker; a shared->global copy must not overwrite bytes another thread read unless
  // its issuer's async frontier knows the read, and writes its destination, as its
  // issuer, when it lands; a full wait_group makes its issuer know the landings. Both
  // check with the issuer's async frontier, not its knowledge.
  void bulk_read(Fiber* f, const void* gmem_src, std::size_t bytes, Loc loc);
  void bulk_write_issued(const Fiber* f, const void* gmem_dst, std::size_t bytes, Loc loc) const;
  void bulk_landed(Fiber* issuer, const void* dst, std::size_t bytes, bool shared, Loc loc);
  static void bulk_waited(Fiber* f);

  void add_doorbell(const void* ptr, std::size_t bytes);
  void remove_doorbell(const void* ptr);
  // What the last store to the doorbell covering `ptr` released to the system: the
  // writes a device outside the GPU that it rang may read (0: none yet).
  uint64_t doorbell_release(const void* ptr);

  // Agents (a simulated NIC) access memory outside every kernel, as a thread outside
  // every device named `agent`. A Plain write places payload; a Release write is a
  // strong store that publishes everything written before it to a reader that acquires
  // it at system scope (a NIC's atomic after the WRITEs it follows, a CQE's owner word
  // after the rest of the CQE).
  void agent_write(const std::string& agent, const void* ptr, std::size_t bytes, Order order, const char* op, Loc loc);
  // An agent's read of bytes a kernel wrote, asked for by a doorbell that released
  // `released`: the report (empty if none) when a kernel thread wrote them later.
  std::string agent_read(const std::string& agent, const void* ptr, std::size_t bytes, uint64_t released,
                         const char* op, Loc loc);

  // RAILYARD_SIM_MEMORY_MODEL=weak|sc, if set, overrides the configured model.
  static MemoryModel from_environment(MemoryModel configured);

 private:
  struct KernelInfo {
    std::string name;
    int device = 0;
    Dim3 grid, block;
  };
  uint64_t tick() { return ++now_; }
  void write(Fiber* f, const void* ptr, std::size_t bytes, bool strong, const char* op, Loc loc);
  // `known`: what the accessing thread (or its async proxy) knows.
  void check_read(const Fiber* f, uint64_t known, const void* ptr, std::size_t bytes, const char* op, Loc loc);
  [[noreturn]] void report_stale_read(const Fiber* f, const Access& write, uintptr_t addr, std::size_t bytes,
                                      const char* op, Loc loc) const;
  void record_read(Fiber* f, const void* ptr, std::size_t bytes, const char* op, Loc loc);
  void check_overwrite(const Fiber* f, uint64_t known, const WordRecord& r, uintptr_t addr, std::size_t bytes,
                       const char* op, Loc loc) const;
  void observe(Fiber* f, const SyncRecord& r, Order order, Scope scope, const char* op, Loc loc) const;
  void ring_doorbell(const Fiber* f, const void* ptr, std::size_t bytes, Order order, Scope scope, const char* op,
                     Loc loc);
  std::string thread_name(uint64_t id) const;
  // fn(words) with the records that hold address `addr` as `f` sees it: its block's
  // dense shared-memory records, or global memory's ranges.
  template <class Fn>
  void with_words(const Fiber* f, uintptr_t addr, Fn&& fn);

  bool enabled_ = false;
  uint64_t now_ = 0;
  RangeMap<WordRecord> words_;                        // global memory, by address / kWordBytes
  std::unordered_map<uintptr_t, SyncRecord> sync_;    // by address
  std::unordered_map<uint64_t, KernelInfo> kernels_;  // by launch id
  struct Doorbell {
    uintptr_t end = 0;
    uint64_t released = 0;  // what its last store released to the system
  };
  std::map<uintptr_t, Doorbell> doorbells_;            // by start
  // The doorbell overlapping [ptr, ptr + bytes), if any.
  Doorbell* find_doorbell(const void* ptr, std::size_t bytes);
  // Agents' thread ids are kAgent | index into agents_ (their names).
  static constexpr uint64_t kAgent = uint64_t{1} << 63;
  std::vector<std::string> agents_;
  uint64_t agent_id(const std::string& agent);
};

}  // namespace railyard::sim::detail
