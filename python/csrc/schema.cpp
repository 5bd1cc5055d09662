// Railyard's PyTorch operator schemas, defined once (TORCH_LIBRARY allows one
// definition per namespace). The implementations come from the flavours of ops.cpp:
// CPU (the simulator, _C_sim) and CUDA (_C_cuda); the fake (meta) ones from
// python/railyard/_fake.py. docs/python-api.md describes the arguments.
#include <torch/library.h>

// Python needs a module to import; the schemas are registered when it loads.
#include <pybind11/pybind11.h>

TORCH_LIBRARY(railyard, m) {
  // `buffer` is a Buffer's id (module.cpp: create_buffer); `handle` a dispatch's handle
  // token. layout: 0 received, 1 expert-grouped. Outputs that a layout or dtype does
  // not produce are empty ([0]). totals: int64 [4 + 2 E_local] on the device:
  // received rows, permuted rows, received overflow, permuted overflow, then the
  // padded and unpadded tokens per local expert.
  m.def(
      "dispatch(int buffer, Tensor hidden, Tensor? scales, Tensor? topk_idx, Tensor? topk_weights, "
      "Tensor? routing_map, Tensor? probs, Tensor? handle, int layout, int pad_multiple, int? max_rows, "
      "int num_sms) -> (Tensor hidden, Tensor scales, Tensor probs, Tensor routing_map, Tensor src_rank, "
      "Tensor src_token, Tensor recv_row, Tensor totals, Tensor handle)");
  // out: bf16 [num_tokens, hidden]; out_probs: fp32 [num_tokens, E] with probs, else [0].
  m.def(
      "combine(int buffer, Tensor handle, Tensor hidden, Tensor? probs, int num_tokens, int num_sms) "
      "-> (Tensor out, Tensor out_probs)");
}

PYBIND11_MODULE(_schema, m) { m.doc() = "Railyard's operator schemas (torch.ops.railyard)"; }
