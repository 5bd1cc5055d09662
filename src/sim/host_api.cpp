// Railyard simulator: host-side API (include/railyard/sim/sim.hpp).
#include <exception>
#include <sstream>
#include <thread>

#include "engine.hpp"

namespace railyard::sim {

using detail::Engine;
using detail::KernelRun;
using detail::StreamOp;

namespace {
Engine& engine() { return Engine::get(); }

void check_device(const Engine& e, int device, const char* fn) {
  if (device < 0 || device >= e.device_count())
    throw std::invalid_argument(std::string("railyard::sim::") + fn + ": device " + std::to_string(device) +
                                " does not exist; expected 0.." + std::to_string(e.device_count() - 1));
}

void check_stream(const Engine& e, Stream s, const char* fn, int num_streams) {
  if (s.id < 0 || s.id >= num_streams)
    throw std::invalid_argument(std::string("railyard::sim::") + fn + ": stream " + std::to_string(s.id) +
                                " does not exist");
}

// A host pointer range used by memcpy/memset must not run past a simulated allocation.
void check_host_range(const Engine& e, const void* p, std::size_t bytes, const char* fn, const char* arg) {
  const detail::Allocation* a = e.find(p);
  if (!a) return;  // ordinary host memory
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr + bytes > a->base + a->bytes) {
    std::ostringstream os;
    os << "railyard::sim::" << fn << ": " << arg << " range of " << bytes << " bytes runs "
       << addr + bytes - (a->base + a->bytes) << " bytes past the end of allocation '" << a->label << "' ("
       << a->bytes << " bytes)";
    throw Error(ErrorKind::OutOfBounds, os.str());
  }
}
}  // namespace

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Hang: return "hang";
    case ErrorKind::OutOfBounds: return "out-of-bounds access";
    case ErrorKind::Misaligned: return "misaligned access";
    case ErrorKind::Trap: return "trap";
    case ErrorKind::Misuse: return "misuse";
    case ErrorKind::PeerAccess: return "peer access violation";
    case ErrorKind::ProxyRace: return "async-proxy race";
    case ErrorKind::DataRace: return "data race";
  }
  return "error";
}

void reset(const Config& config) {
  Engine& e = engine();
  auto lock = e.acquire();
  e.reset(config);
}

const Config& config() {
  Engine& e = engine();
  auto lock = e.acquire();
  return e.config();
}

int add_device(const DeviceProps& props) {
  Engine& e = engine();
  auto lock = e.acquire();
  return e.add_device(props);
}

int device_count() {
  Engine& e = engine();
  auto lock = e.acquire();
  return e.device_count();
}

const DeviceProps& device_props(int device) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_device(e, device, "device_props");
  return e.device(device).props;
}

void enable_peer_access(int device, int peer) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_device(e, device, "enable_peer_access");
  check_device(e, peer, "enable_peer_access");
  e.enable_peer(device, peer);
}

bool peer_access_enabled(int device, int peer) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_device(e, device, "peer_access_enabled");
  check_device(e, peer, "peer_access_enabled");
  return e.device(device).peer[peer];
}

void* malloc_device(int device, std::size_t bytes, std::string label) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_device(e, device, "malloc_device");
  return e.allocate(device, bytes, label.empty() ? "device " + std::to_string(device) + " buffer" : std::move(label));
}

void* malloc_host(std::size_t bytes, std::string label) {
  Engine& e = engine();
  auto lock = e.acquire();
  return e.allocate(-1, bytes, label.empty() ? "pinned host buffer" : std::move(label));
}

void free(void* ptr) {
  Engine& e = engine();
  auto lock = e.acquire();
  e.deallocate(ptr);
}

void register_memory(int device, void* ptr, std::size_t bytes, std::string label) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_device(e, device, "register_memory");
  e.register_range(device, ptr, bytes,
                   label.empty() ? "registered memory of device " + std::to_string(device) : std::move(label));
}

void unregister_memory(void* ptr) {
  Engine& e = engine();
  auto lock = e.acquire();
  e.unregister_range(ptr);
}

bool find_allocation(const void* ptr, AllocationInfo* out) {
  Engine& e = engine();
  auto lock = e.acquire();
  const detail::Allocation* a = e.find(ptr);
  if (!a) return false;
  if (out) *out = AllocationInfo{a->base, a->bytes, a->device, a->label};
  return true;
}

std::size_t live_allocation_count() {
  Engine& e = engine();
  auto lock = e.acquire();
  return e.live_allocations();
}

std::size_t live_allocation_bytes() {
  Engine& e = engine();
  auto lock = e.acquire();
  return e.live_bytes();
}

Stream default_stream(int device) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_device(e, device, "default_stream");
  return Stream{e.device(device).default_stream};
}

Stream create_stream(int device) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_device(e, device, "create_stream");
  return Stream{e.new_stream(device)};
}

int stream_device(Stream stream) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_stream(e, stream, "stream_device", e.stream_count());
  return e.stream_device(stream.id);
}

void launch(Stream stream, const LaunchConfig& config, std::function<void()> body) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_stream(e, stream, "launch", e.stream_count());
  const int dev = e.stream_device(stream.id);
  const DeviceProps& props = e.device(dev).props;
  const std::string who = "railyard::sim::launch('" + config.name + "'): ";
  const Dim3 g = config.grid, b = config.block;
  if (g.x == 0 || g.y == 0 || g.z == 0)
    throw std::invalid_argument(who + "grid (" + std::to_string(g.x) + "," + std::to_string(g.y) + "," +
                                std::to_string(g.z) + ") has a zero dimension; expected every dimension >= 1");
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.count() > static_cast<unsigned>(props.max_threads_per_block))
    throw std::invalid_argument(who + "block has " + std::to_string(b.count()) + " threads; expected 1.." +
                                std::to_string(props.max_threads_per_block));
  if (config.dynamic_smem_bytes > props.smem_per_block_optin_bytes)
    throw std::invalid_argument(who + "dynamic shared memory of " + std::to_string(config.dynamic_smem_bytes) +
                                " bytes exceeds the device's " + std::to_string(props.smem_per_block_optin_bytes) +
                                " bytes per block");
  e.throw_if_faulted(dev);
  auto k = std::make_shared<KernelRun>();
  k->device = dev;
  k->config = config;
  k->body = std::move(body);
  k->blocks_total = g.count();
  StreamOp op;
  op.kind = StreamOp::Kind::Kernel;
  op.kernel = std::move(k);
  e.enqueue(stream.id, std::move(op));
}

void memcpy_async(Stream stream, void* dst, const void* src, std::size_t bytes) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_stream(e, stream, "memcpy_async", e.stream_count());
  e.throw_if_faulted(e.stream_device(stream.id));
  check_host_range(e, dst, bytes, "memcpy_async", "dst");
  check_host_range(e, src, bytes, "memcpy_async", "src");
  StreamOp op;
  op.kind = StreamOp::Kind::Memcpy;
  op.dst = dst;
  op.src = src;
  op.bytes = bytes;
  e.enqueue(stream.id, std::move(op));
}

void memset_async(Stream stream, void* dst, int value, std::size_t bytes) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_stream(e, stream, "memset_async", e.stream_count());
  e.throw_if_faulted(e.stream_device(stream.id));
  check_host_range(e, dst, bytes, "memset_async", "dst");
  StreamOp op;
  op.kind = StreamOp::Kind::Memset;
  op.dst = dst;
  op.value = value;
  op.bytes = bytes;
  e.enqueue(stream.id, std::move(op));
}

Event record_event(Stream stream) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_stream(e, stream, "record_event", e.stream_count());
  const int dev = e.stream_device(stream.id);
  StreamOp op;
  op.kind = StreamOp::Kind::EventRecord;
  op.event = e.new_event(dev);
  e.enqueue(stream.id, op);
  return Event{op.event};
}

void stream_wait_event(Stream stream, Event event) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_stream(e, stream, "stream_wait_event", e.stream_count());
  if (event.id < 0 || event.id >= e.event_count())
    throw std::invalid_argument("railyard::sim::stream_wait_event: event " + std::to_string(event.id) +
                                " does not exist");
  StreamOp op;
  op.kind = StreamOp::Kind::EventWait;
  op.event = event.id;
  e.enqueue(stream.id, op);
}

double elapsed_ns(Event start, Event end) {
  Engine& e = engine();
  auto lock = e.acquire();
  if (!e.config().timed)
    throw std::logic_error("railyard::sim::elapsed_ns: the simulator is not in the timed mode (Config::timed)");
  for (const Event ev : {start, end}) {
    if (ev.id < 0 || ev.id >= e.event_count())
      throw std::invalid_argument("railyard::sim::elapsed_ns: event " + std::to_string(ev.id) + " does not exist");
    if (!e.event_done(ev.id))
      throw std::logic_error("railyard::sim::elapsed_ns: event " + std::to_string(ev.id) +
                             " is not done yet; synchronize on it first");
  }
  return e.elapsed_ns(start.id, end.id);
}

void stream_synchronize(Stream stream) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_stream(e, stream, "stream_synchronize", e.stream_count());
  const int dev = e.stream_device(stream.id);
  e.block_until(lock, [&] { return e.stream_empty(stream.id) || e.device(dev).faulted; });
  e.throw_if_faulted(dev);
}

void device_synchronize(int device) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_device(e, device, "device_synchronize");
  e.block_until(lock, [&] { return e.device_idle(device) || e.device(device).faulted; });
  e.throw_if_faulted(device);
}

void event_synchronize(Event event) {
  Engine& e = engine();
  auto lock = e.acquire();
  if (event.id < 0 || event.id >= e.event_count())
    throw std::invalid_argument("railyard::sim::event_synchronize: event " + std::to_string(event.id) +
                                " does not exist");
  const int dev = e.event_device(event.id);
  e.block_until(lock, [&] { return e.event_done(event.id) || e.device(dev).faulted; });
  e.throw_if_faulted(dev);
}

bool stream_query(Stream stream) {
  Engine& e = engine();
  auto lock = e.acquire();
  check_stream(e, stream, "stream_query", e.stream_count());
  const int dev = e.stream_device(stream.id);
  e.block_until(
      lock, [&] { return e.stream_empty(stream.id) || e.device(dev).faulted || e.quiescent(); }, true);
  e.throw_if_faulted(dev);
  return e.stream_empty(stream.id);
}

void run_ranks(int num_ranks, const std::function<void(int rank)>& fn) {
  if (num_ranks < 1)
    throw std::invalid_argument("railyard::sim::run_ranks: num_ranks is " + std::to_string(num_ranks) +
                                "; expected >= 1");
  Engine& e = engine();
  { auto lock = e.acquire(); }  // the caller participates: it is blocked while it joins
  e.add_preassigned(num_ranks);
  std::vector<std::exception_ptr> errors(num_ranks);
  std::vector<std::thread> threads;
  threads.reserve(num_ranks);
  {
    // Joining is a wait that no host thread ends: rank threads leave the world
    // themselves (Engine::leave).
    const bool waiting = e.begin_host_wait();
    for (int r = 0; r < num_ranks; ++r) {
      threads.emplace_back([&, r] {
        e.adopt_preassigned();
        try {
          fn(r);
        } catch (...) {
          errors[r] = std::current_exception();
        }
        e.leave();
      });
    }
    for (auto& t : threads) t.join();
    if (waiting) e.end_host_wait();
  }
  for (auto& err : errors)
    if (err) std::rethrow_exception(err);
}

bool HostCondition::wait_until(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline,
                               const std::function<bool()>& ready) {
  Engine& e = engine();
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    detail::HostSleeper sleeper{.condition = this};
    const bool counted = e.begin_host_sleep(sleeper);
    cv_.wait_until(lock, deadline);
    if (counted) e.end_host_sleep(sleeper);
  }
  return true;
}

void HostCondition::notify_all() {
  engine().release_host_sleepers(this);
  cv_.notify_all();
}

void add_agent(Agent* agent) {
  Engine& e = engine();
  auto lock = e.acquire();
  e.add_agent(agent);
}

void remove_agent(Agent* agent) {
  Engine& e = engine();
  auto lock = e.acquire();
  e.remove_agent(agent);
}

// The engine thread runs Agent::step() holding the world: no lock to take here.
void agent_fault(int device, ErrorKind kind, const std::string& report) {
  engine().agent_fault(device, kind, report);
}

void agent_write(const std::string& agent, const void* ptr, std::size_t bytes, AgentOrder order, const char* op,
                 std::source_location loc) {
  engine().wrote(ptr, bytes);  // wakes the threads polling these bytes
  detail::WeakMemory& weak = engine().weak();
  if (weak.enabled())
    weak.agent_write(agent, ptr, bytes, order == AgentOrder::Plain ? device::Order::Plain : device::Order::Release,
                     op, loc);
}

void agent_count_bytes(int from, int to, std::size_t bytes) { engine().count_nic_bytes(from, to, bytes); }

uint64_t doorbell_release(const void* ptr) { return engine().weak().doorbell_release(ptr); }

bool agent_read(int device, const std::string& agent, const void* ptr, std::size_t bytes, uint64_t released,
                const char* op, std::source_location loc) {
  detail::WeakMemory& weak = engine().weak();
  if (!weak.enabled()) return true;
  const std::string report = weak.agent_read(agent, ptr, bytes, released, op, loc);
  if (report.empty()) return true;
  engine().agent_fault(device, ErrorKind::DataRace, report);
  return false;
}

void register_doorbell(void* ptr, std::size_t bytes) {
  Engine& e = engine();
  auto lock = e.acquire();
  e.weak().add_doorbell(ptr, bytes);
  e.timing().add_doorbell(ptr, bytes);
}

void unregister_doorbell(void* ptr) {
  Engine& e = engine();
  auto lock = e.acquire();
  e.weak().remove_doorbell(ptr);
  e.timing().remove_doorbell(ptr);
}

// From an agent's step() (or next_event_ns()), on the engine thread: no lock to take.
double doorbell_rung_ns(const void* ptr) { return engine().timing().doorbell_rung_ns(ptr); }
void take_doorbell(const void* ptr) { engine().timing().take_doorbell(ptr); }
double nic_pass(int device, NicPipe pipe, double ready_ns, std::size_t bytes) {
  return engine().timing().nic_pass(device, pipe, ready_ns, bytes);
}

Traffic traffic() {
  Engine& e = engine();
  auto lock = e.acquire();
  return e.traffic();
}

void reset_traffic() {
  Engine& e = engine();
  auto lock = e.acquire();
  e.reset_traffic();
  e.timing().reset_busy();
}

std::vector<BusyTime> busy_time() {
  Engine& e = engine();
  auto lock = e.acquire();
  return e.timing().busy();
}

std::vector<WaitTotal> wait_profile() {
  Engine& e = engine();
  auto lock = e.acquire();
  return e.timing().wait_profile();
}

Stats stats() {
  Engine& e = engine();
  auto lock = e.acquire();
  return e.stats();
}

}  // namespace railyard::sim
