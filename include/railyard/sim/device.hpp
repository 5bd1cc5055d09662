// Railyard simulator: the hooks that device code reaches through the arch wrappers
// and the CUDA builtins of cuda_compat.hpp. Only those two places call this header;
// kernel code never does.
//
// Every hook takes the source location of the kernel-side call so that hang and
// fault reports name the line. A hook that detects a fault (out of bounds,
// misaligned, misuse, trap) ends the kernel: the fiber does not return.
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>

#include "railyard/sim/sim.hpp"

namespace railyard::sim::device {

using Loc = std::source_location;

// ---- identity of the calling fiber -----------------------------------------------
const Dim3& thread_idx();
const Dim3& block_idx();
const Dim3& block_dim();
const Dim3& grid_dim();
unsigned linear_thread_idx();  // x + y*bx + z*bx*by
int current_device();
uint8_t* dynamic_smem();
std::size_t dynamic_smem_bytes();

// ---- barriers (blocking, never time out) --------------------------------------------
void syncthreads(Loc loc);
// bar.sync / bar.arrive with an explicit id (0..15) and thread count (multiple of 32).
void named_barrier_sync(unsigned id, unsigned num_threads, Loc loc);
void named_barrier_arrive(unsigned id, unsigned num_threads, Loc loc);

// Warp rendezvous: every lane named in `mask` must call with the same mask. Each
// contributes `value`; on return all_values[l] holds lane l's value for lanes in the
// mask (all_values may be null when the caller needs no values). `what` names the
// builtin for reports.
void warp_collective(uint32_t mask, uint64_t value, uint64_t* all_values, const char* what,
                     Loc loc);

// ---- memory ----------------------------------------------------------------------------
enum class Order : uint8_t {
  Plain,     // ordinary access: checked and counted, not a scheduling point
  Volatile,  // ld.volatile / st.volatile: a scheduling point
  Relaxed,   // ld.relaxed.<scope>
  Acquire,   // ld.acquire.<scope>
  Release,   // st.release.<scope>
};
enum class Scope : uint8_t { Block, Gpu, System };

// Checks that [ptr, ptr+bytes) lies inside one simulated allocation the calling
// device may access (its own dynamic shared memory, its own or a peer-mapped device
// allocation, pinned host memory) and that ptr is aligned to `align`. Counts global
// traffic. Faults otherwise.
void check_global_or_shared(const void* ptr, std::size_t bytes, std::size_t align, bool write,
                            const char* op, Loc loc);
void check_shared(const void* ptr, std::size_t bytes, std::size_t align, const char* op, Loc loc);
// Returns the owner of the memory: its device, or -1 for pinned host memory.
int check_global(const void* ptr, std::size_t bytes, std::size_t align, bool write, const char* op, Loc loc);

// Loads/stores of 1, 2, 4, 8 or 16 bytes (value bits in little-endian order in `data`).
// Loads other than Plain are scheduling points; a load that returns the same value
// as this fiber's previous load of the same address is an idle poll, and the fiber
// sleeps until some other fiber makes progress (from its second idle park in a row,
// until one of the bytes it polled is written: docs/simulator.md, "How it works").
void load(const void* ptr, void* data, std::size_t bytes, Order order, Scope scope,
          const char* op, Loc loc);
void store(void* ptr, const void* data, std::size_t bytes, Order order, Scope scope,
           const char* op, Loc loc);

// Read-modify-write of 4 or 8 bytes: *ptr = fn(old, a, b); returns old. A scheduling point.
using RmwFn = uint64_t (*)(uint64_t old, uint64_t a, uint64_t b);
uint64_t atomic_rmw(void* ptr, std::size_t bytes, RmwFn fn, uint64_t a, uint64_t b, Scope scope,
                    const char* op, Loc loc);

// Fences and explicit yields: scheduling points with no other effect (the simulator
// is sequentially consistent).
void fence(const char* op, Loc loc);

// fence.proxy.async.<space>: a scheduling point that also covers the calling thread's
// earlier generic-proxy accesses of that state space, so that later bulk copies of
// the same bytes are ordered after them (docs/simulator.md, "Async-proxy separation").
enum class ProxySpace : uint8_t { SharedCta, Global };
void fence_proxy_async(ProxySpace space, const char* op, Loc loc);

// ---- mbarrier (Hopper transaction barriers in shared memory) ---------------------------
void mbarrier_init(uint64_t* bar, unsigned arrival_count, Loc loc);
void mbarrier_inval(uint64_t* bar, Loc loc);
// Adds `tx_bytes` to the expected transaction count, then (if arrivals > 0) performs
// that many arrivals. Returns the phase state token (the phase parity before arrival).
uint64_t mbarrier_arrive(uint64_t* bar, unsigned arrivals, uint32_t tx_bytes, Loc loc);
// try_wait.parity: returns true once the phase with the given parity has completed.
// Returns false after a bounded suspension (in the simulator: when the virtual clock
// warps), so callers loop. test_wait never suspends.
bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity, Loc loc);
bool mbarrier_test_wait_parity(uint64_t* bar, uint32_t parity, Loc loc);

// ---- bulk asynchronous copies (TMA, 1-D) ---------------------------------------------------
// global -> shared; completes `bytes` transaction bytes on `bar` at a moment the
// scheduler picks. Source and destination 16-byte aligned, bytes a multiple of 16.
void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar, Loc loc);
// shared -> global, tracked in the calling thread's current bulk group. Source is
// read, and the destination written, when the copy completes.
void bulk_copy_s2g(void* gmem_dst, const void* smem_src, uint32_t bytes, Loc loc);
void bulk_commit_group(Loc loc);
// Waits until at most `max_pending` of this thread's committed groups are pending.
// read_only: only their shared-memory reads need be done.
void bulk_wait_group(unsigned max_pending, bool read_only, Loc loc);

// ---- time and faults -------------------------------------------------------------------------
uint64_t clock64();
// sim::wait_profile: the calling thread enters a timeout_while (its clock, in ns; 0
// outside the timed mode), and leaves the one it entered at `entered_ns`, which waited
// on `what` (with the target's `index` and `value`). Neither counts as reading the
// clock (a clock64() that may time a wait).
double wait_entered();
void waited(const char* what, int64_t index, int64_t value, double entered_ns, Loc loc);
void nanosleep(unsigned ns, Loc loc);  // a scheduling point; idle if nothing else changed
[[noreturn]] void trap(const char* message, Loc loc);

}  // namespace railyard::sim::device
