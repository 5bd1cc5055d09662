// Railyard simulator internals: async-proxy separation. Not a public header.
//
// Hopper's bulk copies (cp.async.bulk, "TMA") access memory through the async proxy;
// ld/st/atom through the generic proxy. The two are not ordered with each other by
// the ordinary release/acquire machinery (mbarrier arrive/wait, bar.sync, flags):
//  - a generic access followed by a bulk copy of the same bytes needs a
//    fence.proxy.async (of the bytes' state space) after the access, before the copy;
//  - a generic access of bytes a bulk copy writes needs the copy's completion to be
//    observed first (the mbarrier phase that carried its transaction bytes, or
//    cp.async.bulk.wait_group), which carries an implicit generic-async proxy fence.
// The tracker keeps, per 16-byte granule (the bulk-copy unit), the last generic read
// and write, and the last bulk-copy read and write (for global memory: the bulk
// writes not yet waited for, as ranges), and reports a ProxyRace when an access is
// not ordered after them. docs/simulator.md ("Async-proxy separation") states the
// rules and what they leave out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <unordered_map>
#include <vector>

#include "railyard/sim/device.hpp"

namespace railyard::sim::detail {

struct Block;
struct Fiber;
struct KernelRun;
using device::Loc;
using device::ProxySpace;

// One thread's proxy state. It lives in its KernelRun, not in its fiber: records of
// global memory outlive the block that made them, until the kernel ends.
struct ThreadProxyState {
  uint32_t fences[2] = {0, 0};    // fence.proxy.async executed, by ProxySpace
  uint64_t groups_committed = 0;  // bulk groups committed: the serial of the open group
  uint64_t reads_waited = 0;      // leading groups whose source reads it waited for
  uint64_t writes_waited = 0;     // leading groups whose writes it waited for
  // Its shared->global copies whose writes it has not waited for: (group, start).
  std::vector<std::pair<uint64_t, uintptr_t>> pending_writes;
};

// A generic-proxy access of a granule (kernel null: none).
struct GenericAccess {
  const KernelRun* kernel = nullptr;
  uint32_t thread = 0;  // linear thread index in the kernel, block-major
  uint32_t fences = 0;  // the thread's fence count for the granule's space at the access
  Loc loc{};
};

// A bulk-copy access (kernel null: none). A global->shared write completes with phase
// `serial` of mbarrier `mbarrier` (an id within the block); a shared->global copy's
// read and write complete when its issuer's wait_group covers bulk group `serial`.
struct AsyncAccess {
  const KernelRun* kernel = nullptr;
  uint32_t thread = 0;  // the issuing thread
  uint32_t mbarrier = 0;
  uint64_t serial = 0;
  Loc loc{};
};

// Shared memory: a dense shadow per block, one entry per 16-byte granule, in a compact
// form of the records above (40 bytes, not 112: the records of a block's shared memory
// are read on every ld/st.shared and then mostly stay in the host core's L2 cache).
// The kernel is the block's; `thread` is the thread's index in the block plus one (0:
// no access); `loc` is the ProxyTracker's number of the source location.
struct SharedGeneric {
  uint16_t thread = 0;
  uint16_t loc = 0;
  uint32_t fences = 0;
};
struct SharedAsync {
  uint16_t thread = 0;
  uint16_t loc = 0;
  uint16_t mbarrier = 0;
  uint32_t serial = 0;
};
struct SharedGranule {
  SharedGeneric generic_read, generic_write;
  SharedAsync async_read, async_write;
};
static_assert(sizeof(SharedGranule) == 40);

// Global memory: generic accesses by granule; bulk writes whose issuer has not
// waited for them as ranges (rows are large, and a range goes once it is waited for).
struct GlobalGranule {
  GenericAccess generic_read, generic_write;
};
struct GlobalBulkWrite {
  uintptr_t end = 0;
  AsyncAccess access;
};

// Elementwise maximum: what a thread knows of mbarrier phases (index: the barrier's id
// in its block, value: phases it knows completed) joined with what another knew.
inline void join_phases(std::vector<uint64_t>& into, const std::vector<uint64_t>& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (std::size_t i = 0; i < from.size(); ++i) into[i] = into[i] < from[i] ? from[i] : into[i];
}

class ProxyTracker {
 public:
  static constexpr std::size_t kGranuleBytes = 16;

  // Every tracked generic access: ld/st/atom through the arch wrappers and builtins.
  void generic(Fiber* f, const void* ptr, std::size_t bytes, bool write, bool shared, const char* op, Loc loc);
  void fence(Fiber* f, ProxySpace space);
  // At issue: checks against earlier accesses, then records the copy.
  void bulk_g2s(Fiber* f, void* smem_dst, const void* gmem_src, uint32_t bytes, uint32_t mbarrier,
                uint64_t phase, Loc loc);
  void bulk_s2g(Fiber* f, void* gmem_dst, const void* smem_src, uint32_t bytes, Loc loc);
  void bulk_commit(Fiber* f);
  void bulk_waited(Fiber* f, unsigned max_pending, bool read_only);
  // A kernel ended (or was torn down): its records of global memory go.
  void forget_kernel(const KernelRun* k);
  void reset() {
    global_.clear();
    global_pages_.clear();
    bulk_writes_.clear();
  }

 private:
  void generic_shared(Fiber* f, uintptr_t addr, std::size_t bytes, bool write, const char* op, Loc loc);
  void generic_global(Fiber* f, uintptr_t addr, std::size_t bytes, bool write, const char* op, Loc loc);
  void check_global_source(uintptr_t addr, std::size_t bytes, const char* op, Loc loc);
  void check_global_destination(uintptr_t addr, std::size_t bytes, const char* op, Loc loc);
  const GlobalBulkWrite* pending_bulk_write(uintptr_t addr, std::size_t bytes) const;
  SharedGranule* shared_granules(Block* b, uintptr_t addr);
  void make_shared_granules(Block* b);
  // Numbers for source locations (0: none), and back. Consecutive accesses mostly
  // come from a few lines (a block's threads run one after another, each through the
  // same loop): the last kRecentLocs locations are compared first.
  uint16_t loc_number(Loc loc) {
    uintptr_t key = 0;
    std::memcpy(&key, &loc, sizeof key);
    for (const LocCacheEntry& e : recent_locs_)
      if (e.key == key) return e.number;
    return loc_number_slow(key, loc);
  }
  uint16_t loc_number_slow(uintptr_t key, Loc loc);
  Loc loc_of(uint16_t number) const { return locs_[number]; }
  // Compact shared-memory records, and their full form for reports.
  SharedGeneric shared_generic(const Fiber* f, Loc loc);
  SharedAsync shared_async(const Fiber* f, uint32_t mbarrier, uint64_t serial, Loc loc);
  GenericAccess expand(const Block* b, const SharedGeneric& r) const;
  AsyncAccess expand(const Block* b, const SharedAsync& r) const;
  // The records of granules [first, last) that exist, in address order.
  template <class Fn>
  void for_each_global(uintptr_t first, uintptr_t last, Fn&& fn) const;

  static constexpr uintptr_t kPageGranules = 256;  // 4 KiB
  std::unordered_map<uintptr_t, GlobalGranule> global_;  // by address / 16
  // Records in global_ by granule / kPageGranules: a bulk copy of a 16 KiB row that no
  // generic access touched looks up 4 pages, not 1024 granules.
  std::unordered_map<uintptr_t, uint32_t> global_pages_;
  std::map<uintptr_t, GlobalBulkWrite> bulk_writes_;      // by start address
  // Source locations by number (locs_[0]: none), and a direct-mapped cache in front of
  // the map from a location's bits to its number: one compare per access.
  std::vector<Loc> locs_{Loc{}};
  std::unordered_map<uintptr_t, uint16_t> loc_numbers_;
  struct LocCacheEntry {
    uintptr_t key = 0;
    uint16_t number = 0;
  };
  std::vector<LocCacheEntry> loc_cache_ = std::vector<LocCacheEntry>(1024);
  static constexpr std::size_t kRecentLocs = 4;
  LocCacheEntry recent_locs_[kRecentLocs];  // replaced round-robin
  std::size_t next_recent_loc_ = 0;
};

}  // namespace railyard::sim::detail
