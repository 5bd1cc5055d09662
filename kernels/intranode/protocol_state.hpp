// Railyard intra-node kernels: the host's image of the protocol's sequence state
// (protocol.cuh), for tests that start a buffer as if it had already run many
// operations: railyard::testing::start_sequence_numbers_at (include/railyard/testing.hpp)
// on a Buffer, and the kernel tests on their simulated registered buffers.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/intranode/domain.hpp"
#include "railyard/layout/intranode_layout.cuh"

namespace railyard::kernels::intranode {

// Bytes [first_byte, first_byte + bytes.size()) of one rank's registered buffer.
struct SequenceStateImage {
  int64_t first_byte = 0;
  std::vector<uint8_t> bytes;
};

// The sequence state of an idle registered buffer after `operations_done` operations,
// the same on every rank: the count flags, the barrier flags, the operation
// descriptors and the last operation done (local_state's first 8 bytes), one
// contiguous range. Every flag holds what the last operation stored in it (the low 32
// bits of its sequence number); the descriptors are zero (a descriptor is read only
// once its rank's flag is at the current operation, which rewrote it). blocks_finished and the abort
// record, past the range, stay as an idle buffer has them; so do the row headers,
// which hold the sequence number of the operation that wrote them and are read only
// against the current one.
inline SequenceStateImage sequence_state_after(const layout::IntranodeLayout& layout, uint64_t operations_done) {
  const int64_t first = layout.count_flags_offset();
  SequenceStateImage image{first,
                           std::vector<uint8_t>(static_cast<std::size_t>(layout.local_state_offset()) + sizeof(uint64_t) -
                                                static_cast<std::size_t>(first))};
  // Offsets from the layout, as the kernels address the buffer; each flag array is a
  // uint32_t per rank (IntranodeLayout::count_flag, barrier_flag).
  const auto at = [&](int64_t offset) { return image.bytes.data() + (offset - first); };
  const uint32_t count_flag = flag_of(operations_done);
  const uint32_t barrier_flag = flag_of(operations_done);
  for (int peer = 0; peer < layout.shape().ranks_per_domain; ++peer) {
    std::memcpy(at(layout.count_flags_offset()) + sizeof(uint32_t) * peer, &count_flag, sizeof count_flag);
    std::memcpy(at(layout.barrier_flags_offset()) + sizeof(uint32_t) * peer, &barrier_flag, sizeof barrier_flag);
  }
  std::memcpy(at(layout.local_state_offset()), &operations_done, sizeof operations_done);
  return image;
}

}  // namespace railyard::kernels::intranode
