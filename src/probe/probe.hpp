// railyard-rdma-probe: brings the RDMA path up on one GPU and its NIC, step by step,
// with a log that says which step failed (docs/rdma-bringup.md).
//
// It prints what the path depends on (the GPUs' and NICs' PCIe distances, the GPU's
// GPUDirect RDMA and dma-buf support, the NIC's port and limits), then runs named,
// self-checking stages and stops at the first failure, naming the stage, the call and
// the error:
//   1. register    the registered buffer, made as a Buffer makes it, registered with the NIC
//   2. queues      two RC queue pairs with their queues in GPU memory, the doorbell mapped
//   3. loopback    the two connected to each other on the one port (or, across two
//      (exchange)  nodes, to the peer's); a kernel posts WRITEs and fetch-and-adds,
//                  polls their completions and waits for the signal; the host checks
//                  the bytes and the signal's byte order
//   4. bandwidth   WRITEs over a queue pair per block, by message size and block count
//   5. bad key     a WRITE with a wrong rkey must end in the remote access error (0x13)
// The bad key stage is last: the lane's error ends the kernel with a trap, which on a
// GPU ends the process's CUDA context.
//
// One source, two flavours: railyard-rdma-probe (CUDA and rdma-core: a ConnectX NIC)
// and railyard-rdma-probe-sim, every stage on a simulated GPU and its simulated NIC
// (its bandwidth SIMULATED), which is how the stages are tested.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "railyard/common/macros.cuh"  // RAILYARD_IS_SIM
#include "railyard/runtime/rdma.hpp"
#if RAILYARD_IS_SIM
#include "railyard/sim/nic.hpp"
#endif

namespace railyard::probe {

// Exit codes: each failure has its own, so that scripts can tell them apart.
inline constexpr int kOk = 0;
inline constexpr int kUsage = 1;       // a bad argument
inline constexpr int kNoNic = 2;       // no RDMA NIC on this machine
inline constexpr int kNoGpu = 3;       // no usable GPU
inline constexpr int kSetupFailed = 4;  // the chosen NIC or GPU could not be opened or described
inline constexpr int kStageFailed = 10;  // + the stage's number (1..5)

struct Options {
  // 1: the stages on one NIC, its queue pairs connected to each other (loopback); 2:
  // between two nodes, a GPU and its NIC each, through `peer_host:peer_port` (rank 0
  // listens there, rank 1 connects: runtime::TcpBootstrap). The simulator's probe runs
  // both nodes in its one process.
  int nodes = 1;
  int rank = 0;
  std::string peer_host;
  int peer_port = 0;
  int gpu = 0;
  // CUDA flavour: the NIC (empty: the one nearest the GPU on PCIe, or RAILYARD_NICS)
  // and where sysfs is. The simulator's GPU r has its NIC.
  std::string nic;
  std::string sysfs_root = "/sys";
  runtime::rdma::OpenOptions open{};
  // Bandwidth: message sizes, block counts (a queue pair each) and the bytes each
  // block writes per measurement.
  std::vector<uint32_t> sizes;
  std::vector<int> blocks;
  uint64_t bytes_per_block = 0;
  uint64_t timeout_cycles = uint64_t{1} << 32;  // every wait in the probe's kernels
#if RAILYARD_IS_SIM
  sim::NicConfig sim_nic{};  // the simulated NICs (fault injection)
  int sim_nic_rank = -1;     // >= 0: only that rank's NIC takes sim_nic
#endif
};

// The defaults of the flavour (smaller sweeps in the simulator), the atomic order
// from RAILYARD_NIC_ATOMIC_ORDER as a Buffer takes it (std::invalid_argument when
// that is not a valid value).
Options default_options();

// Runs the probe, writing its log to `out`; returns one of the exit codes above.
int run(const Options& options, std::FILE* out);

// Parses the command line into *options (defaults first); false with *error set on a
// bad argument, naming it and what it expects. "--help" sets *help.
bool parse_arguments(int argc, const char* const* argv, Options* options, bool* help, std::string* error);
const char* usage();

}  // namespace railyard::probe
