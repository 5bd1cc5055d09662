// Railyard's PyTorch extension, shared by ops.cpp (the operators) and module.cpp (the
// pybind11 module) of one flavour: the registry of live buffers. Host only.
#pragma once
#include <railyard/railyard.hpp>

#include <cstdint>
#include <memory>

namespace railyard::python {

// One Buffer as the ops see it: the bootstrap it was created over (it must outlive the
// buffer) and the device it lives on.
struct BufferEntry {
  int64_t id = 0;
  int device = 0;
  // Check routing values (expert ids, experts per token) on the host before a launch.
  // Free for CPU tensors (the simulator); for CUDA tensors it costs a synchronisation,
  // so there it is opt-in (the kernels still trap on a bad id, naming it).
  bool check_routing = true;
  std::unique_ptr<runtime::Bootstrap> bootstrap;
  std::unique_ptr<Buffer> buffer;
};

// Gives the entry an id and makes it visible to the ops.
int64_t add_buffer(std::shared_ptr<BufferEntry> entry);
// The live entry with this id; ValueError naming `op` when there is none.
std::shared_ptr<BufferEntry> get_buffer(int64_t id, const char* op);
// Removes it from the registry (the caller destroys the buffer).
std::shared_ptr<BufferEntry> remove_buffer(int64_t id);

// The start of the message of a kernel failure's RuntimeError, by which
// python/railyard raises its class ("railyard.TimeoutError: ", "railyard.AbortedError: "),
// or null for a code that is no kernel failure.
const char* kernel_failure_prefix(StatusCode code);

// Where the Buffer's handles and outputs come from, process-wide (it outlives every
// tensor made from them): the simulator flavour registers plain host memory with the
// simulator, so the outputs stay valid CPU tensors across sim::reset; the CUDA flavour
// uses PyTorch's caching allocator.
runtime::Allocator& output_allocator();

// The stream an op of this buffer runs on: the simulated device's default stream, or
// PyTorch's current CUDA stream.
GpuStream op_stream(const BufferEntry& entry);

// Makes `device` current for the calling thread (the simulator's per-thread device, or
// CUDA's).
void make_current(int device);

}  // namespace railyard::python
