// Railyard simulator engine: world protocol, scheduler, kernels, async copies, reports.
#include "engine.hpp"

#include <algorithm>
#include <chrono>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <sys/mman.h>
#include <unistd.h>


// AddressSanitizer builds announce fiber switches (see "AddressSanitizer and fiber
// switches" below).
#if defined(__SANITIZE_ADDRESS__)
#define RAILYARD_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RAILYARD_SIM_ASAN 1
#endif
#endif
#if RAILYARD_SIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace railyard::sim::detail {

// ---- Rng ------------------------------------------------------------------------------
namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}
uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

// ---- AddressSanitizer and fiber switches ------------------------------------------------
// ASan tracks one stack per thread. Every switch between the engine thread's own stack
// and a fiber's stack is announced to it (start before, finish after), or it takes the
// fiber's frames for overflows of the thread's stack, wherever a fiber throws or traps.
#if RAILYARD_SIM_ASAN
namespace {
// The engine thread's stack (learnt on the first switch into a fiber) and its fake stack.
const void* g_engine_stack_bottom = nullptr;
std::size_t g_engine_stack_bytes = 0;
void* g_engine_fake_stack = nullptr;
void asan_enter_fiber(const Fiber* f) {
  __sanitizer_start_switch_fiber(&g_engine_fake_stack, f->stack_bottom, f->stack_bytes);
}
void asan_back_on_engine() { __sanitizer_finish_switch_fiber(g_engine_fake_stack, nullptr, nullptr); }
void asan_fiber_started() {
  __sanitizer_finish_switch_fiber(nullptr, &g_engine_stack_bottom, &g_engine_stack_bytes);
}
void asan_leave_fiber(Fiber* f) {
  __sanitizer_start_switch_fiber(&f->asan_fake_stack, g_engine_stack_bottom, g_engine_stack_bytes);
}
void asan_fiber_resumed(Fiber* f) { __sanitizer_finish_switch_fiber(f->asan_fake_stack, nullptr, nullptr); }
void asan_fiber_exits() { __sanitizer_start_switch_fiber(nullptr, g_engine_stack_bottom, g_engine_stack_bytes); }
// A reused stack must not keep the poisoned redzones of the frames that were on it.
void asan_unpoison(const bctx::stack_context& s) {
  ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(s.sp) - s.size, s.size);
}
}  // namespace
#else
namespace {
void asan_enter_fiber(const Fiber*) {}
void asan_back_on_engine() {}
void asan_fiber_started() {}
void asan_leave_fiber(Fiber*) {}
void asan_fiber_resumed(Fiber*) {}
void asan_fiber_exits() {}
void asan_unpoison(const bctx::stack_context&) {}
}  // namespace
#endif

Fiber::~Fiber() {
  if (!context) return;
  // Destroying a suspended fiber switches to its stack and unwinds it there
  // (boost::context's forced_unwind), then comes back.
  asan_enter_fiber(this);
  context = bctx::fiber{};
  asan_back_on_engine();
}

// ---- fiber stacks ------------------------------------------------------------------------
StackPool::~StackPool() { release_all(); }

bctx::stack_context StackPool::allocate() {
  if (free_.empty()) {
    try {
      bctx::stack_context sctx = allocator_.allocate();
      ++mapped_;
      return sctx;
    } catch (const std::bad_alloc&) {
      // The engine's thread has no caller to report to: the process ends with this.
      throw std::runtime_error(stack_failure());
    }
  }
  bctx::stack_context sctx = free_.back();
  free_.pop_back();
  return sctx;
}

void StackPool::deallocate(bctx::stack_context& sctx) {
  asan_unpoison(sctx);
  free_.push_back(sctx);
}

void StackPool::release_all() {
  for (auto& sctx : free_) allocator_.deallocate(sctx);
  mapped_ -= free_.size();
  free_.clear();
}

std::string StackPool::stack_failure() const {
  std::size_t maps = 0;
  std::ifstream self("/proc/self/maps");
  for (std::string line; std::getline(self, line);) ++maps;
  long limit = -1;
  std::ifstream("/proc/sys/vm/max_map_count") >> limit;
  std::ostringstream os;
  os << "railyard simulator: cannot map a stack for one more simulated thread (" << mapped_ << " stacks of "
     << stack_bytes_ / 1024 << " KiB are mapped, two memory mappings each with its guard page; the process has "
     << maps << " mappings, vm.max_map_count is " << limit
     << ", and an address-space limit (ulimit -v) counts too): run fewer blocks or threads at once (a benchmark: "
        "fewer --sms or ranks), or raise vm.max_map_count (sysctl -w vm.max_map_count=262144)";
  return os.str();
}

// ---- world protocol ---------------------------------------------------------------------
namespace {
struct ThreadRegistration {
  bool registered = false;
  ~ThreadRegistration() {
    if (registered) Engine::get().leave();
  }
};
thread_local ThreadRegistration t_registration;

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

std::string dim(const Dim3& d) {
  std::ostringstream os;
  os << "(" << d.x << "," << d.y << "," << d.z << ")";
  return os.str();
}
}  // namespace

std::string project_file(const char* path) {
  std::string p = path ? path : "?";
  for (const char* root : {"/include/", "/kernels/", "/src/", "/tests/", "/benchmarks/", "/python/"}) {
    const auto pos = p.rfind(root);
    if (pos != std::string::npos) return p.substr(pos + 1);
  }
  return p;
}

std::string format_loc(const Loc& loc) {
  std::ostringstream os;
  os << project_file(loc.file_name()) << ":" << loc.line();
  return os.str();
}

Engine& Engine::create() {
  // Leaked on purpose: the engine thread may still wait on its condition variable at exit.
  static Engine* engine = new Engine();
  instance_.store(engine, std::memory_order_release);
  return *engine;
}

Engine::Engine() : rng_(1) {
  thread_ = std::thread([this] { engine_main(); });
  thread_.detach();
}

std::unique_lock<std::mutex> Engine::acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!t_registration.registered) {
    t_registration.registered = true;
    ++participants_;
    active_ = participants_ - blocked_;
  }
  quiescent_ = false;
  cv_.wait(lock, [&] { return !engine_running_; });
  return lock;
}

void Engine::block_until(std::unique_lock<std::mutex>& lock, std::function<bool()> ready,
                         bool wants_quiescence) {
  if (ready()) return;
  HostWaiter waiter{std::move(ready), wants_quiescence};
  host_waiters_.push_back(&waiter);
  ++blocked_;
  active_ = participants_ - blocked_;
  cv_.notify_all();
  // The engine marks the waiter satisfied and the thread active again (so it stops
  // at a point of its own timeline, which keeps runs reproducible).
  cv_.wait(lock, [&] { return waiter.satisfied && !engine_running_; });
}

bool Engine::begin_host_wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!t_registration.registered) return false;
  ++blocked_;
  active_ = participants_ - blocked_;
  cv_.notify_all();
  return true;
}

void Engine::end_host_wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!t_registration.registered) return;
  --blocked_;
  active_ = participants_ - blocked_;
  quiescent_ = false;
  cv_.wait(lock, [&] { return !engine_running_; });
}

bool Engine::begin_host_sleep(HostSleeper& sleeper) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!t_registration.registered) return false;
  sleepers_.push_back(&sleeper);
  ++blocked_;
  active_ = participants_ - blocked_;
  cv_.notify_all();
  return true;
}

// A sleeper released by its waker is running already. One that woke on its own (its
// deadline) becomes active here: the engine then stops at whatever point it reached,
// which only a timeout, never a successful run, depends on.
void Engine::end_host_sleep(HostSleeper& sleeper) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!sleeper.released) {
    std::erase(sleepers_, &sleeper);
    --blocked_;
    active_ = participants_ - blocked_;
    quiescent_ = false;
  }
  cv_.wait(lock, [&] { return !engine_running_; });
}

// Called by the host thread that wakes the condition's sleepers, before it wakes them:
// they count as running from this instant, so the engine cannot start (or take the
// moment for a hang) between their wake-up and their return, however late the
// operating system runs them. What runs next is then a function of the host program
// alone, and a seed replays through host barriers.
void Engine::release_host_sleepers(const void* condition) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (auto it = sleepers_.begin(); it != sleepers_.end();) {
    if ((*it)->condition != condition) {
      ++it;
      continue;
    }
    (*it)->released = true;
    --blocked_;
    it = sleepers_.erase(it);
  }
  active_ = participants_ - blocked_;
  quiescent_ = false;
}

void Engine::add_preassigned(int n) {
  std::unique_lock<std::mutex> lock(mutex_);
  participants_ += n;
  preassigned_ += n;
  active_ = participants_ - blocked_;
}

void Engine::adopt_preassigned() {
  std::unique_lock<std::mutex> lock(mutex_);
  t_registration.registered = true;
  --preassigned_;
  cv_.wait(lock, [&] { return !engine_running_; });
}

void Engine::leave() {
  std::unique_lock<std::mutex> lock(mutex_);
  t_registration.registered = false;
  --participants_;
  active_ = participants_ - blocked_;
  cv_.notify_all();
}

bool Engine::has_work() const {
  if (quiescent_) return false;
  for (const auto& s : streams_)
    if (!s.ops.empty()) return true;
  return false;
}

bool Engine::world_ready() const { return participants_ == blocked_ && has_work(); }

void Engine::engine_main() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return world_ready(); });
    engine_running_ = true;
    lock.unlock();
    run_until_pause();
    lock.lock();
    engine_running_ = false;
    cv_.notify_all();
  }
}

void Engine::run_until_pause() {
  agents_cached_ = false;  // the host, holding the world, may have changed what they do next
  wake_all_watchers();     // and written what they watch
  while (active_.load(std::memory_order_acquire) == 0) {
    if (!step()) break;
  }
}

void Engine::check_host_waiters() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (auto it = host_waiters_.begin(); it != host_waiters_.end();) {
    HostWaiter* w = *it;
    if (w->ready()) {
      w->satisfied = true;
      --blocked_;
      active_ = participants_ - blocked_;
      it = host_waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

// ---- world state (host side, world held) ----------------------------------------------------
namespace {
// RAILYARD_SIM_SEED_OFFSET=k runs every seed s as s + k: the same tests explore other
// interleavings (the weak-mode seed sweep of tests/kernels). Reports print s + k.
uint64_t seed_offset_from_environment() {
  const char* v = std::getenv("RAILYARD_SIM_SEED_OFFSET");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const unsigned long long k = std::strtoull(v, &end, 10);
  if (*end != '\0' || *v == '-')
    throw std::invalid_argument(std::string("RAILYARD_SIM_SEED_OFFSET is '") + v +
                                "'; expected a non-negative decimal integer");
  return k;
}
}  // namespace

namespace {
// Simulated device memory reads as 0xA5 until written, so that unwritten bytes show.
// Small allocations are filled. From kPoisonChunk up, an allocation maps a file of
// 0xA5 bytes privately, chunk after chunk: pages nobody writes share the file's page
// cache, and only a page that a kernel or the host writes is copied (on write) into
// memory of its own. The seed configuration writes about 7.3 GiB of its 9 GiB of
// allocations; each page the host commits costs page-fault and zeroing time.
constexpr std::size_t kPoisonChunk = std::size_t{16} << 20;

int poison_file() {
  static const int fd = [] {
    const int f = memfd_create("railyard-sim-poison", MFD_CLOEXEC);
    if (f < 0) return -1;
    void* p = ftruncate(f, kPoisonChunk) == 0
                  ? mmap(nullptr, kPoisonChunk, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0)
                  : MAP_FAILED;
    if (p == MAP_FAILED) {
      close(f);
      return -1;
    }
    std::memset(p, 0xA5, kPoisonChunk);
    munmap(p, kPoisonChunk);
    return f;
  }();
  return fd;
}

// Maps [at, at + len), page-aligned, over what is there as fresh private pages: the
// poison file's, chunk after chunk, for fd >= 0; anonymous zero pages for fd < 0.
bool map_fresh_pages(uintptr_t at, std::size_t len, int fd) {
  for (std::size_t off = 0; off < len; off += kPoisonChunk) {
    const std::size_t n = std::min(kPoisonChunk, len - off);
    void* chunk = reinterpret_cast<void*>(at + off);
    void* got = fd >= 0 ? mmap(chunk, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0)
                        : mmap(chunk, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS | MAP_NORESERVE,
                               -1, 0);
    if (got == MAP_FAILED) return false;
  }
  return true;
}

// Returns the mapping's length (0: from aligned_alloc) through `mapped`.
void* map_device_memory(std::size_t rounded, std::size_t& mapped) {
  mapped = 0;
  const int fd = rounded >= kPoisonChunk ? poison_file() : -1;
  if (fd < 0) {
    void* p = std::aligned_alloc(256, rounded);
    if (p) std::memset(p, 0xA5, rounded);
    return p;
  }
  const std::size_t length = (rounded + 4095) / 4096 * 4096;
  void* base = mmap(nullptr, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  if (!map_fresh_pages(reinterpret_cast<uintptr_t>(base), length, fd)) {
    munmap(base, length);
    return nullptr;
  }
  mapped = length;
  return base;
}

// memset of a mapped allocation: whole pages inside it get fresh pages instead of
// being written (anonymous zero pages for 0, the poison file for 0xA5), so that a
// buffer zeroed at creation commits only the pages kernels write later, and a page
// poisoned again gives its memory back. Other values, and the partial pages at the
// ends, are written.
void fill_device_memory(const Allocation* a, void* dst, int value, std::size_t bytes) {
  constexpr uintptr_t kPage = 4096;
  const auto begin = reinterpret_cast<uintptr_t>(dst), end = begin + bytes;
  const uintptr_t first = (begin + kPage - 1) / kPage * kPage, last = end / kPage * kPage;
  const auto byte = static_cast<unsigned char>(value);
  const int fd = byte == 0xA5 ? poison_file() : -1;
  if (a == nullptr || a->mapped_bytes == 0 || last <= first || last - first < 16 * kPage || (byte != 0 && fd < 0)) {
    std::memset(dst, value, bytes);
    return;
  }
  std::memset(dst, value, first - begin);
  std::memset(reinterpret_cast<void*>(last), value, end - last);
  if (!map_fresh_pages(first, last - first, fd)) std::memset(reinterpret_cast<void*>(first), value, last - first);
}

void unmap_device_memory(const Allocation& a) {
  if (a.mapped_bytes) munmap(reinterpret_cast<void*>(a.base), a.mapped_bytes);
  else std::free(reinterpret_cast<void*>(a.base));
}
}  // namespace

void Engine::reset(const Config& config) {
  if (!(config.preemption > 0.0 && config.preemption <= 1.0))
    throw std::invalid_argument("railyard::sim::reset: config.preemption is " + std::to_string(config.preemption) +
                                "; expected a probability in (0, 1]");
  if (!(config.locality >= 0.0 && config.locality <= 1.0))
    throw std::invalid_argument("railyard::sim::reset: config.locality is " + std::to_string(config.locality) +
                                "; expected a probability in [0, 1]");
  for (const auto& s : streams_)
    if (!s.ops.empty())
      throw Error(ErrorKind::Misuse, "railyard::sim::reset: work is still pending on a stream; "
                                     "synchronize first");
  for (auto& [base, a] : allocations_)
    if (a.owned) unmap_device_memory(a);
  allocations_.clear();
  devices_.clear();
  streams_.clear();
  admission_order_.clear();
  events_done_.clear();
  event_device_.clear();
  kernels_.clear();
  last_run_ = nullptr;
  runnable_.clear();
  by_clock_.clear();
  parked_.clear();
  timed_.clear();
  watching_.clear();
  watched_pages_.clear();
  async_.clear();
  agents_.clear();
  async_cached_ = agents_cached_ = false;
  if (config.fiber_stack_bytes != config_.fiber_stack_bytes) {
    stacks_ = std::make_unique<StackPool>(config.fiber_stack_bytes);
  } else {
    stacks_->release_all();
  }
  config_ = config;
  config_.memory_model = WeakMemory::from_environment(config.memory_model);
  config_.seed = config.seed + seed_offset_from_environment();
  rng_ = Rng(config_.seed);
  epoch_ = 1;
  unpark_epoch_ = warp_epoch_ = recheck_epoch_ = rechecks_in_epoch_ = idle_rounds_ = rounds_without_clock_ = 0;
  clock_reads_ = warp_clock_reads_ = 0;
  next_launch_id_ = 0;
  quiescent_ = false;
  traffic_write_.clear();
  traffic_read_.clear();
  traffic_nic_.clear();
  proxy_.reset();
  weak_.reset(config_.memory_model == MemoryModel::Weak);
  timing_.reset(config_.timed);
  now_ns_ = 0;
  event_time_ns_.clear();
  stats_ = Stats{};
}

int Engine::add_device(const DeviceProps& props) {
  if (props.sm_count < 1 || props.max_blocks_per_sm < 1 || props.max_threads_per_block < 32)
    throw std::invalid_argument("railyard::sim::add_device: props.sm_count and props.max_blocks_per_sm "
                                "must be >= 1 and props.max_threads_per_block >= 32");
  const int id = static_cast<int>(devices_.size());
  timing_.add_device(props);  // checks the timing model (kept in either mode)
  DeviceState d;
  d.props = props;
  devices_.push_back(std::move(d));
  for (auto& dev : devices_) dev.peer.resize(devices_.size(), false);
  devices_[id].peer[id] = true;
  devices_[id].default_stream = new_stream(id);
  const std::size_t n = devices_.size();
  traffic_write_.assign(n * (n + 1), 0);
  traffic_read_.assign(n * (n + 1), 0);
  traffic_nic_.assign(n * n, 0);
  return id;
}

void Engine::enable_peer(int dev, int peer) {
  if (devices_.at(dev).props.nvlink_domain != devices_.at(peer).props.nvlink_domain)
    throw Error(ErrorKind::PeerAccess, "railyard::sim::enable_peer_access: devices " + std::to_string(dev) +
                                           " and " + std::to_string(peer) +
                                           " are in different NVLink domains");
  devices_[dev].peer[peer] = true;
}

uintptr_t Engine::sim_base_for(int dev) {
  if (dev < 0) return 0;  // pinned host memory: never the L1's (Local is device memory)
  const uint64_t serial = devices_.at(dev).allocations++;
  return (static_cast<uintptr_t>(dev) + 1) << 56 | (serial & 0xfffff) << 36;
}

void* Engine::allocate(int dev, std::size_t bytes, std::string label) {
  if (bytes == 0) return nullptr;
  // cudaMalloc returns 256-byte aligned memory; keep that, and round the size so the
  // aligned_alloc contract holds. Accesses are checked against the requested size.
  const std::size_t rounded = (bytes + 255) / 256 * 256;
  std::size_t mapped = 0;
  void* p = map_device_memory(rounded, mapped);
  if (!p) throw std::bad_alloc();
  const auto base = reinterpret_cast<uintptr_t>(p);
  allocations_[base] = Allocation{base, bytes, dev, std::move(label), true, mapped, sim_base_for(dev)};
  return p;
}

void Engine::deallocate(void* ptr) {
  if (!ptr) return;
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations_.end())
    throw Error(ErrorKind::Misuse, "railyard::sim::free: " + hex(ptr) + " is not the start of a live allocation");
  if (!it->second.owned)
    throw Error(ErrorKind::Misuse, "railyard::sim::free: " + hex(ptr) + " is registered memory ('" +
                                       it->second.label + "'); unregister_memory it instead");
  unmap_device_memory(it->second);
  allocations_.erase(it);
}

void Engine::register_range(int dev, void* ptr, std::size_t bytes, std::string label) {
  const auto base = reinterpret_cast<uintptr_t>(ptr);
  if (!ptr || bytes == 0)
    throw std::invalid_argument("railyard::sim::register_memory: ptr " + hex(ptr) + ", bytes " +
                                std::to_string(bytes) + "; expected a non-null pointer and bytes > 0");
  // Overlap with an existing range: the one starting at or below the end of ours.
  auto it = allocations_.lower_bound(base + bytes);
  if (it != allocations_.begin()) {
    const Allocation& prev = std::prev(it)->second;
    if (prev.base + std::max<std::size_t>(prev.bytes, 1) > base)
      throw Error(ErrorKind::Misuse, "railyard::sim::register_memory: [" + hex(ptr) + ", +" + std::to_string(bytes) +
                                         ") overlaps '" + prev.label + "' [" +
                                         hex(reinterpret_cast<void*>(prev.base)) + ", +" +
                                         std::to_string(prev.bytes) + ")");
  }
  allocations_[base] = Allocation{base, bytes, dev, std::move(label), false, 0, sim_base_for(dev)};
}

void Engine::unregister_range(void* ptr) {
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations_.end() || it->second.owned)
    throw Error(ErrorKind::Misuse,
                "railyard::sim::unregister_memory: " + hex(ptr) + " does not start a registered range");
  allocations_.erase(it);
}

const Allocation* Engine::find(const void* ptr) const {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  auto it = allocations_.upper_bound(addr);
  if (it == allocations_.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  if (addr >= a.base && addr < a.base + std::max<std::size_t>(a.bytes, 1)) return &a;
  return nullptr;
}

const Allocation* Engine::nearest_below(const void* ptr) const {
  auto it = allocations_.upper_bound(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations_.begin()) return nullptr;
  return &std::prev(it)->second;
}

std::size_t Engine::live_bytes() const {
  std::size_t total = 0;
  for (const auto& [base, a] : allocations_) total += a.bytes;
  return total;
}

int Engine::new_stream(int dev) {
  StreamState s;
  s.device = dev;
  streams_.push_back(std::move(s));
  const int id = static_cast<int>(streams_.size()) - 1;
  // Rank threads create streams in whatever order the operating system runs them, so
  // ids are not reproducible; the order in which the engine admits their work must
  // be. Admission goes by device, then by creation on that device (one thread's
  // program order).
  const auto after = std::upper_bound(admission_order_.begin(), admission_order_.end(), dev,
                                      [&](int d, int other) { return d < streams_[other].device; });
  admission_order_.insert(after, id);
  return id;
}

int Engine::new_event(int device) {
  events_done_.push_back(false);
  event_device_.push_back(device);
  event_time_ns_.push_back(0);
  return static_cast<int>(events_done_.size()) - 1;
}

bool Engine::device_idle(int device) const {
  for (const auto& s : streams_)
    if (s.device == device && !s.ops.empty()) return false;
  return true;
}

void Engine::enqueue(int stream, StreamOp op) {
  if (op.kind == StreamOp::Kind::Kernel) op.kernel->launch_id = next_launch_id_++;
  streams_.at(stream).ops.push_back(std::move(op));
  admission_dirty_ = true;
}

bool Engine::stream_empty(int stream) const { return streams_.at(stream).ops.empty(); }

void Engine::throw_if_faulted(int dev) const {
  const DeviceState& d = devices_.at(dev);
  if (d.faulted) throw Error(d.fault_kind, d.fault_report);
}

Traffic Engine::traffic() const {
  Traffic t;
  t.num_devices = device_count();
  t.write_bytes = traffic_write_;
  t.read_bytes = traffic_read_;
  t.nic_bytes = traffic_nic_;
  return t;
}

void Engine::reset_traffic() {
  std::fill(traffic_write_.begin(), traffic_write_.end(), 0);
  std::fill(traffic_read_.begin(), traffic_read_.end(), 0);
  std::fill(traffic_nic_.begin(), traffic_nic_.end(), 0);
}

void Engine::count_nic_bytes(int from, int to, std::size_t bytes) {
  traffic_nic_.at(static_cast<std::size_t>(from) * devices_.size() + static_cast<std::size_t>(to)) += bytes;
}

void Engine::count_traffic(int dev, int owner, std::size_t bytes, bool write) {
  const std::size_t i = static_cast<std::size_t>(dev) * (devices_.size() + 1) + (owner + 1);
  (write ? traffic_write_ : traffic_read_)[i] += bytes;
}

// ---- scheduler ---------------------------------------------------------------------------------
void Engine::make_runnable(Fiber* f) {
  f->state = FiberState::Runnable;
  f->runnable_index = runnable_.size();
  runnable_.push_back(f);
  if (timing_.enabled()) {
    by_clock_.push_back({f->clock_ns, runnable_order_++, f});
    std::push_heap(by_clock_.begin(), by_clock_.end(), std::greater<>{});
  }
}

void Engine::add_waiting(std::vector<Fiber*>& list, Fiber* f) {
  f->wait_index = list.size();
  list.push_back(f);
}

// Order in the list does not matter (clock warps wake all of it), so removal swaps
// the last one in: a wake is O(1) with thousands of fibers waiting.
void Engine::remove_waiting(std::vector<Fiber*>& list, Fiber* f) {
  const std::size_t i = f->wait_index;
  list[i] = list.back();
  list[i]->wait_index = i;
  list.pop_back();
}

void Engine::remove_runnable(Fiber* f) {
  const std::size_t i = f->runnable_index;
  runnable_[i] = runnable_.back();
  runnable_[i]->runnable_index = i;
  runnable_.pop_back();
}

void Engine::wake(Fiber* f) {
  if (f->state == FiberState::TimedWait) {
    remove_waiting(timed_, f);
  } else if (f->state == FiberState::Parked) {
    if (f->watching) unwatch(f);
    else remove_waiting(parked_, f);
  } else if (f->state != FiberState::Blocked) {
    return;
  }
  f->timed_out = false;
  if (timing_.enabled()) f->clock_ns = std::max(f->clock_ns, event_time());
  make_runnable(f);
}

namespace {
void switch_to_scheduler(Fiber* f) {
  asan_leave_fiber(f);
  try {
    f->sink = std::move(f->sink).resume();
  } catch (const bctx::detail::forced_unwind&) {
    asan_fiber_resumed(f);  // resumed to be destroyed (Fiber::~Fiber)
    throw;
  }
  asan_fiber_resumed(f);
}
}  // namespace

void Engine::yield_runnable() {
  if (config_.preemption < 1.0 && !timing_.enabled() &&
      static_cast<double>(rng_.next() >> 11) * 0x1.0p-53 >= config_.preemption) {
    return;  // go on without a switch
  }
  Fiber* f = current_;
  f->state = FiberState::Runnable;
  switch_to_scheduler(f);
}

void Engine::catch_up() {
  if (timing_.enabled() && current_->clock_ns > now_ns_) yield_runnable();
}

void Engine::yield_parked(const WaitInfo& wait) {
  Fiber* f = current_;
  f->woken_by_warp = false;
  f->wait = wait;
  f->state = FiberState::Parked;
  switch_to_scheduler(f);
  if (!f->woken_by_warp) f->wait.kind = WaitInfo::Kind::None;
}

void Engine::yield_blocked(const WaitInfo& wait) {
  Fiber* f = current_;
  f->woken_by_warp = false;
  f->wait = wait;
  f->state = FiberState::Blocked;
  switch_to_scheduler(f);
  if (!f->woken_by_warp) f->wait.kind = WaitInfo::Kind::None;
}

bool Engine::yield_timed(const WaitInfo& wait) {
  Fiber* f = current_;
  f->woken_by_warp = false;
  f->wait = wait;
  f->state = FiberState::TimedWait;
  f->timed_out = false;
  switch_to_scheduler(f);
  if (!f->woken_by_warp) f->wait.kind = WaitInfo::Kind::None;
  return !f->timed_out;
}

void Engine::run_fiber(Fiber* f) {
  remove_runnable(f);
  current_ = f;
  last_run_ = f;
  now_ns_ = f->clock_ns;
  asan_enter_fiber(f);
  f->context = std::move(f->context).resume();
  asan_back_on_engine();
  current_ = nullptr;
  ++stats_.fibers_run;
  if (pending_fault_.set) {
    PendingFault pf = std::move(pending_fault_);
    pending_fault_ = PendingFault{};
    fault_device(pf.device, pf.kind, pf.report);
    return;
  }
  switch (f->state) {
    case FiberState::Runnable: make_runnable(f); break;
    case FiberState::Parked:
      f->park_epoch = epoch_;
      ++f->idle_parks;
      add_waiting(parked_, f);
      break;
    case FiberState::TimedWait: add_waiting(timed_, f); break;
    case FiberState::Blocked: break;
    case FiberState::Done: {
      ++epoch_;
      Block* b = f->block;
      b->kernel->end_ns = std::max(b->kernel->end_ns, f->clock_ns);
      --b->live_fibers;
      if (b->live_fibers == 0 && b->pending_async == 0) retire_finished();
      break;
    }
  }
}

bool Engine::step() {
  if (admission_dirty_) admit();
  if (epoch_ != unpark_epoch_ && !parked_.empty()) {
    for (Fiber* f : parked_)
      if (!watch(f)) unpark(f);
    parked_.clear();
  }
  unpark_epoch_ = epoch_;
  if (timing_.enabled()) return step_timed();
  const std::size_t nf = runnable_.size(), na = async_.size();
  if (nf == 0 && na == 0) {
    bool agent_progress = false;
    for (Agent* a : agents_)
      if (a->step()) agent_progress = true;
    if (agent_progress) {
      ++epoch_;
      return true;
    }
    return idle();
  }
  ++stats_.scheduler_steps;
  ++stats_.virtual_cycles;
  if (Fiber* next = neighbour_to_run(); next != nullptr) {
    record_decision(4, static_cast<uint64_t>(next->device), next->block_linear, next->tid);
    run_fiber(next);
    return true;
  }
  const uint64_t pick = rng_.below(nf + na + agents_.size());
  if (pick < nf) {
    Fiber* f = runnable_[pick];
    record_decision(0, static_cast<uint64_t>(f->device), f->block_linear, f->tid);
    run_fiber(f);
  } else if (pick < nf + na) {
    const AsyncOp& op = async_[pick - nf];
    record_decision(1, static_cast<uint64_t>(op.block->kernel->device), op.issuer->tid, op.bytes);
    complete_async(pick - nf);
  } else if (record_decision(2, pick - nf - na, 0, 0), agents_[pick - nf - na]->step()) {
    ++epoch_;
  }
  return true;
}

// Nothing can run now: pause when every stream is empty, else warp the clock or
// report a hang (heads that wait on events never to be recorded hang too).
bool Engine::idle() {
  if (kernels_.empty() && !admission_dirty_) {
    bool pending = false;
    for (const auto& s : streams_) pending |= !s.ops.empty();
    if (!pending) return false;
  }
  warp_or_hang();
  return true;
}

// Timed mode: the earliest of the runnable threads, the bulk copies' next steps and
// the agents' next events; on a tie a copy, then an agent (each completes what a
// thread at the same time may wait for), then a thread.
bool Engine::step_timed() {
  Fiber* f = by_clock_.empty() ? nullptr : by_clock_.front().fiber;
  const std::size_t a = earliest_async();
  const std::size_t agent = earliest_agent();
  const double agent_ns = earliest_agent_ns_;
  if (f == nullptr && a == async_.size() && agent == agents_.size()) return idle();
  ++stats_.scheduler_steps;
  ++stats_.virtual_cycles;
  const double thread_ns = f != nullptr ? f->clock_ns : kNoEvent;
  if (a < async_.size() && async_[a].next_ns() <= std::min(thread_ns, agent_ns)) {
    record_decision(1, static_cast<uint64_t>(async_[a].block->kernel->device), async_[a].issuer->tid,
                    async_[a].bytes);
    complete_async(a);
  } else if (agent < agents_.size() && agent_ns <= thread_ns) {
    // Before time moves on to the agent's event, the parked threads run again, as
    // before a clock warp (recheck_parked): one that parked on a read confirming what
    // it had seen (the acquire after a relaxed poll) goes on now, not at that event.
    if (recheck_parked()) return true;
    record_decision(2, agent, 0, 0);
    now_ns_ = std::max(now_ns_, agent_ns);
    agents_cached_ = false;
    agents_[agent]->step();
    ++epoch_;
  } else {
    record_decision(0, static_cast<uint64_t>(f->device), f->block_linear, f->tid);
    run_fiber(pop_earliest_fiber());
  }
  return true;
}

// Timed mode: takes the runnable thread with the earliest clock (the first to become
// runnable among equals) off the heap; and finds the copy whose next step is earliest
// (async_.size(): none).
Fiber* Engine::pop_earliest_fiber() {
  std::pop_heap(by_clock_.begin(), by_clock_.end(), std::greater<>{});
  Fiber* f = by_clock_.back().fiber;
  by_clock_.pop_back();
  return f;
}

std::size_t Engine::earliest_async() {
  if (async_cached_) return earliest_async_;
  std::size_t best = async_.size();
  for (std::size_t i = 0; i < async_.size(); ++i)
    if (best == async_.size() || async_[i].next_ns() < async_[best].next_ns()) best = i;
  async_cached_ = true;
  return earliest_async_ = best;
}

// Timed mode: the agent whose next event is earliest, the first among equals
// (agents_.size(): none has one).
std::size_t Engine::earliest_agent() {
  if (agents_cached_ && doorbell_stores_seen_ == timing_.doorbell_stores()) return earliest_agent_;
  earliest_agent_ = agents_.size();
  earliest_agent_ns_ = kNoEvent;
  for (std::size_t i = 0; i < agents_.size(); ++i)
    if (const double t = agents_[i]->next_event_ns(); t < earliest_agent_ns_) earliest_agent_ns_ = t, earliest_agent_ = i;
  agents_cached_ = true;
  doorbell_stores_seen_ = timing_.doorbell_stores();
  return earliest_agent_;
}

// Config::locality: with that probability, the next runnable thread after the one
// that ran last, in its block's thread order and at most a warp's width ahead.
Fiber* Engine::neighbour_to_run() {
  if (config_.locality <= 0.0 || last_run_ == nullptr) return nullptr;
  if (config_.locality < 1.0 && static_cast<double>(rng_.next() >> 11) * 0x1.0p-53 >= config_.locality)
    return nullptr;
  const auto& fibers = last_run_->block->fibers;
  const std::size_t n = fibers.size();
  for (std::size_t k = 1; k < n && k <= 32; ++k) {
    Fiber* f = fibers[(last_run_->tid + k) % n].get();
    if (f->state == FiberState::Runnable) return f;
  }
  return nullptr;
}

// Folds one scheduling decision into Stats::schedule_digest (FNV-1a over the words).
void Engine::record_decision(uint64_t what, uint64_t a, uint64_t b, uint64_t c) {
  for (uint64_t word : {what, a, b, c}) {
    stats_.schedule_digest ^= word;
    stats_.schedule_digest *= 0x100000001b3ull;
  }
}

void Engine::admit() {
  admission_dirty_ = false;
  bool again = true;
  while (again) {
    again = false;
    for (const int sid : admission_order_) {
      StreamState& s = streams_[sid];
      while (!s.ops.empty() && !s.head_started) {
        StreamOp& op = s.ops.front();
        if (op.kind == StreamOp::Kind::EventWait && !events_done_[op.event]) break;
        if (op.kind == StreamOp::Kind::EventWait) s.time_ns = std::max(s.time_ns, event_time_ns_[op.event]);
        if (op.kind == StreamOp::Kind::Kernel) {
          s.head_started = true;
          op.kernel->stream = static_cast<int>(sid);
          op.kernel->start_ns = op.kernel->end_ns = s.time_ns + devices_[s.device].props.timing.launch_us * 1000;
          kernels_.push_back(op.kernel);
          break;
        }
        // A 0-byte copy may name null pointers, which memmove and memset must not get.
        if (op.kind == StreamOp::Kind::Memcpy && op.bytes) std::memmove(op.dst, op.src, op.bytes);
        if (op.kind == StreamOp::Kind::Memset && op.bytes) fill_device_memory(find(op.dst), op.dst, op.value, op.bytes);
        if (op.kind == StreamOp::Kind::Memcpy || op.kind == StreamOp::Kind::Memset) wrote(op.dst, op.bytes);
        if (op.kind == StreamOp::Kind::EventRecord) {
          events_done_[op.event] = true;
          event_time_ns_[op.event] = s.time_ns;
          again = true;
        }
        s.ops.pop_front();
        ++epoch_;
        check_host_waiters();
      }
    }
  }
  // Make blocks resident, kernels in admission order, up to each device's capacity.
  for (auto& k : kernels_) {
    DeviceState& d = devices_[k->device];
    const unsigned capacity = static_cast<unsigned>(d.props.sm_count * d.props.max_blocks_per_sm);
    while (k->next_block < k->blocks_total && d.resident_blocks < capacity) start_block(*k);
  }
}

void Engine::start_block(KernelRun& k) {
  const unsigned linear = k.next_block++;
  const Dim3 g = k.config.grid;
  auto block = std::make_unique<Block>();
  block->kernel = &k;
  block->idx = Dim3(linear % g.x, (linear / g.x) % g.y, linear / (g.x * g.y));
  block->smem_bytes = k.config.dynamic_smem_bytes;
  const std::size_t smem_alloc = std::max<std::size_t>((block->smem_bytes + 127) / 128 * 128, 128);
  block->smem.reset(static_cast<uint8_t*>(std::aligned_alloc(128, smem_alloc)));
  std::memset(block->smem.get(), 0xA5, smem_alloc);
  const Dim3 bd = k.config.block;
  const unsigned threads = bd.count();
  block->first_thread = linear * threads;
  if (timing_.enabled()) block->sm = timing_.take_sm(k.device);
  const double start_ns = std::max(k.start_ns, now_ns_);
  if (k.proxy_threads.empty()) k.proxy_threads.resize(std::size_t{k.blocks_total} * threads);
  block->fibers.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) {
    auto f = std::make_unique<Fiber>();
    Fiber* fp = f.get();
    PooledStack stack{stacks_.get(), fp};
    fp->block = block.get();
    fp->tid = t;
    fp->device = k.device;
    fp->block_linear = linear;
    fp->thread_idx = Dim3(t % bd.x, (t / bd.x) % bd.y, t / (bd.x * bd.y));
    fp->kernel_thread = linear * threads + t;
    fp->proxy = &k.proxy_threads[fp->kernel_thread];
    fp->groups.emplace_back();  // the open bulk group
    if (weak_.enabled()) weak_.start_thread(fp);
    fp->clock_ns = start_ns;
    fp->context = bctx::fiber(std::allocator_arg, stack, [this, fp](bctx::fiber&& sink) {
      asan_fiber_started();
      fp->sink = std::move(sink);
      try {
        fp->block->kernel->body();
        check_bulk_reads_at_exit(fp);
      } catch (const KernelFault&) {
        // fault() recorded the report; the kernel is torn down by the scheduler.
      } catch (const bctx::detail::forced_unwind&) {
        asan_fiber_exits();  // destroyed while suspended: its stack is going away
        throw;
      }
      fp->state = FiberState::Done;
      asan_fiber_exits();
      return std::move(fp->sink);
    });
    make_runnable(fp);
    block->fibers.push_back(std::move(f));
  }
  block->live_fibers = threads;
  ++devices_[k.device].resident_blocks;
  k.resident.push_back(std::move(block));
}

// Only the issuing thread can wait for its bulk stores (bulk_wait_group_read), so a
// thread that exits without waiting leaves nothing to keep the block's shared memory
// alive until they have read it: a fault naming the last store, in every schedule.
void Engine::check_bulk_reads_at_exit(Fiber* f) {
  if (!f->open_group_has_store && f->last_store_group <= f->groups_read_waited) return;
  fault(ErrorKind::ProxyRace,
        std::string("the thread exits without waiting for its bulk store (cp.async.bulk shared -> global) issued at ") +
            format_loc(f->last_bulk_store) +
            " to read its shared-memory source (bulk_wait_group_read); only the issuing thread can wait for it, and "
            "the block's shared memory is released once its threads have exited",
        f->last_bulk_store);
}

// Retires finished blocks and kernels; starts waiting blocks.
void Engine::retire_finished() {
  for (std::size_t ki = 0; ki < kernels_.size();) {
    KernelRun& k = *kernels_[ki];
    for (std::size_t bi = 0; bi < k.resident.size();) {
      Block& b = *k.resident[bi];
      if (b.live_fibers == 0 && b.pending_async == 0) {
        if (last_run_ != nullptr && last_run_->block == &b) last_run_ = nullptr;
        if (timing_.enabled()) timing_.release_sm(k.device, b.sm);
        k.resident.erase(k.resident.begin() + static_cast<std::ptrdiff_t>(bi));
        --devices_[k.device].resident_blocks;
        ++k.blocks_done;
        admission_dirty_ = true;
      } else {
        ++bi;
      }
    }
    if (k.blocks_done == k.blocks_total) {
      const int stream = k.stream;
      streams_[stream].time_ns = std::max(streams_[stream].time_ns, k.end_ns);
      proxy_.forget_kernel(&k);
      kernels_.erase(kernels_.begin() + static_cast<std::ptrdiff_t>(ki));
      if (kernels_.empty()) weak_.forget();
      finish_head(stream);
    } else {
      ++ki;
    }
  }
}

void Engine::finish_head(int stream) {
  StreamState& s = streams_[stream];
  s.head_started = false;
  s.ops.pop_front();
  admission_dirty_ = true;
  ++epoch_;
  check_host_waiters();
}

// ---- asynchronous copies ---------------------------------------------------------------------
void Engine::issue_async(const AsyncOp& op) {
  async_.push_back(op);
  if (async_cached_ && (earliest_async_ == async_.size() - 1 || op.next_ns() < async_[earliest_async_].next_ns()))
    earliest_async_ = async_.size() - 1;
  ++op.block->pending_async;
  if (op.kind == AsyncOp::Kind::S2G) {
    ++op.group->pending_reads;
    ++op.group->pending_writes;
  }
}

void Engine::complete_async(std::size_t index) {
  ++epoch_;
  async_cached_ = false;
  AsyncOp& pending = async_[index];
  if (timing_.enabled()) {
    now_ns_ = std::max(now_ns_, pending.next_ns());
    pending.block->kernel->end_ns = std::max(pending.block->kernel->end_ns, now_ns_);
  }
  if (pending.kind == AsyncOp::Kind::S2G && !pending.data) {
    // First step of a shared-to-global copy: read the source. The slot may be reused
    // from now on; the global write is a later, separate step.
    pending.data = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(pending.src),
                                                          static_cast<const uint8_t*>(pending.src) + pending.bytes);
    --pending.group->pending_reads;
    Fiber* f = pending.issuer;
    if (f->state == FiberState::Blocked && f->wait.kind == WaitInfo::Kind::BulkGroup) wake(f);
    return;
  }
  AsyncOp op = std::move(pending);
  async_[index] = std::move(async_.back());
  async_.pop_back();
  ++stats_.async_ops_completed;
  Block* b = op.block;
  --b->pending_async;
  if (op.kind == AsyncOp::Kind::G2S) {
    std::memmove(op.dst, op.src, op.bytes);
    wrote(op.dst, op.bytes);
    if (weak_.enabled()) weak_.bulk_landed(op.issuer, op.dst, op.bytes, true, op.loc);
    if (Mbarrier* m = b->find_mbarrier(reinterpret_cast<uintptr_t>(op.bar))) complete_tx(*m, op.bytes);
  } else {
    std::memcpy(op.dst, op.data->data(), op.bytes);
    wrote(op.dst, op.bytes);
    if (weak_.enabled()) weak_.bulk_landed(op.issuer, op.dst, op.bytes, false, op.loc);
    --op.group->pending_writes;
    Fiber* f = op.issuer;
    if (f->state == FiberState::Blocked && f->wait.kind == WaitInfo::Kind::BulkGroup) wake(f);
  }
  if (b->live_fibers == 0 && b->pending_async == 0) retire_finished();
}

Mbarrier* Engine::mbarrier(uint64_t* bar, Loc loc, bool must_exist) {
  Block* b = current_->block;
  const auto addr = reinterpret_cast<uintptr_t>(bar);
  const auto base = reinterpret_cast<uintptr_t>(b->smem.get());
  if (addr < base || addr + 8 > base + b->smem_bytes)
    fault(ErrorKind::OutOfBounds,
          "mbarrier address " + hex(bar) + " is not in this block's dynamic shared memory [" +
              hex(b->smem.get()) + ", +" + std::to_string(b->smem_bytes) + ")",
          loc);
  if (addr % 8) fault(ErrorKind::Misaligned, "mbarrier address " + hex(bar) + " is not 8-byte aligned", loc);
  Mbarrier* m = b->find_mbarrier(addr);
  if (m == nullptr && must_exist)
    fault(ErrorKind::Misuse, "mbarrier at " + hex(bar) + " used before mbarrier_init (or after inval)", loc);
  return m;
}

void Engine::arrive(Mbarrier& bar, unsigned count) {
  bar.pending_arrivals -= count;
  complete_tx(bar, 0);
}

void Engine::complete_tx(Mbarrier& bar, uint32_t bytes) {
  bar.tx_count -= bytes;
  if (bar.pending_arrivals == 0 && bar.tx_count == 0) {
    ++bar.phases_completed;
    std::swap(bar.phases_released, bar.phases_arrived);  // keeps both capacities
    bar.phases_arrived.clear();
    bar.weak_released = bar.weak_arrived;
    bar.weak_arrived = 0;
    bar.pending_arrivals = bar.expected_arrivals;
    for (Fiber* f : bar.waiters) wake(f);
    bar.waiters.clear();
  }
}

// ---- faults and hangs ------------------------------------------------------------------------
std::string Engine::where(const Fiber* f) const {
  const KernelRun& k = *f->block->kernel;
  std::ostringstream os;
  os << "device " << k.device << " kernel '" << k.config.name << "' block " << dim(f->block->idx) << " thread "
     << dim(f->thread_idx) << " (warp " << f->tid / 32 << " lane " << f->tid % 32 << ")";
  return os.str();
}

void Engine::fault(ErrorKind kind, const std::string& message, Loc loc) {
  std::ostringstream os;
  os << "railyard simulator: " << to_string(kind) << " in " << where(current_) << " at " << format_loc(loc)
     << " (" << loc.function_name() << "): " << message << " [seed " << config_.seed << "]";
  // A wait that gave up because the clock warped: say what every other thread waited
  // on at that moment, so a deadlock reads the same whichever budget ran out first.
  if (kind == ErrorKind::Trap && current_->woken_by_warp)
    os << "\nThe virtual clock had jumped because no thread could make progress; at that point:\n"
       << waits_report();
  if (!pending_fault_.set) {
    pending_fault_.set = true;
    pending_fault_.kind = kind;
    pending_fault_.report = os.str();
    pending_fault_.device = current_->block->kernel->device;
  }
  throw KernelFault{};
}

void Engine::fault_device(int dev, ErrorKind kind, const std::string& report) {
  DeviceState& d = devices_[dev];
  if (!d.faulted) {
    d.faulted = true;
    d.fault_kind = kind;
    d.fault_report = report;
  }
  for (std::size_t ki = 0; ki < kernels_.size();) {
    if (kernels_[ki]->device == dev) {
      destroy_kernel(*kernels_[ki]);
      kernels_.erase(kernels_.begin() + static_cast<std::ptrdiff_t>(ki));
    } else {
      ++ki;
    }
  }
  for (auto& s : streams_) {
    if (s.device != dev) continue;
    s.ops.clear();
    s.head_started = false;
  }
  ++epoch_;
  check_host_waiters();
}

void Engine::destroy_kernel(KernelRun& k) {
  auto in_kernel = [&](Fiber* f) { return f->block->kernel == &k; };
  std::erase_if(runnable_, in_kernel);
  for (std::size_t i = 0; i < runnable_.size(); ++i) runnable_[i]->runnable_index = i;
  std::erase_if(by_clock_, [&](const TimedEntry& e) { return in_kernel(e.fiber); });
  std::make_heap(by_clock_.begin(), by_clock_.end(), std::greater<>{});
  for (Fiber* f : std::vector<Fiber*>(watching_))
    if (in_kernel(f)) unwatch(f);
  for (auto* waiting : {&parked_, &timed_}) {
    std::erase_if(*waiting, in_kernel);
    for (std::size_t i = 0; i < waiting->size(); ++i) (*waiting)[i]->wait_index = i;
  }
  std::erase_if(async_, [&](const AsyncOp& op) { return op.block->kernel == &k; });
  async_cached_ = false;
  devices_[k.device].resident_blocks -= static_cast<unsigned>(k.resident.size());
  if (last_run_ != nullptr && last_run_->block->kernel == &k) last_run_ = nullptr;
  k.resident.clear();  // unwinds the suspended fibers' stacks
  proxy_.forget_kernel(&k);
}

namespace {
// The virtual clock never warps past this (about 86 years at 1.7 GHz): a fiber that
// still polls by then waits on something no cycle budget bounds.
constexpr uint64_t kMaxVirtualCycles = uint64_t{1} << 62;
}  // namespace

// No fiber can make progress. Either pause (a host thread asked for quiescence), or
// warp the virtual clock so that polling waiters run again and their cycle budgets can
// expire, or report a hang.
void Engine::warp_or_hang() {
  if (pause_for_quiescence()) return;
  if (recheck_parked()) return;
  if (epoch_ != warp_epoch_) {
    idle_rounds_ = rounds_without_clock_ = 0;
    warp_cycles_ = std::max<uint64_t>(config_.idle_warp_cycles, 1);
  }
  if (may_warp()) {
    warp_clock();
    return;
  }
  report_hang();
}

// Parking is a guess: a fiber that read a value it had seen before is taken to be
// polling, but a second read can also confirm a wait that the first already ended (a
// relaxed poll that saw the flag, then the acquire load that orders what follows), and
// a wait that polls two addresses parks on the second although the first changed since
// it read it. Such a fiber waits for progress that may never come: everything else may
// be waiting for it. So, before the clock warps, the parked fibers run again at their
// own time, up to kRechecksPerEpoch rounds while nothing progresses (a fiber may take a
// round per false park: a flag, then its confirming acquire); only then does the
// clock warp. The bound keeps a real hang in a two-address wait, which parks on each
// address in turn, from rechecking forever instead of letting its budget expire.
bool Engine::recheck_parked() {
  constexpr unsigned kRechecksPerEpoch = 4;
  if (parked_.empty()) return false;
  if (recheck_epoch_ != epoch_) recheck_epoch_ = epoch_, rechecks_in_epoch_ = 0;
  if (rechecks_in_epoch_ == kRechecksPerEpoch) return false;
  ++rechecks_in_epoch_;
  for (Fiber* f : parked_) unpark(f);
  parked_.clear();
  return true;
}

// A parked fiber runs again, at the time progress happened (the caller empties parked_).
void Engine::unpark(Fiber* f) {
  if (timing_.enabled()) f->clock_ns = std::max(f->clock_ns, now_ns_);
  make_runnable(f);
}

namespace {
// Whether the bytes a poll read differ from what it saw.
bool poll_changed(const Fiber::PollRecord& r) {
  uint64_t v[2] = {0, 0};
  std::memcpy(v, r.addr, r.bytes);
  return v[0] != r.value[0] || v[1] != r.value[1];
}
// Calls fn(page) for each 4 KiB page a fiber's polls touch (a page once per poll).
template <class Fn>
void for_each_watched_page(const Fiber* f, Fn&& fn) {
  for (const Fiber::PollRecord& r : f->polls) {
    const auto a = reinterpret_cast<uintptr_t>(r.addr);
    for (uintptr_t page = a >> 12; page <= (a + r.bytes - 1) >> 12; ++page) fn(page);
  }
}
}  // namespace

// A fiber that parked twice in a row on memory polls with nothing new in between (the
// first park may be a false one: a relaxed poll saw the flag, the confirming acquire
// then read the same value) would, run again, only read the same bytes and park: it
// watches them instead, unless one changed since it read it. Fibers that poll an
// mbarrier or sleep always run again.
bool Engine::watch(Fiber* f) {
  if (f->idle_parks < 2 || f->wait.kind != WaitInfo::Kind::Poll || f->polls.empty()) return false;
  for (const Fiber::PollRecord& r : f->polls)
    if (!r.memory || poll_changed(r)) return false;
  for_each_watched_page(f, [&](uintptr_t page) {
    std::vector<Fiber*>& w = watched_pages_[page];
    if (std::find(w.begin(), w.end(), f) == w.end()) w.push_back(f);
  });
  f->watching = true;
  add_waiting(watching_, f);
  return true;
}

void Engine::unwatch(Fiber* f) {
  for_each_watched_page(f, [&](uintptr_t page) {
    auto it = watched_pages_.find(page);
    if (it == watched_pages_.end()) return;
    std::erase(it->second, f);
    if (it->second.empty()) watched_pages_.erase(it);
  });
  f->watching = false;
  remove_waiting(watching_, f);
}

// The watchers of the pages [addr, addr + bytes) touches whose polled bytes there now
// differ from what they saw run again.
void Engine::wake_watchers(uintptr_t addr, std::size_t bytes) {
  if (bytes == 0) return;
  for (uintptr_t page = addr >> 12; page <= (addr + bytes - 1) >> 12; ++page) {
    auto it = watched_pages_.find(page);
    if (it == watched_pages_.end()) continue;
    const std::vector<Fiber*> fibers = it->second;  // unwatch edits the page's list
    for (Fiber* f : fibers) {
      bool changed = false;
      for (const Fiber::PollRecord& r : f->polls) {
        const auto a = reinterpret_cast<uintptr_t>(r.addr);
        changed |= a < addr + bytes && addr < a + r.bytes && poll_changed(r);
      }
      if (!changed) continue;
      unwatch(f);
      unpark(f);
    }
  }
}

// A clock warp or the host's turn (which may have written anything): every watcher runs again.
void Engine::wake_all_watchers() {
  while (!watching_.empty()) {
    Fiber* f = watching_.back();
    unwatch(f);
    unpark(f);
  }
}

// A host thread asked to run until nothing more can happen on its own (stream_query):
// stop here instead of warping the clock. quiescent_ stays set, so the engine idles,
// until the next host call.
bool Engine::pause_for_quiescence() {
  bool wants_quiescence = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    for (const HostWaiter* w : host_waiters_) wants_quiescence |= w->wants_quiescence;
  }
  if (!wants_quiescence) return false;
  quiescent_ = true;
  check_host_waiters();
  return true;
}

// Whether the clock may warp once more. A waiter that reads clock64() between two
// warps is timing its wait against a cycle budget (pipeline::timeout_while): after
// max_idle_rounds steady jumps (short budgets run out one jump apart, in the order the
// waits began) the jumps double, so any budget up to kMaxVirtualCycles expires after a
// few dozen more rounds, and
// such rounds do not count towards Config::max_idle_rounds. A waiter that polls
// without reading the clock can only be released by another thread, which none is:
// after max_idle_rounds such rounds in a row it is a hang.
bool Engine::may_warp() {
  if (parked_.empty() && timed_.empty() && watching_.empty()) return false;  // every fiber is blocked for good
  if (idle_rounds_ > 0) {
    if (clock_reads_ == warp_clock_reads_) {
      ++rounds_without_clock_;
    } else {
      // Consecutive rounds count: a wait that polls two flags may park on the second
      // and read the clock only every other round.
      rounds_without_clock_ = 0;
      if (idle_rounds_ >= config_.max_idle_rounds && warp_cycles_ <= kMaxVirtualCycles / 2)
        warp_cycles_ *= 2;  // steady jumps first: short budgets run out in the order they started
    }
  }
  return rounds_without_clock_ < config_.max_idle_rounds &&
         stats_.virtual_cycles <= kMaxVirtualCycles - std::min(warp_cycles_, kMaxVirtualCycles);
}

void Engine::warp_clock() {
  ++idle_rounds_;
  stats_.virtual_cycles += warp_cycles_;
  record_decision(3, warp_cycles_, parked_.size() + watching_.size(), timed_.size());
  // Timed mode: the waiters' clocks jump as far past the latest time reached.
  const double warp_ns = timing_.enabled() ? timing_.cycles_to_ns(0, static_cast<double>(warp_cycles_)) : 0.0;
  while (!watching_.empty()) {
    Fiber* f = watching_.back();
    unwatch(f);
    add_waiting(parked_, f);
  }
  for (Fiber* f : parked_) {
    f->woken_by_warp = true;
    if (timing_.enabled()) f->clock_ns = std::max(f->clock_ns, now_ns_) + warp_ns;
    make_runnable(f);
  }
  parked_.clear();
  for (Fiber* f : timed_) {
    f->timed_out = f->woken_by_warp = true;
    if (timing_.enabled()) f->clock_ns = std::max(f->clock_ns, now_ns_) + warp_ns;
    make_runnable(f);
  }
  timed_.clear();
  unpark_epoch_ = epoch_;
  warp_epoch_ = epoch_;
  warp_clock_reads_ = clock_reads_;
}

// Faults every device with a kernel or a pending stream operation with the hang report.
void Engine::report_hang() {
  std::string report = hang_report();
  if (rounds_without_clock_ < config_.max_idle_rounds && (!parked_.empty() || !timed_.empty() || !watching_.empty()))
    report += "the virtual clock reached its limit of 2^62 cycles while the waits above still read it: "
              "no cycle budget bounds them\n";
  std::vector<int> devs;
  for (const auto& k : kernels_) devs.push_back(k->device);
  for (std::size_t s = 0; s < streams_.size(); ++s)
    if (!streams_[s].ops.empty()) devs.push_back(streams_[s].device);
  std::sort(devs.begin(), devs.end());
  devs.erase(std::unique(devs.begin(), devs.end()), devs.end());
  for (int d : devs) fault_device(d, ErrorKind::Hang, report);
}

namespace {
std::string lanes_string(const std::vector<unsigned>& lanes) {
  std::ostringstream os;
  for (std::size_t i = 0; i < lanes.size();) {
    std::size_t j = i;
    while (j + 1 < lanes.size() && lanes[j + 1] == lanes[j] + 1) ++j;
    if (i) os << ",";
    os << lanes[i];
    if (j > i) os << "-" << lanes[j];
    i = j + 1;
  }
  return os.str();
}
}  // namespace

std::string Engine::hang_report() const {
  std::ostringstream os;
  os << "railyard simulator: hang: no thread can make progress (seed " << config_.seed << ", "
     << stats_.scheduler_steps << " steps, virtual clock " << stats_.virtual_cycles << " cycles)\n"
     << waits_report();
  return os.str();
}

// Every kernel's blocks and warps, the lanes grouped by what they wait on; stream heads
// waiting on events, pending bulk copies and agents.
std::string Engine::waits_report() const {
  std::ostringstream os;
  for (const auto& kp : kernels_) {
    const KernelRun& k = *kp;
    os << "device " << k.device << " stream " << k.stream << " kernel '" << k.config.name << "' grid "
       << dim(k.config.grid) << " block " << dim(k.config.block) << ": " << k.blocks_done << " of "
       << k.blocks_total << " blocks done\n";
    for (const auto& bp : k.resident) {
      const Block& b = *bp;
      os << "  block " << dim(b.idx) << ":\n";
      const unsigned warps = (static_cast<unsigned>(b.fibers.size()) + 31) / 32;
      for (unsigned w = 0; w < warps; ++w) {
        // Group the warp's lanes by what they wait on.
        std::vector<std::pair<std::string, std::vector<unsigned>>> groups;
        for (unsigned l = 0; l < 32 && w * 32 + l < b.fibers.size(); ++l) {
          const Fiber& f = *b.fibers[w * 32 + l];
          std::ostringstream d;
          const WaitInfo& wi = f.wait;
          // A fiber woken only by a clock warp is described by the wait it was in.
          const bool warped = f.state == FiberState::Runnable && f.woken_by_warp && wi.kind != WaitInfo::Kind::None;
          switch (warped ? FiberState::Blocked : f.state) {
            case FiberState::Done: d << "exited"; break;
            case FiberState::Runnable: d << "runnable"; break;
            default:
              switch (wi.kind) {
                case WaitInfo::Kind::Barrier: {
                  const auto id = reinterpret_cast<uintptr_t>(wi.addr);
                  d << wi.what << " (barrier id " << id << ": " << b.barriers[id].arrived << " of "
                    << b.barriers[id].expected << " threads arrived)";
                  break;
                }
                case WaitInfo::Kind::Warp: {
                  uint32_t arrived = 0;
                  for (const auto& c : b.warp_collectives[w])
                    if (c.mask == wi.a) arrived = c.arrived;
                  char buf[64];
                  std::snprintf(buf, sizeof buf, " mask 0x%08x, lanes arrived 0x%08x", static_cast<unsigned>(wi.a),
                                arrived);
                  d << wi.what << buf;
                  break;
                }
                case WaitInfo::Kind::Mbarrier: {
                  auto it = b.mbarriers.find(reinterpret_cast<uintptr_t>(wi.addr));
                  d << "mbarrier " << hex(wi.addr) << " wait parity " << wi.a;
                  if (it != b.mbarriers.end()) {
                    const Mbarrier& m = it->second;
                    d << " (phases completed " << m.phases_completed << ", arrivals pending "
                      << m.pending_arrivals << " of " << m.expected_arrivals << ", tx bytes pending "
                      << m.tx_count << ")";
                  }
                  break;
                }
                case WaitInfo::Kind::Poll:
                  d << "polling " << wi.what << " at " << hex(wi.addr) << " (value " << wi.a << ")";
                  break;
                case WaitInfo::Kind::BulkGroup:
                  d << wi.what << " (at most " << wi.a << " groups pending; " << wi.b << " pending)";
                  break;
                case WaitInfo::Kind::Sleep: d << wi.what; break;
                case WaitInfo::Kind::None: d << "waiting"; break;
              }
              d << " at " << format_loc(wi.loc);
          }
          const std::string key = d.str();
          auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
          if (it == groups.end()) groups.push_back({key, {l}});
          else it->second.push_back(l);
        }
        for (const auto& [what, lanes] : groups) {
          if (what == "exited") continue;
          os << "    warp " << w << " lanes " << lanes_string(lanes) << ": " << what << "\n";
        }
      }
    }
    if (k.next_block < k.blocks_total)
      os << "  " << k.blocks_total - k.next_block << " blocks not yet resident\n";
  }
  for (std::size_t s = 0; s < streams_.size(); ++s) {
    const StreamState& st = streams_[s];
    if (st.ops.empty() || st.head_started) continue;
    const StreamOp& op = st.ops.front();
    if (op.kind == StreamOp::Kind::EventWait)
      os << "device " << st.device << " stream " << s << ": waits for event " << op.event
         << ", which is never recorded\n";
  }
  for (const AsyncOp& op : async_)
    os << "pending bulk copy of " << op.bytes << " bytes issued at " << format_loc(op.loc)
       << (op.data ? " (source read, write pending)" : "") << "\n";
  for (const Agent* a : agents_) os << "agent: " << a->describe() << "\n";
  return os.str();
}

}  // namespace railyard::sim::detail
