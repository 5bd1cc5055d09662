// Fuzz target for the mlx5 WQE parser (include/railyard/transport/mlx5/wire.cuh), the
// code the simulated NIC runs on whatever bytes device code left in a send queue.
// For any input: parse_wqe reads nothing past it (AddressSanitizer in the libFuzzer
// build), and a WQE it accepts is exactly the bytes its fields encode back to (every
// byte the NIC would act on is accounted for; inline padding excepted). The same
// function runs under libFuzzer (clang, -fsanitize=fuzzer) and under the seeded
// driver mlx5_wqe_fuzz_replay.cpp, which every build runs.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "railyard/transport/mlx5/wire.cuh"

namespace {

namespace mlx5 = railyard::transport::mlx5;

template <class Seg>
void put(std::vector<uint8_t>& out, std::size_t offset, const Seg& seg) {
  std::memcpy(out.data() + offset, &seg, sizeof(seg));
}

// The bytes a parsed WQE stands for, built with the encoders; `input` supplies the
// inline payload, which the parser does not interpret.
std::vector<uint8_t> encode(const mlx5::ParsedWqe& w, const uint8_t* input) {
  std::vector<uint8_t> out(w.ctrl.ds * mlx5::kSegmentBytes, 0);
  put(out, 0, mlx5::encode_ctrl(w.ctrl));
  if (w.ctrl.opcode == mlx5::Opcode::Nop) return out;
  put(out, mlx5::kSegmentBytes, mlx5::encode_raddr(w.remote));
  if (w.ctrl.opcode == mlx5::Opcode::AtomicFa || w.ctrl.opcode == mlx5::Opcode::AtomicCs) {
    put(out, 2 * mlx5::kSegmentBytes, mlx5::encode_atomic(w.atomic));
    put(out, 3 * mlx5::kSegmentBytes, mlx5::encode_data(w.local));
  } else if (w.is_inline) {
    put(out, 2 * mlx5::kSegmentBytes, mlx5::encode_inline_header(w.inline_bytes));
    std::memcpy(out.data() + w.inline_offset, input + w.inline_offset, w.inline_bytes);
  } else {
    put(out, 2 * mlx5::kSegmentBytes, mlx5::encode_data(w.local));
  }
  return out;
}

[[noreturn]] void fail(const char* what, const uint8_t* data, std::size_t size) {
  std::fprintf(stderr, "mlx5 WQE fuzz: %s; input (%zu bytes):", what, size);
  for (std::size_t i = 0; i < size && i < 256; ++i) std::fprintf(stderr, " %02x", data[i]);
  std::fprintf(stderr, "\n");
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  // The parser sees exactly `size` bytes in a buffer of its own, so a read past them
  // is a heap overflow to the sanitizer.
  std::vector<uint8_t> wqe(data, data + size);
  const mlx5::WqeParse parse = mlx5::parse_wqe(wqe.data(), static_cast<uint32_t>(wqe.size()));
  if (parse.error != mlx5::WqeError::None) return 0;
  const std::vector<uint8_t> bytes = encode(parse.wqe, wqe.data());
  if (bytes.size() > size) fail("accepted a WQE longer than its input", data, size);
  const std::size_t padding_from = parse.wqe.is_inline ? parse.wqe.inline_offset + parse.wqe.inline_bytes : bytes.size();
  if (std::memcmp(bytes.data(), data, padding_from) != 0) fail("accepted bytes its fields do not encode", data, size);
  return 0;
}
