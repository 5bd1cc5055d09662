// Railyard simulator: async-proxy separation (proxy.hpp, docs/simulator.md).
#include "proxy.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "engine.hpp"

namespace railyard::sim::detail {

namespace {

constexpr uintptr_t kGranule = ProxyTracker::kGranuleBytes;

std::size_t space_index(ProxySpace space) { return space == ProxySpace::SharedCta ? 0 : 1; }

const char* fence_name(ProxySpace space) {
  return space == ProxySpace::SharedCta ? "fence.proxy.async.shared::cta" : "fence.proxy.async.global";
}

const ThreadProxyState& state_of(const KernelRun* k, uint32_t thread) { return k->proxy_threads[thread]; }

// The thread fenced this space after the access (or there was none).
bool fenced(const GenericAccess& a, ProxySpace space) {
  return a.kernel == nullptr || state_of(a.kernel, a.thread).fences[space_index(space)] > a.fences;
}


std::string hex(uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", reinterpret_cast<void*>(a));
  return buf;
}

std::string bytes_of(uintptr_t addr, std::size_t bytes, bool shared) {
  return "[" + hex(addr) + ", +" + std::to_string(bytes) + ") of " + (shared ? "shared" : "global") + " memory";
}

std::string dim3(const Dim3& d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

// "thread (x,y,z) of block (x,y,z) of kernel 'name' on device d".
std::string thread_name(const KernelRun* k, uint32_t thread) {
  const Dim3 g = k->config.grid, b = k->config.block;
  const unsigned per_block = b.count(), block = thread / per_block, t = thread % per_block;
  return "thread " + dim3(Dim3(t % b.x, (t / b.x) % b.y, t / (b.x * b.y))) + " of block " +
         dim3(Dim3(block % g.x, (block / g.x) % g.y, block / (g.x * g.y))) + " of kernel '" + k->config.name +
         "' on device " + std::to_string(k->device);
}

std::string unfenced(const GenericAccess& a, bool write, ProxySpace space) {
  return "which " + thread_name(a.kernel, a.thread) + (write ? " wrote" : " read") +
         " with a generic-proxy access at " + format_loc(a.loc) + " and has not executed " + fence_name(space) +
         " since";
}

std::string copy_at(const AsyncAccess& a, const char* what) {
  return std::string("the bulk copy (") + what + ") issued at " + format_loc(a.loc) + " by " +
         thread_name(a.kernel, a.thread);
}

std::string unobserved_g2s(const AsyncAccess& w) {
  return "which " + copy_at(w, "global to shared") + " writes; this thread has not observed its completion (a wait " +
         "on its mbarrier that sees phase " + std::to_string(w.serial) + " complete, or a barrier after such a wait)";
}

std::string unwaited_s2g_read(const AsyncAccess& r) {
  return "which " + copy_at(r, "shared to global") +
         " may still be reading; its issuer has not waited for it with bulk_wait_group_read";
}

std::string unwaited_s2g_write(const AsyncAccess& w) {
  return "which " + copy_at(w, "shared to global") +
         " may still be writing; its issuer has not waited for it with bulk_wait_group";
}

[[noreturn]] void race(const std::string& message, Loc loc) {
  Engine::get().fault(ErrorKind::ProxyRace, message, loc);
}

// Replaces a record unless it holds another thread's access that is not fenced yet:
// that one is the older offender, and a later bulk copy must still see it.
void remember(GenericAccess& slot, const GenericAccess& access, ProxySpace space) {
  if (slot.kernel == nullptr || (slot.kernel == access.kernel && slot.thread == access.thread) ||
      fenced(slot, space))
    slot = access;
}

// The same for the compact records of a block's shared memory.
const ThreadProxyState& shared_thread(const Block* b, uint16_t thread) {
  return b->kernel->proxy_threads[b->first_thread + thread - 1u];
}
bool fenced(const Block* b, const SharedGeneric& a) {
  return a.thread == 0 || shared_thread(b, a.thread).fences[space_index(ProxySpace::SharedCta)] > a.fences;
}
// The thread knows that the global->shared copy's mbarrier phase completed.
bool g2s_observed(const Fiber* f, const SharedAsync& w) {
  return w.thread == 0 || (w.mbarrier < f->phases_seen.size() && f->phases_seen[w.mbarrier] > w.serial);
}
// The issuer waited (bulk_wait_group_read or bulk_wait_group) for the copy's source read.
bool s2g_read_waited(const Block* b, const SharedAsync& r) {
  return r.thread == 0 || shared_thread(b, r.thread).reads_waited > r.serial;
}
void remember(const Block* b, SharedGeneric& slot, const SharedGeneric& access) {
  if (slot.thread == 0 || slot.thread == access.thread || fenced(b, slot)) slot = access;
}

GenericAccess generic_access(const Fiber* f, ProxySpace space, Loc loc) {
  return GenericAccess{f->block->kernel, f->kernel_thread, f->proxy->fences[space_index(space)], loc};
}

AsyncAccess async_access(const Fiber* f, uint32_t mbarrier, uint64_t serial, Loc loc) {
  return AsyncAccess{f->block->kernel, f->kernel_thread, mbarrier, serial, loc};
}

}  // namespace

uint16_t ProxyTracker::loc_number_slow(uintptr_t key, Loc loc) {
  static_assert(sizeof(Loc) == sizeof(uintptr_t) && std::is_trivially_copyable_v<Loc>);
  LocCacheEntry& cached = loc_cache_[(key * 0x9E3779B97F4A7C15ull) >> 54];
  if (cached.key != key) {
    auto [it, added] = loc_numbers_.try_emplace(key, uint16_t{0});
    // Past 65,535 distinct call sites a location is recorded as none (reports print ":0").
    if (added && locs_.size() <= UINT16_MAX) {
      it->second = static_cast<uint16_t>(locs_.size());
      locs_.push_back(loc);
    }
    cached = LocCacheEntry{key, it->second};
  }
  recent_locs_[next_recent_loc_++ % kRecentLocs] = cached;
  return cached.number;
}

SharedGeneric ProxyTracker::shared_generic(const Fiber* f, Loc loc) {
  return SharedGeneric{static_cast<uint16_t>(f->tid + 1), loc_number(loc),
                       f->proxy->fences[space_index(ProxySpace::SharedCta)]};
}

SharedAsync ProxyTracker::shared_async(const Fiber* f, uint32_t mbarrier, uint64_t serial, Loc loc) {
  if (mbarrier > UINT16_MAX || serial > UINT32_MAX)
    Engine::get().fault(ErrorKind::Misuse,
                        "simulator limit: a bulk copy into shared memory completes on mbarrier number " +
                            std::to_string(mbarrier) + " of its block at phase " + std::to_string(serial) +
                            " (at most 65,535 barriers per block and 2^32 phases or bulk groups per thread)",
                        loc);
  return SharedAsync{static_cast<uint16_t>(f->tid + 1), loc_number(loc), static_cast<uint16_t>(mbarrier),
                     static_cast<uint32_t>(serial)};
}

GenericAccess ProxyTracker::expand(const Block* b, const SharedGeneric& r) const {
  if (r.thread == 0) return GenericAccess{};
  return GenericAccess{b->kernel, b->first_thread + r.thread - 1u, r.fences, loc_of(r.loc)};
}

AsyncAccess ProxyTracker::expand(const Block* b, const SharedAsync& r) const {
  if (r.thread == 0) return AsyncAccess{};
  return AsyncAccess{b->kernel, b->first_thread + r.thread - 1u, r.mbarrier, r.serial, loc_of(r.loc)};
}

void ProxyTracker::make_shared_granules(Block* b) {
  b->proxy_granules.resize((b->smem_bytes + kGranule - 1) / kGranule);
}

inline SharedGranule* ProxyTracker::shared_granules(Block* b, uintptr_t addr) {
  if (b->proxy_granules.empty()) [[unlikely]] make_shared_granules(b);
  return &b->proxy_granules[(addr - reinterpret_cast<uintptr_t>(b->smem.get())) / kGranule];
}

const GlobalBulkWrite* ProxyTracker::pending_bulk_write(uintptr_t addr, std::size_t bytes) const {
  // Live ranges do not overlap (a second write of pending bytes is itself a race),
  // so only the last range starting below the end can reach into [addr, addr+bytes).
  auto it = bulk_writes_.lower_bound(addr + bytes);
  if (it == bulk_writes_.begin()) return nullptr;
  --it;
  return it->second.end > addr ? &it->second : nullptr;
}

// ---- generic accesses -------------------------------------------------------------------------
void ProxyTracker::generic(Fiber* f, const void* ptr, std::size_t bytes, bool write, bool shared, const char* op,
                           Loc loc) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  if (shared) generic_shared(f, addr, bytes, write, op, loc);
  else generic_global(f, addr, bytes, write, op, loc);
}

void ProxyTracker::generic_shared(Fiber* f, uintptr_t addr, std::size_t bytes, bool write, const char* op,
                                  Loc loc) {
  const uintptr_t first = addr / kGranule, last = (addr + bytes - 1) / kGranule;
  Block* b = f->block;
  SharedGranule* g = shared_granules(b, addr);
  const SharedGeneric access = shared_generic(f, loc);
  for (uintptr_t i = 0; i <= last - first; ++i) {
    if (!g2s_observed(f, g[i].async_write))
      race(std::string(op) + (write ? " writes " : " reads ") + bytes_of(addr, bytes, true) + ", " +
               unobserved_g2s(expand(b, g[i].async_write)),
           loc);
    if (write && !s2g_read_waited(b, g[i].async_read))
      race(std::string(op) + " overwrites " + bytes_of(addr, bytes, true) + ", " +
               unwaited_s2g_read(expand(b, g[i].async_read)),
           loc);
    remember(b, write ? g[i].generic_write : g[i].generic_read, access);
  }
}

void ProxyTracker::generic_global(Fiber* f, uintptr_t addr, std::size_t bytes, bool write, const char* op,
                                  Loc loc) {
  if (const GlobalBulkWrite* w = pending_bulk_write(addr, bytes))
    race(std::string(op) + (write ? " writes " : " reads ") + bytes_of(addr, bytes, false) + ", " +
             unwaited_s2g_write(w->access),
         loc);
  const GenericAccess access = generic_access(f, ProxySpace::Global, loc);
  for (uintptr_t i = addr / kGranule; i <= (addr + bytes - 1) / kGranule; ++i) {
    const auto [it, added] = global_.try_emplace(i);
    if (added) ++global_pages_[i / kPageGranules];
    GlobalGranule& g = it->second;
    remember(write ? g.generic_write : g.generic_read, access, ProxySpace::Global);
  }
}

template <class Fn>
void ProxyTracker::for_each_global(uintptr_t first, uintptr_t last, Fn&& fn) const {
  for (uintptr_t page = first / kPageGranules; page * kPageGranules < last; ++page) {
    if (!global_pages_.contains(page)) continue;
    const uintptr_t from = std::max(first, page * kPageGranules), to = std::min(last, (page + 1) * kPageGranules);
    for (uintptr_t i = from; i < to; ++i) {
      auto it = global_.find(i);
      if (it != global_.end()) fn(i, it->second);
    }
  }
}

void ProxyTracker::fence(Fiber* f, ProxySpace space) { ++f->proxy->fences[space_index(space)]; }

// ---- bulk copies --------------------------------------------------------------------------------
// Global bytes a bulk copy reads: no generic write pending a fence, no bulk write pending a wait.
void ProxyTracker::check_global_source(uintptr_t addr, std::size_t bytes, const char* op, Loc loc) {
  if (const GlobalBulkWrite* w = pending_bulk_write(addr, bytes))
    race(std::string(op) + " reads " + bytes_of(addr, bytes, false) + ", " + unwaited_s2g_write(w->access), loc);
  for_each_global(addr / kGranule, (addr + bytes) / kGranule, [&](uintptr_t i, const GlobalGranule& g) {
    if (!fenced(g.generic_write, ProxySpace::Global))
      race(std::string(op) + " reads " + bytes_of(i * kGranule, kGranule, false) + ", " +
               unfenced(g.generic_write, true, ProxySpace::Global),
           loc);
  });
}

// Global bytes a bulk copy writes: also no generic read pending a fence.
void ProxyTracker::check_global_destination(uintptr_t addr, std::size_t bytes, const char* op, Loc loc) {
  if (const GlobalBulkWrite* w = pending_bulk_write(addr, bytes))
    race(std::string(op) + " writes " + bytes_of(addr, bytes, false) + ", " + unwaited_s2g_write(w->access), loc);
  for_each_global(addr / kGranule, (addr + bytes) / kGranule, [&](uintptr_t i, const GlobalGranule& g) {
    for (const bool write : {true, false}) {
      const GenericAccess& a = write ? g.generic_write : g.generic_read;
      if (!fenced(a, ProxySpace::Global))
        race(std::string(op) + " writes " + bytes_of(i * kGranule, kGranule, false) + ", " +
                 unfenced(a, write, ProxySpace::Global),
             loc);
    }
  });
}

void ProxyTracker::bulk_g2s(Fiber* f, void* smem_dst, const void* gmem_src, uint32_t bytes, uint32_t mbarrier,
                            uint64_t phase, Loc loc) {
  const char* op = "bulk_copy_g2s";
  const auto dst = reinterpret_cast<uintptr_t>(smem_dst);
  check_global_source(reinterpret_cast<uintptr_t>(gmem_src), bytes, op, loc);
  Block* b = f->block;
  SharedGranule* g = shared_granules(b, dst);
  for (uint32_t i = 0; i < bytes / kGranule; ++i) {
    const uintptr_t at = dst + i * kGranule;
    for (const bool write : {true, false}) {
      const SharedGeneric& a = write ? g[i].generic_write : g[i].generic_read;
      if (!fenced(b, a))
        race(std::string(op) + " writes " + bytes_of(at, kGranule, true) + ", " +
                 unfenced(expand(b, a), write, ProxySpace::SharedCta),
             loc);
    }
    if (!g2s_observed(f, g[i].async_write))
      race(std::string(op) + " writes " + bytes_of(at, kGranule, true) + ", " +
               unobserved_g2s(expand(b, g[i].async_write)),
           loc);
    if (!s2g_read_waited(b, g[i].async_read))
      race(std::string(op) + " writes " + bytes_of(at, kGranule, true) + ", " +
               unwaited_s2g_read(expand(b, g[i].async_read)),
           loc);
  }
  const SharedAsync access = shared_async(f, mbarrier, phase, loc);
  for (uint32_t i = 0; i < bytes / kGranule; ++i) g[i].async_write = access;
}

void ProxyTracker::bulk_s2g(Fiber* f, void* gmem_dst, const void* smem_src, uint32_t bytes, Loc loc) {
  const char* op = "bulk_copy_s2g";
  const auto src = reinterpret_cast<uintptr_t>(smem_src), dst = reinterpret_cast<uintptr_t>(gmem_dst);
  Block* b = f->block;
  SharedGranule* g = shared_granules(b, src);
  for (uint32_t i = 0; i < bytes / kGranule; ++i) {
    const uintptr_t at = src + i * kGranule;
    if (!fenced(b, g[i].generic_write))
      race(std::string(op) + " reads " + bytes_of(at, kGranule, true) + ", " +
               unfenced(expand(b, g[i].generic_write), true, ProxySpace::SharedCta),
           loc);
    if (!g2s_observed(f, g[i].async_write))
      race(std::string(op) + " reads " + bytes_of(at, kGranule, true) + ", " +
               unobserved_g2s(expand(b, g[i].async_write)),
           loc);
  }
  check_global_destination(dst, bytes, op, loc);
  ThreadProxyState& self = *f->proxy;
  const AsyncAccess access = async_access(f, 0, self.groups_committed, loc);
  const SharedAsync read = shared_async(f, 0, self.groups_committed, loc);
  for (uint32_t i = 0; i < bytes / kGranule; ++i) g[i].async_read = read;
  bulk_writes_[dst] = GlobalBulkWrite{dst + bytes, access};
  self.pending_writes.emplace_back(self.groups_committed, dst);
}

void ProxyTracker::bulk_commit(Fiber* f) { ++f->proxy->groups_committed; }

// After a wait that leaves at most `max_pending` of the thread's committed groups
// pending: the others have read their sources (and, unless read_only, written).
void ProxyTracker::bulk_waited(Fiber* f, unsigned max_pending, bool read_only) {
  ThreadProxyState& self = *f->proxy;
  const uint64_t done = self.groups_committed > max_pending ? self.groups_committed - max_pending : 0;
  self.reads_waited = std::max(self.reads_waited, done);
  if (read_only) return;
  self.writes_waited = std::max(self.writes_waited, done);
  const KernelRun* k = f->block->kernel;
  std::erase_if(self.pending_writes, [&](const std::pair<uint64_t, uintptr_t>& w) {
    if (w.first >= done) return false;
    auto it = bulk_writes_.find(w.second);
    const AsyncAccess& a = it == bulk_writes_.end() ? AsyncAccess{} : it->second.access;
    if (a.kernel == k && a.thread == f->kernel_thread && a.serial == w.first) bulk_writes_.erase(it);
    return true;
  });
}

void ProxyTracker::forget_kernel(const KernelRun* k) {
  for (auto it = global_.begin(); it != global_.end();) {
    GlobalGranule& g = it->second;
    if (g.generic_read.kernel == k) g.generic_read = GenericAccess{};
    if (g.generic_write.kernel == k) g.generic_write = GenericAccess{};
    if (g.generic_read.kernel != nullptr || g.generic_write.kernel != nullptr) {
      ++it;
      continue;
    }
    auto page = global_pages_.find(it->first / kPageGranules);
    if (--page->second == 0) global_pages_.erase(page);
    it = global_.erase(it);
  }
  std::erase_if(bulk_writes_, [k](const auto& entry) { return entry.second.access.kernel == k; });
}

}  // namespace railyard::sim::detail
