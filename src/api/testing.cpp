// include/railyard/testing.hpp: the test-only hooks on a Buffer. Compiled per flavour
// with buffer.cpp (it includes the kernels' protocol header).
#include "railyard/testing.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "intranode_path.hpp"
#include "kernels/intranode/protocol_state.hpp"
#include "railyard/runtime/device_api.hpp"

namespace railyard::testing {

void start_sequence_numbers_at(Buffer& buffer, runtime::Bootstrap& bootstrap, uint64_t operations_done,
                               GpuStream stream) {
  namespace gpu = runtime::gpu;
  gpu::device_synchronize(buffer.device());
  // Also the first barrier: past it, no rank has an operation in flight that could
  // still store into a peer's flags.
  const std::vector<uint64_t> all = runtime::allgather_value(bootstrap, operations_done);
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0])
      throw std::invalid_argument("railyard::testing::start_sequence_numbers_at: operations_done is " +
                                  std::to_string(all[r]) + " on rank " + std::to_string(r) + " and " +
                                  std::to_string(all[0]) + " on rank 0; every rank passes the same");
  const runtime::RegisteredBuffer& registered = buffer.registered_buffer();
  const kernels::intranode::SequenceStateImage image =
      kernels::intranode::sequence_state_after(layout::IntranodeLayout(detail::intranode_shape(buffer.config())),
                                               operations_done);
  gpu::memcpy_async(registered.local_ptr() + image.first_byte, image.bytes.data(), image.bytes.size(), stream);
  gpu::stream_synchronize(stream);  // `image` is read by the copy
  bootstrap.barrier();
}

uint64_t last_operation_done(const Buffer& buffer, GpuStream stream) {
  const layout::IntranodeLayout layout(detail::intranode_shape(buffer.config()));
  uint64_t done = 0;
  runtime::gpu::memcpy_async(&done, layout.local_state(buffer.registered_buffer().local_ptr()), sizeof(done), stream);
  runtime::gpu::stream_synchronize(stream);
  return done;
}

}  // namespace railyard::testing
