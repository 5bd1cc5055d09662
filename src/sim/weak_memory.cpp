// Railyard simulator: the weak-memory mode (weak_memory.hpp, docs/simulator.md).
#include "weak_memory.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "engine.hpp"

namespace railyard::sim::detail {

namespace {

constexpr uintptr_t kWord = WeakMemory::kWordBytes;
const char* const kBulkStore = "bulk_copy_s2g";

// The words [first, last) that bytes [addr, addr + bytes) touch.
std::pair<uintptr_t, uintptr_t> words(uintptr_t addr, std::size_t bytes) {
  return {addr / kWord, (addr + bytes + kWord - 1) / kWord};
}

std::size_t index(Scope s) { return static_cast<std::size_t>(s); }

const char* scope_name(std::size_t s) { return s == 0 ? ".cta" : s == 1 ? ".gpu" : ".sys"; }

// ld.volatile and st.volatile are relaxed operations of system scope.
Scope effective_scope(Order order, Scope scope) { return order == Order::Volatile ? Scope::System : scope; }

// The narrowest scope that holds both threads: the same block, the same device, or the system.
std::size_t relation(const WeakThread& reader, uint64_t writer, uint64_t block_key, int device) {
  if (writer == reader.id || block_key == reader.block_key) return 0;
  return device == reader.device ? 1 : 2;
}

}  // namespace

// The scope of a fence, from the name its wrapper passes.
std::size_t WeakMemory::fence_scope(const char* op) {
  if (std::strstr(op, ".sys") || std::strstr(op, "_system")) return 2;
  if (std::strstr(op, "block") || std::strstr(op, ".cta") || std::strstr(op, ".cluster")) return 0;
  return 1;
}

namespace {

std::string hex(uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", reinterpret_cast<void*>(a));
  return buf;
}

std::string dim3(const Dim3& d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

[[noreturn]] void report(const std::string& message, Loc loc) {
  Engine::get().fault(ErrorKind::DataRace, message, loc);
}

}  // namespace

MemoryModel WeakMemory::from_environment(MemoryModel configured) {
  const char* v = std::getenv("RAILYARD_SIM_MEMORY_MODEL");
  if (v == nullptr || *v == '\0') return configured;
  if (std::strcmp(v, "weak") == 0) return MemoryModel::Weak;
  if (std::strcmp(v, "sc") == 0) return MemoryModel::SequentiallyConsistent;
  throw std::invalid_argument(std::string("RAILYARD_SIM_MEMORY_MODEL is '") + v + "'; expected 'weak' or 'sc'");
}

void WeakMemory::reset(bool enabled) {
  enabled_ = enabled;
  now_ = 0;
  forget();
  doorbells_.clear();
  agents_.clear();
}

void WeakMemory::forget() {
  words_.clear();
  sync_.clear();
  kernels_.clear();
}

void WeakMemory::start_thread(Fiber* f) {
  const KernelRun& k = *f->block->kernel;
  const Dim3 g = k.config.grid, i = f->block->idx;
  WeakThread& w = f->weak;
  w.id = k.launch_id << 32 | f->kernel_thread;
  w.block_key = k.launch_id << 32 | ((i.z * g.y + i.y) * g.x + i.x);
  w.device = k.device;
  w.frontier = w.async_frontier = now_;  // a launch follows the work before it, in both proxies
  if (!kernels_.contains(k.launch_id)) kernels_[k.launch_id] = KernelInfo{k.config.name, k.device, g, k.config.block};
}

// "thread (x,y,z) of block (x,y,z) of kernel 'name' on device d".
std::string WeakMemory::thread_name(uint64_t id) const {
  if ((id & kAgent) != 0) return agents_.at(static_cast<std::size_t>(id & ~kAgent));
  auto it = kernels_.find(id >> 32);
  if (it == kernels_.end()) return "a thread of an earlier kernel";
  const KernelInfo& k = it->second;
  const unsigned thread = static_cast<unsigned>(id & 0xffffffffu), per_block = k.block.count();
  const unsigned block = thread / per_block, t = thread % per_block;
  const Dim3 g = k.grid, b = k.block;
  return "thread " + dim3(Dim3(t % b.x, (t / b.x) % b.y, t / (b.x * b.y))) + " of block " +
         dim3(Dim3(block % g.x, (block / g.x) % g.y, block / (g.x * g.y))) + " of kernel '" + k.name +
         "' on device " + std::to_string(k.device);
}

template <class Fn>
void WeakMemory::with_words(const Fiber* f, uintptr_t addr, Fn&& fn) {
  Block* b = f->block;
  const auto base = reinterpret_cast<uintptr_t>(b->smem.get());
  if (addr - base >= b->smem_bytes) return fn(words_);
  if (b->weak_words.empty()) b->weak_words.resize((b->smem_bytes + kWord - 1) / kWord);
  DenseWords shared(b->weak_words.data(), base / kWord);
  fn(shared);
}

// ---- accesses -----------------------------------------------------------------------------------
// A plain write records its words; a strong one clears their write records: plain
// reads of a word a strong store wrote (a flag re-read after its acquire, a header read
// whole with its sequence word) are not checked. Either kind must not overwrite a word
// another thread read unless that read is known to the writer.
void WeakMemory::write(Fiber* f, const void* ptr, std::size_t bytes, bool strong, const char* op, Loc loc) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  const auto [first, last] = words(addr, bytes);
  with_words(f, addr, [&](auto& records) {
    records.for_each(first, last, [&](uintptr_t, uintptr_t, const WordRecord& r) {
      check_overwrite(f, f->weak.frontier, r, addr, bytes, op, loc);
    });
    const uint64_t t = tick();
    WeakThread& w = f->weak;
    w.lastwrite = t;
    w.lastwrite_op = op;
    w.lastwrite_loc = loc;
    if (strong) records.erase(first, last);
    else records.assign(first, last, WordRecord{Access{t, w.id, op, loc}, Access{}});
  });
}

// A write of a word whose last plain read is another thread's and not known to the writer.
void WeakMemory::check_overwrite(const Fiber* f, uint64_t known, const WordRecord& r, uintptr_t addr,
                                 std::size_t bytes, const char* op, Loc loc) const {
  const WeakThread& w = f->weak;
  if (r.read.time == 0 || r.read.thread == w.id || r.read.time <= known) return;
  const bool async = r.read.time <= w.frontier;  // the thread knows the read, its bulk copies do not
  report("data race: " + std::string(op) + " at " + format_loc(loc) + " overwrites [" + hex(addr) + ", +" +
             std::to_string(bytes) + "), bytes that " + thread_name(r.read.thread) + " read with " + r.read.op +
             " at " + format_loc(r.read.loc) +
             ", without synchronization (no barrier, mbarrier or release/acquire since orders that read before "
             "this write" +
             (async ? "; the issuing thread knows it, but has not made it known to its bulk copies with "
                      "fence.proxy.async.global since)"
                    : ")"),
         loc);
}

// A weak read of bytes whose last write is another thread's and not known to the reader.
void WeakMemory::check_read(const Fiber* f, uint64_t known, const void* ptr, std::size_t bytes, const char* op,
                            Loc loc) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  const auto [first, last] = words(addr, bytes);
  with_words(f, addr, [&](auto& records) {
    records.for_each(first, last, [&](uintptr_t, uintptr_t, const WordRecord& r) {
      if (r.write.time != 0 && r.write.thread != f->weak.id && r.write.time > known)
        report_stale_read(f, r.write, addr, bytes, op, loc);
    });
  });
}

void WeakMemory::report_stale_read(const Fiber* f, const Access& r, uintptr_t addr, std::size_t bytes,
                                   const char* op, Loc loc) const {
  const bool bulk = r.op == kBulkStore;
  const bool async = r.time <= f->weak.frontier;  // the thread knows the write, its bulk copies do not
  report("data race: " + std::string(op) + " at " + format_loc(loc) + " reads [" + hex(addr) + ", +" +
             std::to_string(bytes) + "), bytes that " +
             (bulk ? "the bulk copy (shared to global) issued by " + thread_name(r.thread) + " at " +
                         format_loc(r.loc) + " wrote when it landed"
                   : thread_name(r.thread) + " wrote with " + r.op + " at " + format_loc(r.loc)) +
             ", without synchronization (no acquire, fence or barrier since orders that write before this "
             "read" +
             (bulk    ? "; was the copy published after only bulk_wait_group_read?)"
              : async ? "; the issuing thread knows it, but has not made it known to its bulk copies with "
                        "fence.proxy.async.global since)"
                      : ")"),
         loc);
}

// Records a plain read, which a later write by another thread must know.
void WeakMemory::record_read(Fiber* f, const void* ptr, std::size_t bytes, const char* op, Loc loc) {
  const uint64_t t = tick();
  WeakThread& w = f->weak;
  w.lastread = t;
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  const auto [first, last] = words(addr, bytes);
  const Access read{t, w.id, op, loc};
  with_words(f, addr, [&](auto& records) { records.update(first, last, [&](WordRecord& r) { r.read = read; }); });
}

// A strong load (or an atomic's read) reads the value of strong store `r`.
void WeakMemory::observe(Fiber* f, const SyncRecord& r, Order order, Scope scope, const char* op, Loc loc) const {
  WeakThread& w = f->weak;
  if (r.writer == w.id || r.time <= w.frontier) return;  // its own store, or one it knows already
  const std::size_t rel = relation(w, r.writer, r.block_key, r.device);
  const std::size_t narrower = std::min(index(r.scope), index(effective_scope(order, scope)));
  if (narrower < rel)
    report("scope: " + std::string(r.op) + " at " + format_loc(r.loc) + " by " + thread_name(r.writer) +
               " is read by " + op + " at " + format_loc(loc) + " on device " + std::to_string(w.device) + ": a " +
               scope_name(narrower) + " operation does not order anything for a thread of another " +
               (rel == 2 ? "device" : "block"),
           loc);
  uint64_t& into = order == Order::Acquire ? w.frontier : w.pending[rel];
  into = std::max(into, r.knows[rel]);
}

void WeakMemory::load(Fiber* f, const void* ptr, std::size_t bytes, Order order, Scope scope, const char* op,
                      Loc loc) {
  if (order == Order::Plain) {
    check_read(f, f->weak.frontier, ptr, bytes, op, loc);
    return record_read(f, ptr, bytes, op, loc);
  }
  auto it = sync_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it != sync_.end()) observe(f, it->second, order, scope, op, loc);
}

void WeakMemory::store(Fiber* f, const void* ptr, std::size_t bytes, Order order, Scope scope, const char* op,
                       Loc loc) {
  if (!doorbells_.empty()) ring_doorbell(f, ptr, bytes, order, scope, op, loc);
  const WeakThread& w = f->weak;
  const uint64_t known = w.knowledge();  // what precedes the store in its thread
  write(f, ptr, bytes, order != Order::Plain, op, loc);
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  if (order == Order::Plain) {
    sync_.erase(addr);  // its value carries nothing
    return;
  }
  SyncRecord r{w.lastwrite, w.id, w.block_key, w.device, effective_scope(order, scope), {0, 0, 0}, op, loc};
  // A release store publishes what its thread knows; a relaxed one what its last fence released.
  for (std::size_t s = 0; s <= index(r.scope); ++s) r.knows[s] = order == Order::Release ? known : w.released[s];
  sync_[addr] = r;
}

void WeakMemory::rmw(Fiber* f, const void* ptr, std::size_t bytes, Scope scope, bool wrote, const char* op, Loc loc) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  const bool acquire = std::strstr(op, ".acquire") || std::strstr(op, "acq_rel");
  const bool release = std::strstr(op, ".release") || std::strstr(op, "acq_rel");
  auto it = sync_.find(addr);
  if (it != sync_.end()) observe(f, it->second, acquire ? Order::Acquire : Order::Relaxed, scope, op, loc);
  if (!wrote) return;
  const Order order = release ? Order::Release : Order::Relaxed;
  // Continues the release sequence: a later acquire of its value also learns what the
  // stores it modified carried.
  const SyncRecord before = it != sync_.end() ? it->second : SyncRecord{};
  store(f, ptr, bytes, order, scope, op, loc);
  SyncRecord& r = sync_[addr];
  for (std::size_t s = 0; s < kScopes; ++s) r.knows[s] = std::max(r.knows[s], before.knows[s]);
}

void WeakMemory::fence(Fiber* f, const char* op) {
  WeakThread& w = f->weak;
  const std::size_t scope = fence_scope(op);
  for (std::size_t s = 0; s <= scope; ++s) w.frontier = std::max(w.frontier, w.pending[s]);
  for (std::size_t s = 0; s <= scope; ++s) w.released[s] = w.knowledge();
}

void WeakMemory::proxy_fence_global(Fiber* f) { f->weak.async_frontier = f->weak.knowledge(); }

// ---- barriers ------------------------------------------------------------------------------------
void WeakMemory::join(uint64_t& into, const Fiber* f) { into = std::max(into, f->weak.knowledge()); }

void WeakMemory::learn(Fiber* f, uint64_t knowledge) { f->weak.frontier = std::max(f->weak.frontier, knowledge); }

void WeakMemory::warp_join(Block* b, unsigned warp, uint32_t mask) {
  uint64_t known = 0;
  for (unsigned l = 0; l < 32; ++l)
    if ((mask >> l) & 1u) join(known, b->fibers[warp * 32 + l].get());
  for (unsigned l = 0; l < 32; ++l)
    if ((mask >> l) & 1u) learn(b->fibers[warp * 32 + l].get(), known);
}

// ---- bulk copies ---------------------------------------------------------------------------------
void WeakMemory::bulk_read(Fiber* f, const void* gmem_src, std::size_t bytes, Loc loc) {
  check_read(f, f->weak.async_frontier, gmem_src, bytes, "bulk_copy_g2s", loc);
  record_read(f, gmem_src, bytes, "bulk_copy_g2s", loc);
}

void WeakMemory::bulk_write_issued(const Fiber* f, const void* gmem_dst, std::size_t bytes, Loc loc) const {
  const auto addr = reinterpret_cast<uintptr_t>(gmem_dst);
  const auto [first, last] = words(addr, bytes);
  words_.for_each(first, last, [&](uintptr_t, uintptr_t, const WordRecord& r) {
    check_overwrite(f, f->weak.async_frontier, r, addr, bytes, kBulkStore, loc);
  });
}

void WeakMemory::bulk_landed(Fiber* issuer, const void* dst, std::size_t bytes, bool shared, Loc loc) {
  const auto addr = reinterpret_cast<uintptr_t>(dst);
  const auto [first, last] = words(addr, bytes);
  if (shared) return with_words(issuer, addr, [&](auto& records) { records.erase(first, last); });
  const uint64_t t = tick();
  words_.assign(first, last, WordRecord{Access{t, issuer->weak.id, kBulkStore, loc}, Access{}});
  issuer->weak.bulk_landed = t;
}

void WeakMemory::bulk_waited(Fiber* f) { f->weak.lastwrite = std::max(f->weak.lastwrite, f->weak.bulk_landed); }

// ---- doorbells -------------------------------------------------------------------------------------
void WeakMemory::add_doorbell(const void* ptr, std::size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  doorbells_[a] = Doorbell{a + bytes, 0};
}

void WeakMemory::remove_doorbell(const void* ptr) { doorbells_.erase(reinterpret_cast<uintptr_t>(ptr)); }

WeakMemory::Doorbell* WeakMemory::find_doorbell(const void* ptr, std::size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  auto it = doorbells_.upper_bound(a + bytes - 1);
  if (it == doorbells_.begin() || std::prev(it)->second.end <= a) return nullptr;
  return &std::prev(it)->second;
}

uint64_t WeakMemory::doorbell_release(const void* ptr) {
  const Doorbell* d = find_doorbell(ptr, 1);
  return d != nullptr ? d->released : 0;
}

// Ringing a doorbell hands the thread's writes to a device outside the GPU's memory
// model: they must be released to the system first. What it released is what the
// device may then read (agent_read).
void WeakMemory::ring_doorbell(const Fiber* f, const void* ptr, std::size_t bytes, Order order, Scope scope,
                               const char* op, Loc loc) {
  Doorbell* d = find_doorbell(ptr, bytes);
  if (d == nullptr) return;
  const WeakThread& w = f->weak;
  const bool release_store = order == Order::Release && scope == Scope::System;
  if (w.lastwrite > w.released[2] && !release_store)
    report("doorbell: " + std::string(op) + " at " + format_loc(loc) + " rings a doorbell while this thread's " +
               w.lastwrite_op + " at " + format_loc(w.lastwrite_loc) +
               " is not released to the system (no st.release.sys, or fence.acq_rel.sys / fence.sc.sys after it)",
           loc);
  d->released = release_store ? w.knowledge() : w.released[2];
}

// ---- agents ----------------------------------------------------------------------------------------
uint64_t WeakMemory::agent_id(const std::string& agent) {
  auto it = std::find(agents_.begin(), agents_.end(), agent);
  if (it == agents_.end()) it = agents_.insert(agents_.end(), agent);
  return kAgent | static_cast<uint64_t>(it - agents_.begin());
}

void WeakMemory::agent_write(const std::string& agent, const void* ptr, std::size_t bytes, Order order,
                             const char* op, Loc loc) {
  const uint64_t id = agent_id(agent);
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  const auto [first, last] = words(addr, bytes);
  const uint64_t t = tick();
  if (order == Order::Plain) {
    words_.assign(first, last, WordRecord{Access{t, id, op, loc}, Access{}});
    sync_.erase(addr);
    return;
  }
  // Outside every device (device -1): only a system-scope acquire orders it. It
  // publishes every write before it, the agent's own included.
  words_.erase(first, last);
  sync_[addr] = SyncRecord{t, id, id, -1, Scope::System, {t, t, t}, op, loc};
}

std::string WeakMemory::agent_read(const std::string& agent, const void* ptr, std::size_t bytes, uint64_t released,
                                   const char* op, Loc loc) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  const auto [first, last] = words(addr, bytes);
  std::string message;
  words_.for_each(first, last, [&](uintptr_t, uintptr_t, const WordRecord& r) {
    if (!message.empty() || r.write.time <= released || (r.write.thread & kAgent) != 0) return;
    message = "data race: " + agent + " reads [" + hex(addr) + ", +" + std::to_string(bytes) + ") for " + op +
              " (" + format_loc(loc) + "), bytes that " + thread_name(r.write.thread) + " wrote with " + r.write.op +
              " at " + format_loc(r.write.loc) +
              " after the doorbell that asked for them: the ringing thread's system-scope release did not cover "
              "that write (a write after the doorbell, or another thread's write not ordered before its fence)";
  });
  return message;
}

}  // namespace railyard::sim::detail
