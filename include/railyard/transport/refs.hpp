// Railyard transport: the host-safe part of the transport contract (contract.cuh):
// where a transfer reads and writes, and how a signal's value sits in memory. Host
// code that fills a lane's description (transport/mlx5/queue_pair.hpp) includes this,
// not the device contract.
#pragma once

#include <cstdint>

#include "railyard/common/byte_order.cuh"
#include "railyard/common/macros.cuh"

namespace railyard::transport {

// Bytes at `offset` in remote rank `peer`'s registered buffer (peer: the transport's
// index of the rank, e.g. its rank in the NVLink domain).
struct RemoteRef {
  int32_t peer = 0;
  uint64_t offset = 0;
};
// Bytes at `offset` in this rank's registered buffer.
struct LocalRef {
  uint64_t offset = 0;
};
// A signal: the 64-bit counter at `offset` in rank `peer`'s registered buffer.
struct SignalRef {
  int32_t peer = 0;
  uint64_t offset = 0;
};

// How a transport leaves a signal in memory: NVLink and NCCL GIN add in native order;
// an mlx5 NIC's 8-byte atomics may add big-endian (the NIC's atomic mode, queried at
// start-up; docs/design-internode.md).
enum class SignalOrder : uint8_t { Native = 0, BigEndian = 1 };

RAILYARD_HOST_DEVICE constexpr uint64_t signal_value(uint64_t raw, SignalOrder order) {
  return order == SignalOrder::Native ? raw : bswap64(raw);
}

}  // namespace railyard::transport
