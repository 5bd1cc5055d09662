// Railyard simulator: device-side hooks (include/railyard/sim/device.hpp).
#include <cstdio>
#include <cstring>
#include <string>

#include "engine.hpp"
#include "mutation.hpp"

namespace railyard::sim::device {

using detail::AsyncOp;
using detail::Block;
using detail::Engine;
using detail::Fiber;
using detail::Mbarrier;
using detail::WaitInfo;
using detail::WeakMemory;
namespace mutation = detail::mutation;

namespace {

Engine& engine() { return Engine::get(); }
Fiber* self() { return engine().current(); }

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

[[noreturn]] void fail(ErrorKind kind, const std::string& message, Loc loc) {
  engine().fault(kind, message, loc);
}

bool in_smem(const Block* b, const void* ptr, std::size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  const auto base = reinterpret_cast<uintptr_t>(b->smem.get());
  return a >= base && a < base + std::max<std::size_t>(b->smem_bytes, 1) && a + bytes <= base + b->smem_bytes;
}

bool near_smem(const Block* b, const void* ptr) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  const auto base = reinterpret_cast<uintptr_t>(b->smem.get());
  return a >= base && a < base + b->smem_bytes + 4096;
}

// The reports of failed checks, out of the checks' way: a check that passes is a few
// compares.
[[noreturn, gnu::cold, gnu::noinline]] void misaligned(const void* ptr, std::size_t align, const char* op, Loc loc) {
  fail(ErrorKind::Misaligned,
       std::string(op) + ": address " + hex(ptr) + " is not " + std::to_string(align) + "-byte aligned", loc);
}

[[noreturn, gnu::cold, gnu::noinline]] void outside_allocations(const void* ptr, std::size_t bytes, const char* op,
                                                                Loc loc) {
  // Name the nearest allocation below the address: the usual culprit of an overrun.
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::string nearest;
  if (const detail::Allocation* below = engine().nearest_below(ptr))
    nearest = "; it starts " + std::to_string(addr - (below->base + below->bytes)) +
              " bytes past the end of the nearest allocation below it, '" + below->label + "' [" +
              hex(reinterpret_cast<void*>(below->base)) + ", +" + std::to_string(below->bytes) + ")";
  fail(ErrorKind::OutOfBounds,
       std::string(op) + ": access [" + hex(ptr) + ", +" + std::to_string(bytes) +
           ") is not inside any simulated allocation" + nearest,
       loc);
}

[[noreturn, gnu::cold, gnu::noinline]] void past_allocation(const detail::Allocation* a, const void* ptr,
                                                            std::size_t bytes, const char* op, Loc loc) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  fail(ErrorKind::OutOfBounds,
       std::string(op) + ": access [" + hex(ptr) + ", +" + std::to_string(bytes) + ") runs " +
           std::to_string(addr + bytes - (a->base + a->bytes)) + " bytes past the end of allocation '" + a->label +
           "' [" + hex(reinterpret_cast<void*>(a->base)) + ", +" + std::to_string(a->bytes) + ") of " +
           (a->device < 0 ? std::string("pinned host memory") : "device " + std::to_string(a->device)),
       loc);
}

[[noreturn, gnu::cold, gnu::noinline]] void no_peer_access(const detail::Allocation* a, int dev, const char* op,
                                                           Loc loc) {
  fail(ErrorKind::PeerAccess,
       std::string(op) + ": device " + std::to_string(dev) + " accessed allocation '" + a->label + "' of device " +
           std::to_string(a->device) + " without peer access enabled",
       loc);
}

[[noreturn, gnu::cold, gnu::noinline]] void outside_smem(const Block* b, const void* ptr, std::size_t bytes,
                                                         const char* op, Loc loc) {
  fail(ErrorKind::OutOfBounds,
       std::string(op) + ": shared-memory access [" + hex(ptr) + ", +" + std::to_string(bytes) +
           ") is outside this block's dynamic shared memory [" + hex(b->smem.get()) + ", +" +
           std::to_string(b->smem_bytes) + ")",
       loc);
}

void check_alignment(const void* ptr, std::size_t align, const char* op, Loc loc) {
  if (align > 1 && reinterpret_cast<uintptr_t>(ptr) % align != 0) misaligned(ptr, align, op, loc);
}

// Global access check; returns the allocation (its device, -1 pinned host, for
// accounting; its simulated address for the timed L1).
const detail::Allocation* check_global_impl(const void* ptr, std::size_t bytes, std::size_t align, const char* op,
                                            Loc loc) {
  Engine& e = engine();
  const detail::Allocation* a = e.find(ptr);
  if (!a) outside_allocations(ptr, bytes, op, loc);
  if (reinterpret_cast<uintptr_t>(ptr) + bytes > a->base + a->bytes) past_allocation(a, ptr, bytes, op, loc);
  check_alignment(ptr, align, op, loc);
  const int dev = self()->block->kernel->device;
  if (a->device >= 0 && a->device != dev && !e.device(dev).peer[a->device]) no_peer_access(a, dev, op, loc);
  return a;
}

void forget_polls(Fiber* f) {
  f->polls.clear();
  f->idle_parks = 0;
}

// True when this fiber saw exactly these bytes at this address before, since it last
// changed memory; records the observation otherwise.
// `memory`: the value is the bytes at ptr (false: an mbarrier's phases).
bool idle_poll(Fiber* f, const void* ptr, const void* data, std::size_t bytes, bool memory = true) {
  uint64_t v[2] = {0, 0};
  std::memcpy(v, data, bytes);
  for (auto& r : f->polls) {
    if (r.addr == ptr && r.bytes == bytes && r.memory == memory) {
      const bool same = r.value[0] == v[0] && r.value[1] == v[1];
      r.value[0] = v[0];
      r.value[1] = v[1];
      if (!same) f->idle_parks = 0;
      return same;
    }
  }
  if (f->polls.size() >= 256) f->polls.erase(f->polls.begin());
  f->polls.push_back({ptr, bytes, {v[0], v[1]}, memory});
  f->idle_parks = 0;
  return false;
}

}  // namespace

// ---- identity ---------------------------------------------------------------------------------
const Dim3& thread_idx() { return self()->thread_idx; }
const Dim3& block_idx() { return self()->block->idx; }
const Dim3& block_dim() { return self()->block->kernel->config.block; }
const Dim3& grid_dim() { return self()->block->kernel->config.grid; }
unsigned linear_thread_idx() { return self()->tid; }
int current_device() { return self()->block->kernel->device; }
uint8_t* dynamic_smem() { return self()->block->smem.get(); }
std::size_t dynamic_smem_bytes() { return self()->block->smem_bytes; }

// ---- barriers -----------------------------------------------------------------------------------
namespace {
void barrier(unsigned id, unsigned num_threads, bool wait, const char* what, Loc loc) {
  Engine& e = engine();
  Fiber* f = self();
  Block* b = f->block;
  const unsigned block_threads = static_cast<unsigned>(b->fibers.size());
  if (id >= 16) fail(ErrorKind::Misuse, std::string(what) + ": barrier id " + std::to_string(id) + " is not in 0..15", loc);
  if (num_threads == 0 || num_threads > (block_threads + 31) / 32 * 32 ||
      (num_threads % 32 != 0 && num_threads != block_threads))
    fail(ErrorKind::Misuse,
         std::string(what) + ": thread count " + std::to_string(num_threads) +
             " must be a multiple of 32 and at most the block's " + std::to_string(block_threads) + " threads",
         loc);
  detail::NamedBarrier& bar = b->barriers[id];
  if (bar.expected == 0) bar.expected = num_threads;
  if (bar.expected != num_threads)
    fail(ErrorKind::Misuse,
         std::string(what) + ": barrier " + std::to_string(id) + " used with " + std::to_string(num_threads) +
             " threads while threads already waiting on it use " + std::to_string(bar.expected),
         loc);
  ++bar.arrived;
  e.progress();
  forget_polls(f);
  if (e.timing().enabled()) e.timing().cycles(f, e.timing().model(f->device).barrier_cycles);
  // A barrier orders every participant's earlier accesses before every waiter's later
  // ones: what any of them knew of mbarrier phases, all of them know after it.
  detail::join_phases(bar.phases_seen, f->phases_seen);
  WeakMemory::join(bar.weak_known, f);
  if (bar.arrived == bar.expected) {
    for (Fiber* w : bar.waiters) {
      detail::join_phases(w->phases_seen, bar.phases_seen);
      WeakMemory::learn(w, bar.weak_known);
      e.wake(w);
    }
    detail::join_phases(f->phases_seen, bar.phases_seen);
    WeakMemory::learn(f, bar.weak_known);
    bar.phases_seen.clear();
    bar.weak_known = 0;
    bar.waiters.clear();
    bar.arrived = 0;
    bar.expected = 0;
    e.yield_runnable();
    return;
  }
  if (!wait) {
    e.yield_runnable();
    return;
  }
  bar.waiters.push_back(f);
  WaitInfo wi;
  wi.kind = WaitInfo::Kind::Barrier;
  wi.addr = reinterpret_cast<const void*>(static_cast<uintptr_t>(id));
  wi.a = bar.arrived;
  wi.b = bar.expected;
  wi.what = what;
  wi.loc = loc;
  e.yield_blocked(wi);
}
}  // namespace

// A mutant (mutation.hpp) turns a waiting barrier into an arrival at the same line.
void syncthreads(Loc loc) {
  const bool wait = !mutation::mutated(mutation::SiteKind::BarSync, loc);
  barrier(0, static_cast<unsigned>(self()->block->fibers.size()), wait, "__syncthreads", loc);
}
void named_barrier_sync(unsigned id, unsigned num_threads, Loc loc) {
  barrier(id, num_threads, !mutation::mutated(mutation::SiteKind::BarSync, loc), "bar.sync", loc);
}
void named_barrier_arrive(unsigned id, unsigned num_threads, Loc loc) {
  barrier(id, num_threads, false, "bar.arrive", loc);
}

void warp_collective(uint32_t mask, uint64_t value, uint64_t* all_values, const char* what, Loc loc) {
  if (all_values == nullptr && std::strcmp(what, "__syncwarp") == 0 &&
      mutation::mutated(mutation::SiteKind::Syncwarp, loc))
    return;
  Engine& e = engine();
  Fiber* f = self();
  Block* b = f->block;
  const unsigned lane = f->tid % 32, warp = f->tid / 32;
  char buf[160];
  if (!((mask >> lane) & 1u)) {
    std::snprintf(buf, sizeof buf, "%s: lane %u calls with mask 0x%08x, which does not include itself", what, lane, mask);
    fail(ErrorKind::Misuse, buf, loc);
  }
  const unsigned warp_lanes = std::min<unsigned>(32, static_cast<unsigned>(b->fibers.size()) - warp * 32);
  const uint32_t existing = warp_lanes == 32 ? 0xffffffffu : ((1u << warp_lanes) - 1);
  if (mask & ~existing) {
    std::snprintf(buf, sizeof buf, "%s: mask 0x%08x names lanes that do not exist in this warp (0x%08x)", what, mask, existing);
    fail(ErrorKind::Misuse, buf, loc);
  }
  if (e.timing().enabled()) e.timing().cycles(f, e.timing().model(f->device).warp_collective_cycles);
  // A collective completes once every lane of its mask has executed one with the same
  // mask value (PTX bar.warp.sync, vote.sync, shfl.sync; since sm_70): lanes waiting in
  // one of mask 0xffffffff do not hold back lanes 1..31 meeting in one of 0xfffffffe.
  auto& list = b->warp_collectives[warp];
  detail::WarpCollective* c = nullptr;
  for (auto& x : list)
    if (x.mask == mask) c = &x;
  if (!c) {
    list.emplace_back();
    c = &list.back();
    c->mask = mask;
    c->what = what;
  }
  if (c->what != what && std::strcmp(c->what, what) != 0) {
    std::snprintf(buf, sizeof buf, "%s: lane %u meets lanes 0x%08x that are in %s with the same mask", what, lane,
                  c->arrived, c->what);
    fail(ErrorKind::Misuse, buf, loc);
  }
  c->values[lane] = value;
  c->arrived |= 1u << lane;
  if (c->arrived == mask) {
    // A warp collective is a barrier of its lanes: what any lane knew of mbarrier
    // phases, every lane knows after it.
    // Usually the lanes know the same already (they waited on the same barriers).
    const unsigned first_lane = static_cast<unsigned>(__builtin_ctz(mask));
    const std::vector<uint64_t>& first = b->fibers[warp * 32 + first_lane]->phases_seen;
    bool differ = false;
    for (unsigned l = 0; l < 32 && !differ; ++l)
      differ = ((mask >> l) & 1u) && b->fibers[warp * 32 + l]->phases_seen != first;
    if (differ) {
      std::vector<uint64_t>& seen = b->collective_phases;
      seen.clear();
      for (unsigned l = 0; l < 32; ++l)
        if ((mask >> l) & 1u) detail::join_phases(seen, b->fibers[warp * 32 + l]->phases_seen);
      for (unsigned l = 0; l < 32; ++l)
        if ((mask >> l) & 1u) b->fibers[warp * 32 + l]->phases_seen = seen;
    }
    // Of the warp collectives only __syncwarp (bar.warp.sync) orders memory among its
    // lanes; shuffles and votes synchronise execution, not memory.
    if (e.weak().enabled() && all_values == nullptr && std::strcmp(what, "__syncwarp") == 0)
      WeakMemory::warp_join(b, warp, mask);
    // Deliver the lanes' values (not for __syncwarp, which passes no buffer).
    for (unsigned i = 0; i < c->num_waiters; ++i) {
      Fiber* w = c->waiters[i];
      if (w->collective_out) std::memcpy(w->collective_out, c->values, sizeof c->values);
      e.wake(w);
    }
    if (all_values) std::memcpy(all_values, c->values, sizeof c->values);
    list.erase(list.begin() + (c - list.data()));
    e.yield_runnable();
    return;
  }
  f->collective_out = all_values;
  c->waiters[c->num_waiters++] = f;
  WaitInfo wi;
  wi.kind = WaitInfo::Kind::Warp;
  wi.a = mask;
  wi.b = c->arrived;
  wi.what = what;
  wi.loc = loc;
  e.yield_blocked(wi);
}

// ---- memory --------------------------------------------------------------------------------------
void check_shared(const void* ptr, std::size_t bytes, std::size_t align, const char* op, Loc loc) {
  const Block* b = self()->block;
  if (!in_smem(b, ptr, bytes)) outside_smem(b, ptr, bytes, op, loc);
  check_alignment(ptr, align, op, loc);
}

namespace {
// Checks a global access; returns the owner device and the allocation's offset from
// host to simulated addresses.
std::pair<int, uintptr_t> check_global_at(const void* ptr, std::size_t bytes, std::size_t align, bool write,
                                          const char* op, Loc loc) {
  const detail::Allocation* a = check_global_impl(ptr, bytes, align, op, loc);
  engine().count_traffic(current_device(), a->device, bytes, write);
  return {a->device, a->sim_base - a->base};
}
}  // namespace

int check_global(const void* ptr, std::size_t bytes, std::size_t align, bool write, const char* op, Loc loc) {
  return check_global_at(ptr, bytes, align, write, op, loc).first;
}

namespace {
// The owner check_generic reports for this block's shared memory (-1 is pinned host
// memory, 0.. a device).
constexpr int kSharedMemory = -2;

// Generic addressing: shared if the address is in (or just past) this block's shared
// memory and not in a global allocation. Returns the owner: kSharedMemory, or as
// check_global.
std::pair<int, uintptr_t> check_generic(const void* ptr, std::size_t bytes, std::size_t align, bool write,
                                        const char* op, Loc loc) {
  const Block* b = self()->block;
  if (in_smem(b, ptr, 1) || (near_smem(b, ptr) && !engine().find(ptr))) {
    check_shared(ptr, bytes, align, op, loc);
    return {kSharedMemory, 0};
  }
  return check_global_at(ptr, bytes, align, write, op, loc);
}

// Checks the access, and records it for the async-proxy tracker (every load, store
// and atomic is a generic-proxy access). Returns the owner and offset, as check_generic.
std::pair<int, uintptr_t> check_tracked(const void* ptr, std::size_t bytes, bool write, const char* op, Loc loc) {
  const auto owner = check_generic(ptr, bytes, bytes, write, op, loc);
  engine().proxy().generic(self(), ptr, bytes, write, owner.first == kSharedMemory, op, loc);
  return owner;
}

// Timed mode: where an access by f of memory of `owner` (as check_generic) goes.
detail::Target target(const Fiber* f, std::pair<int, uintptr_t> owner) {
  using Kind = detail::Target::Kind;
  if (owner.first == kSharedMemory) return {Kind::Shared, f->device, 0};
  return {owner.first == f->device ? Kind::Local : Kind::Remote, owner.first, owner.second};
}

bool is_release(const char* op) { return std::strstr(op, ".release") || std::strstr(op, "acq_rel"); }
}  // namespace

void check_global_or_shared(const void* ptr, std::size_t bytes, std::size_t align, bool write, const char* op,
                            Loc loc) {
  check_generic(ptr, bytes, align, write, op, loc);
}

void load(const void* ptr, void* data, std::size_t bytes, Order order, Scope scope, const char* op, Loc loc) {
  if (order == Order::Acquire && mutation::mutated(mutation::SiteKind::Acquire, loc)) order = Order::Relaxed;
  const auto owner = check_tracked(ptr, bytes, false, op, loc);
  Engine& e = engine();
  Fiber* f = self();
  e.catch_up();
  std::memcpy(data, ptr, bytes);
  if (e.weak().enabled()) e.weak().load(f, ptr, bytes, order, scope, op, loc);
  const auto timed_load = [&] {
    if (e.timing().enabled())
      e.timing().load(f, target(f, owner), ptr, bytes, order != Order::Plain,
                      order == Order::Acquire && scope != Scope::Block, scope == Scope::System);
  };
  timed_load();
  if (order == Order::Plain) {
    // Timed mode: every access is an event at its thread's time, so that the pipes
    // see their transfers in time order (a thread running ahead would queue its
    // later accesses before other threads' earlier ones).
    if (e.timing().enabled()) e.yield_runnable();
    return;
  }
  if (idle_poll(f, ptr, data, bytes)) {
    WaitInfo wi;
    wi.kind = WaitInfo::Kind::Poll;
    wi.addr = ptr;
    std::memcpy(&wi.a, data, std::min<std::size_t>(bytes, 8));
    wi.what = op;
    wi.loc = loc;
    e.yield_parked(wi);
    std::memcpy(data, ptr, bytes);  // return what is there now
    if (e.weak().enabled()) e.weak().load(f, ptr, bytes, order, scope, op, loc);
    timed_load();
    idle_poll(f, ptr, data, bytes);
    return;
  }
  e.yield_runnable();
}

void store(void* ptr, const void* data, std::size_t bytes, Order order, Scope scope, const char* op, Loc loc) {
  if (order == Order::Release && mutation::mutated(mutation::SiteKind::Release, loc)) order = Order::Relaxed;
  const auto owner = check_tracked(ptr, bytes, true, op, loc);
  Engine& e = engine();
  if (e.timing().enabled() && order == Order::Release) e.timing().release(self(), static_cast<int>(scope));
  e.catch_up();
  std::memcpy(ptr, data, bytes);
  if (e.weak().enabled()) e.weak().store(self(), ptr, bytes, order, scope, op, loc);
  if (e.timing().enabled()) e.timing().store(self(), target(self(), owner), ptr, bytes, order != Order::Plain);
  e.wrote(ptr, bytes);
  forget_polls(self());
  if (order != Order::Plain || e.timing().enabled()) e.yield_runnable();
}

uint64_t atomic_rmw(void* ptr, std::size_t bytes, RmwFn fn, uint64_t a, uint64_t b, Scope scope, const char* op,
                    Loc loc) {
  if (bytes != 4 && bytes != 8) fail(ErrorKind::Misuse, std::string(op) + ": atomics take 4 or 8 bytes", loc);
  const auto owner = check_tracked(ptr, bytes, true, op, loc);
  Engine& e = engine();
  Fiber* f = self();
  if (e.timing().enabled() && is_release(op)) e.timing().release(f, static_cast<int>(scope));
  e.catch_up();
  uint64_t old = 0;
  std::memcpy(&old, ptr, bytes);
  uint64_t next = fn(old, a, b);
  if (bytes == 4) next &= 0xffffffffull;
  if (e.timing().enabled()) e.timing().atomic(f, target(f, owner), ptr, bytes);
  if (next == old) {
    // An atomic that changes nothing is a poll (a CAS spin, an add of zero).
    if (idle_poll(f, ptr, &old, bytes)) {
      WaitInfo wi;
      wi.kind = WaitInfo::Kind::Poll;
      wi.addr = ptr;
      wi.a = old;
      wi.what = op;
      wi.loc = loc;
      e.yield_parked(wi);
      std::memcpy(&old, ptr, bytes);
      next = fn(old, a, b);
      if (bytes == 4) next &= 0xffffffffull;
      std::memcpy(ptr, &next, bytes);
      if (e.weak().enabled()) e.weak().rmw(f, ptr, bytes, scope, next != old, op, loc);
      if (next != old) {
        e.wrote(ptr, bytes);
        forget_polls(f);
      } else {
        idle_poll(f, ptr, &old, bytes);
      }
      return old;
    }
    if (e.weak().enabled()) e.weak().rmw(f, ptr, bytes, scope, false, op, loc);
    e.yield_runnable();
    return old;
  }
  std::memcpy(ptr, &next, bytes);
  if (e.weak().enabled()) e.weak().rmw(f, ptr, bytes, scope, true, op, loc);
  e.wrote(ptr, bytes);
  forget_polls(f);
  e.yield_runnable();
  return old;
}

namespace {
// The thread's mbarrier initialisations become visible to the async proxy. Proxy
// fences are frequent (combine's reducers fence every piece): only a thread with an
// unfenced init looks at the block's barriers.
void publish_mbarrier_inits(Fiber* f) {
  if (!f->unfenced_mbarrier_inits) return;
  f->unfenced_mbarrier_inits = false;
  for (auto& [addr, m] : f->block->mbarriers)
    if (m.init_unfenced_by == f) m.init_unfenced_by = nullptr;
}
}  // namespace

void fence(const char* op, Loc loc) {
  if (mutation::mutated(mutation::SiteKind::Fence, loc)) return;
  if (self()->unfenced_mbarrier_inits && std::strstr(op, "mbarrier_init")) publish_mbarrier_inits(self());
  if (engine().weak().enabled()) engine().weak().fence(self(), op);
  if (engine().timing().enabled()) engine().timing().fence(self(), static_cast<int>(WeakMemory::fence_scope(op)));
  engine().yield_runnable();
}

void fence_proxy_async(ProxySpace space, const char* op, Loc loc) {
  if (mutation::mutated(mutation::SiteKind::ProxyFence, loc)) return;
  engine().proxy().fence(self(), space);
  if (space == ProxySpace::Global) WeakMemory::proxy_fence_global(self());
  else publish_mbarrier_inits(self());
  engine().yield_runnable();
}

// ---- mbarrier ---------------------------------------------------------------------------------------
void mbarrier_init(uint64_t* bar, unsigned arrival_count, Loc loc) {
  Engine& e = engine();
  if (arrival_count == 0 || arrival_count >= (1u << 20))
    fail(ErrorKind::Misuse, "mbarrier_init: arrival count " + std::to_string(arrival_count) + " is not in 1..2^20-1",
         loc);
  e.mbarrier(bar, loc, false);  // address checks
  Block* b = self()->block;
  const auto addr = reinterpret_cast<uintptr_t>(bar);
  Mbarrier& m = b->mbarriers[addr];
  if (b->mbarrier_at.empty()) b->mbarrier_at.resize(b->smem_bytes / 8, nullptr);
  b->mbarrier_at[(addr - reinterpret_cast<uintptr_t>(b->smem.get())) / 8] = &m;
  if (!m.waiters.empty()) fail(ErrorKind::Misuse, "mbarrier_init on a barrier that threads wait on", loc);
  m = Mbarrier{};  // a new barrier (and id): what threads knew of the old one is void
  m.expected_arrivals = m.pending_arrivals = arrival_count;
  m.init_unfenced_by = self();
  self()->unfenced_mbarrier_inits = true;
  m.init_loc = loc;
  *bar = 0;
  e.wrote(bar, sizeof(*bar));
  e.yield_runnable();
}

void mbarrier_inval(uint64_t* bar, Loc loc) {
  Engine& e = engine();
  Mbarrier* m = e.mbarrier(bar, loc, true);
  if (!m->waiters.empty()) fail(ErrorKind::Misuse, "mbarrier_inval on a barrier that threads wait on", loc);
  Block* b = self()->block;
  const auto addr = reinterpret_cast<uintptr_t>(bar);
  b->mbarrier_at[(addr - reinterpret_cast<uintptr_t>(b->smem.get())) / 8] = nullptr;
  b->mbarriers.erase(addr);
  e.progress();
  e.yield_runnable();
}

uint64_t mbarrier_arrive(uint64_t* bar, unsigned arrivals, uint32_t tx_bytes, Loc loc) {
  Engine& e = engine();
  Mbarrier* m = e.mbarrier(bar, loc, true);
  if (arrivals > m->pending_arrivals)
    fail(ErrorKind::Misuse,
         "mbarrier_arrive: " + std::to_string(arrivals) + " arrivals but only " +
             std::to_string(m->pending_arrivals) + " are pending in this phase (more arrivals than the init count)",
         loc);
  const uint64_t token = m->phases_completed;
  if (e.timing().enabled()) e.timing().cycles(self(), e.timing().model(self()->device).mbarrier_cycles);
  m->tx_count += tx_bytes;
  if (arrivals) {
    // An arrival releases: a thread that sees this phase complete learns what the
    // arriving thread knew.
    detail::join_phases(m->phases_arrived, self()->phases_seen);
    WeakMemory::join(m->weak_arrived, self());
    e.arrive(*m, arrivals);
  }
  e.progress();
  forget_polls(self());
  e.yield_runnable();
  return token;
}

namespace {
// Whether the phase with this parity has completed. A wait that sees it complete
// acquires: the thread knows the phase (the transaction bytes of the bulk copies that
// completed on it included) and what the threads that arrived on it knew.
bool wait_sees_phase(Fiber* f, const Mbarrier& m, uint32_t parity) {
  if ((m.phases_completed & 1u) == (parity & 1u)) return false;
  WeakMemory::learn(f, m.weak_released);
  const bool tracked = m.id != Mbarrier::kNoId;
  if (tracked && m.id < f->phases_seen.size() && f->phases_seen[m.id] >= m.phases_completed)
    return true;  // this completion was seen (and its release joined) before
  detail::join_phases(f->phases_seen, m.phases_released);
  if (!tracked) return true;
  if (f->phases_seen.size() <= m.id) f->phases_seen.resize(m.id + 1, 0);
  f->phases_seen[m.id] = m.phases_completed;
  return true;
}
}  // namespace

bool mbarrier_test_wait_parity(uint64_t* bar, uint32_t parity, Loc loc) {
  if (mutation::mutated(mutation::SiteKind::MbarrierWait, loc)) return true;
  Engine& e = engine();
  Mbarrier* m = e.mbarrier(bar, loc, true);
  if (e.timing().enabled()) e.timing().cycles(self(), e.timing().model(self()->device).mbarrier_cycles);
  const bool done = wait_sees_phase(self(), *m, parity);
  uint64_t observed = m->phases_completed;
  if (!done && idle_poll(self(), bar, &observed, 8, /*memory=*/false)) {
    WaitInfo wi;
    wi.kind = WaitInfo::Kind::Mbarrier;
    wi.addr = bar;
    wi.a = parity;
    wi.loc = loc;
    e.yield_parked(wi);
  } else {
    e.yield_runnable();
  }
  return done;
}

bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity, Loc loc) {
  if (mutation::mutated(mutation::SiteKind::MbarrierWait, loc)) return true;
  Engine& e = engine();
  Mbarrier* m = e.mbarrier(bar, loc, true);
  Fiber* f = self();
  if (e.timing().enabled()) e.timing().cycles(f, e.timing().model(f->device).mbarrier_cycles);
  if (wait_sees_phase(f, *m, parity)) return true;
  m->waiters.push_back(f);
  WaitInfo wi;
  wi.kind = WaitInfo::Kind::Mbarrier;
  wi.addr = bar;
  wi.a = parity;
  wi.loc = loc;
  const bool woken = e.yield_timed(wi);
  m = e.mbarrier(bar, loc, true);
  if (!woken) {
    auto it = std::find(m->waiters.begin(), m->waiters.end(), f);
    if (it != m->waiters.end()) m->waiters.erase(it);
  }
  return wait_sees_phase(f, *m, parity);
}

// ---- bulk asynchronous copies ---------------------------------------------------------------------------
namespace {
void check_bulk_size(uint32_t bytes, const char* op, Loc loc) {
  if (bytes == 0 || bytes % 16 != 0)
    fail(ErrorKind::Misaligned, std::string(op) + ": size " + std::to_string(bytes) + " is not a positive multiple of 16",
         loc);
}
}  // namespace

void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar, Loc loc) {
  Engine& e = engine();
  const char* op = "bulk_copy_g2s";
  check_bulk_size(bytes, op, loc);
  check_shared(smem_dst, bytes, 16, op, loc);
  const auto owner = check_global_at(gmem_src, bytes, 16, false, op, loc);
  e.catch_up();
  Mbarrier* m = e.mbarrier(bar, loc, true);
  Fiber* f = self();
  if (m->init_unfenced_by != nullptr)
    fail(ErrorKind::ProxyRace,
         std::string(op) + " at " + detail::format_loc(loc) + " completes its bytes on the mbarrier at " + hex(bar) +
             " whose mbarrier_init at " + detail::format_loc(m->init_loc) +
             " its thread has not yet made visible to the async proxy (fence.mbarrier_init or "
             "fence.proxy.async.shared::cta after the init)",
         loc);
  if (m->id == Mbarrier::kNoId) m->id = f->block->next_mbarrier_id++;
  // Its bytes complete on the phase in progress (expect_tx armed it before the issue).
  e.proxy().bulk_g2s(f, smem_dst, gmem_src, bytes, m->id, m->phases_completed, loc);
  if (e.weak().enabled()) e.weak().bulk_read(f, gmem_src, bytes, loc);
  AsyncOp copy{AsyncOp::Kind::G2S, f->block, f, smem_dst, gmem_src, bytes, bar, nullptr, loc};
  if (e.timing().enabled()) copy.ready_ns = e.timing().bulk_g2s(f, target(f, owner), bytes);
  e.issue_async(copy);
  e.progress();
  e.yield_runnable();
}

void bulk_copy_s2g(void* gmem_dst, const void* smem_src, uint32_t bytes, Loc loc) {
  Engine& e = engine();
  const char* op = "bulk_copy_s2g";
  check_bulk_size(bytes, op, loc);
  check_shared(smem_src, bytes, 16, op, loc);
  const auto owner = check_global_at(gmem_dst, bytes, 16, true, op, loc);
  e.catch_up();
  Fiber* f = self();
  e.proxy().bulk_s2g(f, gmem_dst, smem_src, bytes, loc);
  if (e.weak().enabled()) e.weak().bulk_write_issued(f, gmem_dst, bytes, loc);
  AsyncOp copy{AsyncOp::Kind::S2G, f->block, f, gmem_dst, smem_src, bytes, nullptr, &f->groups.back(), loc};
  if (e.timing().enabled()) {
    const detail::Timing::S2G t = e.timing().bulk_s2g(f, target(f, owner), bytes);
    copy.read_ns = t.read_done;
    copy.ready_ns = t.write_done;
  }
  e.issue_async(copy);
  f->open_group_has_store = true;
  f->last_bulk_store = loc;
  e.progress();
  e.yield_runnable();
}

void bulk_commit_group(Loc loc) {
  Fiber* f = self();
  f->groups.emplace_back();
  ++f->groups_committed;
  if (f->open_group_has_store) f->last_store_group = f->groups_committed;
  f->open_group_has_store = false;
  engine().proxy().bulk_commit(f);
}

void bulk_wait_group(unsigned max_pending, bool read_only, Loc loc) {
  if (read_only && mutation::mutated(mutation::SiteKind::BulkWaitRead, loc)) return;
  if (!read_only && mutation::mutated(mutation::SiteKind::BulkWait, loc)) read_only = true;
  Engine& e = engine();
  Fiber* f = self();
  auto pending = [&](const detail::BulkGroup& g) { return read_only ? g.pending_reads : g.pending_writes; };
  for (;;) {
    // groups.back() is the open group; the committed ones precede it, oldest first.
    const std::size_t committed = f->groups.size() - 1;
    std::size_t waiting_on = 0;
    bool older_pending = false;
    for (std::size_t i = 0; i < committed; ++i) {
      if (pending(f->groups[i])) {
        ++waiting_on;
        if (i + max_pending < committed) older_pending = true;
      }
    }
    if (!older_pending) break;
    WaitInfo wi;
    wi.kind = WaitInfo::Kind::BulkGroup;
    wi.what = read_only ? "bulk_wait_group_read" : "bulk_wait_group";
    wi.a = max_pending;
    wi.b = waiting_on;
    wi.loc = loc;
    e.yield_blocked(wi);
  }
  while (f->groups.size() > 1 && f->groups.front().pending_writes == 0) f->groups.pop_front();
  f->groups_read_waited = std::max(f->groups_read_waited, f->groups_committed - std::min<uint64_t>(max_pending, f->groups_committed));
  e.proxy().bulk_waited(f, max_pending, read_only);
  if (!read_only) WeakMemory::bulk_waited(f);
  e.yield_runnable();
}

// ---- time and faults ----------------------------------------------------------------------------------------
uint64_t clock64() { return engine().read_clock(); }

double wait_entered() { return engine().timing().enabled() ? self()->clock_ns : 0; }

void waited(const char* what, int64_t index, int64_t value, double entered_ns, Loc loc) {
  Engine& e = engine();
  const Fiber* f = self();
  if (e.timing().enabled() && f->clock_ns > entered_ns)
    e.timing().waited({what, f->device, index, value}, loc, f->clock_ns - entered_ns);
}

void nanosleep(unsigned ns, Loc loc) {
  Engine& e = engine();
  if (e.timing().enabled()) {  // the thread's clock moves on; it is not idle
    self()->clock_ns += ns;
    e.yield_runnable();
    return;
  }
  WaitInfo wi;
  wi.kind = WaitInfo::Kind::Sleep;
  wi.what = "__nanosleep";
  wi.loc = loc;
  engine().yield_parked(wi);
}

void trap(const char* message, Loc loc) { fail(ErrorKind::Trap, message, loc); }

}  // namespace railyard::sim::device
