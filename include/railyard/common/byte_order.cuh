// Railyard common: byte swaps, for the big-endian words a NIC reads and writes (the
// mlx5 wire format, signals a NIC adds big-endian). Plain shifts rather than builtins:
// constexpr everywhere, and nvcc folds each into one prmt.
#pragma once

#include <cstdint>

#include "railyard/common/macros.cuh"

namespace railyard {

RAILYARD_HOST_DEVICE constexpr uint16_t bswap16(uint16_t v) { return static_cast<uint16_t>((v >> 8) | (v << 8)); }

RAILYARD_HOST_DEVICE constexpr uint32_t bswap32(uint32_t v) {
  return (v >> 24) | ((v >> 8) & 0x0000ff00u) | ((v << 8) & 0x00ff0000u) | (v << 24);
}

RAILYARD_HOST_DEVICE constexpr uint64_t bswap64(uint64_t v) {
  return (static_cast<uint64_t>(bswap32(static_cast<uint32_t>(v))) << 32) | bswap32(static_cast<uint32_t>(v >> 32));
}

}  // namespace railyard
