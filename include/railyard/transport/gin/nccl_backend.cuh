// Railyard transport, NCCL GIN backend: NcclGin, the GIN lane's backend (gin/lane.cuh)
// over NCCL's device API (nccl_device.h, NCCL 2.28 and later): one GIN context of a
// device communicator, and the registered buffer as one window at the same offsets on
// every rank. CUDA flavour only; NCCL picks the network backend at run time (GDAKI on
// ConnectX, its CPU proxy, or a plugin's, such as EFA's).
//
// Every operation is warp-collective (ncclCoopWarp) and names peers by their rank in
// the communicator (ncclTeamWorld). Signals are read through ncclGin::readSignal inside
// Railyard's own bounded wait (gin::wait_signal), never NCCL's unbounded waitSignal.
// flush is NCCL's: it returns once the warp's earlier puts have read their sources.
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <cstdint>

#include "railyard/common/macros.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/gin/lane.cuh"

namespace railyard::transport::gin {

struct NcclGin {
  ncclDevComm comm;          // ncclDevCommCreate's, by value (a kernel parameter)
  ncclWindow_t window{};     // ncclCommWindowRegister of the registered buffer
  int context = 0;           // the GIN context (one queue pair per peer): one warp's
  SignalSpace signals{};     // ids [0, count) of the device communicator's signals

  RAILYARD_DEVICE void put(int32_t peer, uint64_t dst, uint64_t src, uint32_t bytes,
                           const pipeline::WaitPolicy&) const {
    ncclGin gin(comm, context);
    gin.put(ncclTeamWorld(comm), peer, window, dst, window, src, bytes, ncclGin_None{}, ncclGin_None{},
            ncclCoopWarp{});
  }
  RAILYARD_DEVICE void put_signal(int32_t peer, uint64_t dst, uint64_t src, uint32_t bytes, uint32_t id, uint64_t add,
                                  const pipeline::WaitPolicy&) const {
    ncclGin gin(comm, context);
    gin.put(ncclTeamWorld(comm), peer, window, dst, window, src, bytes, ncclGin_SignalAdd{id, add}, ncclGin_None{},
            ncclCoopWarp{});
  }
  RAILYARD_DEVICE void signal(int32_t peer, uint32_t id, uint64_t add, const pipeline::WaitPolicy&) const {
    ncclGin gin(comm, context);
    gin.signal(ncclTeamWorld(comm), peer, ncclGin_SignalAdd{id, add}, ncclCoopWarp{});
  }
  RAILYARD_DEVICE void flush(const pipeline::WaitPolicy&) const {
    ncclGin gin(comm, context);
    gin.flush(ncclCoopWarp{});
  }
  RAILYARD_DEVICE uint64_t read_signal(uint32_t id) const {
    ncclGin gin(comm, context);
    return gin.readSignal(id);
  }
  RAILYARD_HOST_DEVICE SignalSpace signal_space() const { return signals; }
};
static_assert(Backend<NcclGin>);

}  // namespace railyard::transport::gin
