// Railyard runtime (internal): the byte form of a shareable-memory handle, the same in
// both backends. Fixed-size so that every rank can allgather its handle.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "railyard/runtime/device_api.hpp"

namespace railyard::runtime::detail {

inline constexpr uint32_t kHandleMagic = 0x31485952;  // "RYH1" little-endian

struct HandleWire {
  uint32_t magic = kHandleMagic;
  uint8_t handle_type = 0;
  uint8_t reserved[3] = {};
  int32_t owner_device = -1;
  uint32_t payload_bytes = 0;
  uint64_t bytes = 0;
  uint64_t mapped_bytes = 0;
  // CUmemFabricHandle and cudaIpcMemHandle_t are 64 bytes; the simulator's is a pointer.
  uint8_t payload[64] = {};
};
static_assert(sizeof(HandleWire) == kHandleBytes);

inline std::vector<std::byte> encode(const HandleWire& wire) {
  std::vector<std::byte> out(sizeof(HandleWire));
  std::memcpy(out.data(), &wire, sizeof(wire));
  return out;
}

// Checks what can be checked without the owner: size, magic, type, payload size.
inline HandleWire decode(std::span<const std::byte> bytes, const char* fn) {
  const std::string where = std::string("railyard ") + fn + ": ";
  if (bytes.size() != sizeof(HandleWire))
    throw DeviceError(where + "handle is " + std::to_string(bytes.size()) + " bytes; expected " +
                      std::to_string(sizeof(HandleWire)) + " (the bytes export_handle returned)");
  HandleWire wire;
  std::memcpy(&wire, bytes.data(), sizeof(wire));
  if (wire.magic != kHandleMagic)
    throw DeviceError(where + "handle bytes do not start with Railyard's handle magic (not from export_handle, or "
                              "from an incompatible build)");
  if (wire.handle_type < static_cast<uint8_t>(ShareableHandleType::InProcess) ||
      wire.handle_type > static_cast<uint8_t>(ShareableHandleType::LegacyIpc))
    throw DeviceError(where + "unknown handle type " + std::to_string(wire.handle_type));
  if (wire.payload_bytes > sizeof(wire.payload) || wire.bytes == 0 || wire.mapped_bytes < wire.bytes)
    throw DeviceError(where + "corrupt handle (payload " + std::to_string(wire.payload_bytes) + " bytes, size " +
                      std::to_string(wire.bytes) + ", mapped " + std::to_string(wire.mapped_bytes) + ")");
  return wire;
}

}  // namespace railyard::runtime::detail
