// Railyard: the GPU-in-the-loop NIC emulator. The mlx5 NIC model (sim/nic_model.hpp),
// the same WQE parser and executor the simulated NIC runs, on a CPU thread beside a
// real GPU that has no NIC: the CUDA build of the mlx5 lane writes its WQEs, doorbell
// record and doorbell ("the doorbell page") and polls its CQ in host memory the GPU
// maps (cudaHostAllocMapped), and the thread parses what it wrote, moves the payload
// between regions of the GPU's memory and writes atomics and CQEs back. It checks,
// under the real memory model, what the simulator cannot: the lane's fences before the
// doorbell, its byte swaps in real PTX, ring wrap and completion polling
// (docs/design-internode.md, "The NIC emulator").
//
//   EmulatorMemory   how the thread reaches memory other than its queues: the GPU's
//                    through the CUDA runtime (the test's), or host memory;
//   NicEmulator      the queues carved from a host arena, registrations, loopback
//                    connections, and the thread.
//
// Its world differs from the simulator's in what it checks, not in what it executes:
// no weak memory mode (the GPU's own model is the one under test), no clock. Reads of
// the arena take an acquire (8 bytes or fewer) or follow one; an atomic and a CQE's
// owner word are written with a release, as a NIC makes them visible after what it
// placed before them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "railyard/sim/nic_model.hpp"

namespace railyard::emulator {

// Memory outside the arena, by the GPU's addresses. Both calls are complete on return
// (a read has the bytes, a write has landed), so the model's order of writes is the
// order in which the GPU can see them.
class EmulatorMemory {
 public:
  virtual ~EmulatorMemory() = default;
  virtual void read(void* to, const void* from, std::size_t bytes) = 0;
  virtual void write(void* to, const void* from, std::size_t bytes) = 0;
};

// Host memory: for a test without a GPU, where the "device" regions are host memory.
class HostMemory final : public EmulatorMemory {
 public:
  void read(void* to, const void* from, std::size_t bytes) override;
  void write(void* to, const void* from, std::size_t bytes) override;
};

class NicEmulator {
 public:
  // `arena`: host memory of `arena_bytes` that the GPU reaches at the same addresses
  // (mapped pinned memory under unified addressing), 64-byte aligned, for the queues.
  NicEmulator(EmulatorMemory& memory, void* arena, std::size_t arena_bytes, sim::NicConfig config = {});
  ~NicEmulator();  // stops the thread
  NicEmulator(const NicEmulator&) = delete;
  NicEmulator& operator=(const NicEmulator&) = delete;

  // Set-up, before start() or after stop() only.
  //   register_memory: [base, base + bytes) of the GPU's memory; its key (lkey and rkey).
  //   create_qp: a queue pair's send queue, records, doorbell word and CQ carved from
  //     the arena (CQEs as not written, records 0); throws std::length_error naming the
  //     bytes needed when the arena is full.
  //   connect: QP `qpn` to QP `peer_qpn` of this NIC (loopback: "two domains" on one GPU).
  uint32_t register_memory(void* base, std::size_t bytes);
  sim::NicQueues create_qp(uint32_t log2_sq_wqebbs, uint32_t log2_ncqe);
  void connect(uint32_t qpn, uint32_t peer_qpn);

  // The thread: steps the model until stop(). Idle, it spins a while, then yields.
  void start();
  void stop();

  // The model's refusals (a doorbell rung before its WQE was written, a send queue
  // overrun, ...), each naming the QP, in order; and the model's state for reports.
  std::vector<std::string> faults() const;
  std::string describe() const;

 private:
  class World final : public sim::NicWorld {
   public:
    World(EmulatorMemory& memory, const uint8_t* arena, std::size_t arena_bytes)
        : memory_(memory), arena_(arena), arena_bytes_(arena_bytes) {}
    void read(void* to, const void* from, std::size_t bytes) override;
    void write(void* to, const void* from, std::size_t bytes, sim::AgentOrder order, const char* what,
               std::source_location loc) override;
    void fault(const std::string& report) override;
    std::vector<std::string> faults() const;

   private:
    bool in_arena(const void* ptr, std::size_t bytes) const;
    EmulatorMemory& memory_;
    const uint8_t* arena_;
    std::size_t arena_bytes_;
    mutable std::mutex mutex_;
    std::vector<std::string> faults_;
  };

  void check_stopped(const char* call) const;
  uint8_t* carve(std::size_t bytes, const char* what);

  uint8_t* arena_;
  std::size_t arena_bytes_;
  std::size_t arena_used_ = 0;
  World world_;
  sim::NicModel model_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace railyard::emulator
