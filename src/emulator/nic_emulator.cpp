// Railyard: the GPU-in-the-loop NIC emulator (nic_emulator.hpp).
#include "src/emulator/nic_emulator.hpp"

#include <chrono>
#include <cstring>
#include <stdexcept>

namespace railyard::emulator {

namespace mlx5 = transport::mlx5;

void HostMemory::read(void* to, const void* from, std::size_t bytes) { std::memcpy(to, from, bytes); }
void HostMemory::write(void* to, const void* from, std::size_t bytes) { std::memcpy(to, from, bytes); }

// ---- the emulator's world --------------------------------------------------------------

bool NicEmulator::World::in_arena(const void* ptr, std::size_t bytes) const {
  const auto* p = static_cast<const uint8_t*>(ptr);
  return p >= arena_ && bytes <= arena_bytes_ && static_cast<std::size_t>(p - arena_) <= arena_bytes_ - bytes;
}

namespace {
bool is_word(const void* ptr, std::size_t bytes) {
  return (bytes == 4 || bytes == 8) && reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}
template <class Word>
void load_acquire(void* to, const void* from) {
  const Word v = std::atomic_ref<Word>(*static_cast<Word*>(const_cast<void*>(from))).load(std::memory_order_acquire);
  std::memcpy(to, &v, sizeof v);
}
template <class Word>
void store_release(void* to, const void* from) {
  Word v;
  std::memcpy(&v, from, sizeof v);
  std::atomic_ref<Word>(*static_cast<Word*>(to)).store(v, std::memory_order_release);
}
}  // namespace

// The doorbell, the records and a CQE's owner word are single words the GPU stores
// with one instruction: read with an acquire, so what the GPU wrote before them (the
// WQEs, after its system-scope fence) is visible to the plain reads that follow.
void NicEmulator::World::read(void* to, const void* from, std::size_t bytes) {
  if (!in_arena(from, bytes)) return memory_.read(to, from, bytes);
  if (!is_word(from, bytes)) return static_cast<void>(std::memcpy(to, from, bytes));
  bytes == 8 ? load_acquire<uint64_t>(to, from) : load_acquire<uint32_t>(to, from);
}

// Payload and atomics land in the GPU's memory through `memory_`, each complete before
// the next starts; CQEs land in the arena, the owner word (the model's only release
// there) last, with a release.
void NicEmulator::World::write(void* to, const void* from, std::size_t bytes, sim::AgentOrder order,
                               const char* /*what*/, std::source_location /*loc*/) {
  if (!in_arena(to, bytes)) return memory_.write(to, from, bytes);
  if (order != sim::AgentOrder::Release || !is_word(to, bytes)) return static_cast<void>(std::memcpy(to, from, bytes));
  bytes == 8 ? store_release<uint64_t>(to, from) : store_release<uint32_t>(to, from);
}

void NicEmulator::World::fault(const std::string& report) {
  const std::lock_guard<std::mutex> lock(mutex_);
  faults_.push_back(report);
}

std::vector<std::string> NicEmulator::World::faults() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return faults_;
}

// ---- the emulator --------------------------------------------------------------------------

NicEmulator::NicEmulator(EmulatorMemory& memory, void* arena, std::size_t arena_bytes, sim::NicConfig config)
    : arena_(static_cast<uint8_t*>(arena)),
      arena_bytes_(arena_bytes),
      world_(memory, arena_, arena_bytes),
      model_(world_, 0, "emulated NIC", config) {
  if (arena == nullptr || reinterpret_cast<uintptr_t>(arena) % mlx5::kWqeBasicBlockBytes != 0)
    throw std::invalid_argument("NicEmulator: arena must be 64-byte aligned host memory, got " +
                                std::to_string(reinterpret_cast<uintptr_t>(arena)));
}

NicEmulator::~NicEmulator() { stop(); }

void NicEmulator::check_stopped(const char* call) const {
  if (thread_.joinable())
    throw std::logic_error(std::string("NicEmulator::") + call + ": the emulator is running; stop() it first");
}

uint32_t NicEmulator::register_memory(void* base, std::size_t bytes) {
  check_stopped("register_memory");
  if (base == nullptr || bytes == 0)
    throw std::invalid_argument("NicEmulator::register_memory: base must be non-null and bytes positive");
  return model_.register_memory(base, bytes);
}

uint8_t* NicEmulator::carve(std::size_t bytes, const char* what) {
  const std::size_t aligned = (bytes + mlx5::kWqeBasicBlockBytes - 1) / mlx5::kWqeBasicBlockBytes *
                              mlx5::kWqeBasicBlockBytes;
  if (aligned > arena_bytes_ - arena_used_)
    throw std::length_error("NicEmulator::create_qp: the arena of " + std::to_string(arena_bytes_) +
                            " bytes has " + std::to_string(arena_bytes_ - arena_used_) + " left, " + what +
                            " needs " + std::to_string(aligned));
  uint8_t* p = arena_ + arena_used_;
  arena_used_ += aligned;
  std::memset(p, 0, aligned);
  return p;
}

sim::NicQueues NicEmulator::create_qp(uint32_t log2_sq_wqebbs, uint32_t log2_ncqe) {
  check_stopped("create_qp");
  sim::NicModel::check_queue_sizes("create_qp", log2_sq_wqebbs, log2_ncqe);
  sim::NicQueues q;
  q.log2_sq_wqebbs = log2_sq_wqebbs;
  q.log2_ncqe = log2_ncqe;
  q.sq = carve(std::size_t{mlx5::kWqeBasicBlockBytes} << log2_sq_wqebbs, "the send queue");
  q.cq = reinterpret_cast<mlx5::Cqe*>(carve(sizeof(mlx5::Cqe) << log2_ncqe, "the CQ"));
  // The doorbell ("doorbell page"), the send record and the CQ's record, one block each.
  q.uar = reinterpret_cast<uint64_t*>(carve(sizeof(uint64_t), "the doorbell"));
  q.dbr = reinterpret_cast<uint32_t*>(carve(2 * sizeof(uint32_t), "the doorbell record"));
  q.cq_dbr = reinterpret_cast<uint32_t*>(carve(2 * sizeof(uint32_t), "the CQ record"));
  sim::NicModel::init_cqes(q.cq, log2_ncqe);
  return model_.adopt_qp(q);
}

void NicEmulator::connect(uint32_t qpn, uint32_t peer_qpn) {
  check_stopped("connect");
  model_.connect(qpn, model_, peer_qpn);
}

void NicEmulator::start() {
  check_stopped("start");
  stop_.store(false);
  thread_ = std::thread([this] {
    unsigned idle = 0;
    try {
      while (!stop_.load(std::memory_order_relaxed)) {
        if (model_.step()) {
          idle = 0;
        } else if (++idle > 1024) {
          std::this_thread::yield();
        }
      }
    } catch (const std::exception& e) {
      // A copy the memory refused (the GPU's context gone, say): reported, the thread ends.
      world_.fault(std::string("emulated NIC: ") + e.what());
    }
  });
}

void NicEmulator::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

std::vector<std::string> NicEmulator::faults() const { return world_.faults(); }

std::string NicEmulator::describe() const {
  check_stopped("describe");
  return model_.describe();
}

}  // namespace railyard::emulator
