// The fuzz target's seeded driver (ctest label host, every build): valid WQEs of every
// shape built with the encoders, each then mutated (bit flips, byte overwrites,
// truncation, extension), and random bytes, through LLVMFuzzerTestOneInput. Every
// unmutated WQE must be accepted, so a parser that refused everything fails too.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "railyard/transport/mlx5/wire.cuh"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size);

namespace {

namespace mlx5 = railyard::transport::mlx5;

template <class Seg>
void append(std::vector<uint8_t>& out, const Seg& seg) {
  const auto* p = reinterpret_cast<const uint8_t*>(&seg);
  out.insert(out.end(), p, p + sizeof(seg));
}

// One valid WQE of a random shape.
std::vector<uint8_t> valid_wqe(std::mt19937_64& rng) {
  mlx5::CtrlFields ctrl;
  ctrl.wqe_idx = static_cast<uint16_t>(rng());
  ctrl.qpn = static_cast<uint32_t>(rng()) & mlx5::kMaxQpn;
  ctrl.fm_ce_se = (rng() & 1) ? mlx5::kCtrlCqUpdate : 0;
  const mlx5::RaddrFields raddr{rng(), static_cast<uint32_t>(rng())};
  std::vector<uint8_t> out;
  switch (rng() % 4) {
    case 0:
      ctrl.opcode = mlx5::Opcode::Nop;
      ctrl.ds = mlx5::kNopDs;
      append(out, mlx5::encode_ctrl(ctrl));
      break;
    case 1: {
      ctrl.opcode = (rng() & 1) ? mlx5::Opcode::RdmaWrite : mlx5::Opcode::RdmaWriteImm;
      ctrl.ds = mlx5::kWriteDs;
      append(out, mlx5::encode_ctrl(ctrl));
      append(out, mlx5::encode_raddr(raddr));
      append(out, mlx5::encode_data({static_cast<uint32_t>(rng()) & mlx5::kMaxByteCount, static_cast<uint32_t>(rng()), rng()}));
      break;
    }
    case 2: {
      const uint32_t n = static_cast<uint32_t>(rng() % 64);
      ctrl.opcode = mlx5::Opcode::RdmaWrite;
      ctrl.ds = mlx5::write_inline_ds(n);
      append(out, mlx5::encode_ctrl(ctrl));
      append(out, mlx5::encode_raddr(raddr));
      append(out, mlx5::encode_inline_header(n));
      out.resize(ctrl.ds * mlx5::kSegmentBytes);
      for (uint32_t i = 0; i < n; ++i) out[mlx5::kWriteInlinePayloadOffset + i] = static_cast<uint8_t>(rng());
      break;
    }
    default: {
      ctrl.opcode = (rng() & 1) ? mlx5::Opcode::AtomicFa : mlx5::Opcode::AtomicCs;
      ctrl.ds = mlx5::kAtomicDs;
      append(out, mlx5::encode_ctrl(ctrl));
      append(out, mlx5::encode_raddr(raddr));
      append(out, mlx5::encode_atomic({rng(), rng()}));
      append(out, mlx5::encode_data({8, static_cast<uint32_t>(rng()), rng()}));
    }
  }
  return out;
}

void mutate(std::vector<uint8_t>& w, std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0:
      if (!w.empty()) w[rng() % w.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      break;
    case 1:
      if (!w.empty()) w[rng() % w.size()] = static_cast<uint8_t>(rng());
      break;
    case 2:
      w.resize(rng() % (w.size() + 1));
      break;
    default:
      w.resize(w.size() + rng() % 32, static_cast<uint8_t>(rng()));
  }
}

}  // namespace

int main() {
  std::mt19937_64 rng(20261126);
  long accepted = 0, inputs = 0;
  for (int i = 0; i < 200000; ++i, ++inputs) {
    std::vector<uint8_t> w = valid_wqe(rng);
    const bool pristine = i % 4 == 0 && i % 16 != 0;
    if (i % 16 == 0) {
      w.resize(rng() % 200);
      for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
    } else if (!pristine) {
      mutate(w, rng);
    }
    const bool ok = mlx5::parse_wqe(w.data(), static_cast<uint32_t>(w.size())).error == mlx5::WqeError::None;
    if (pristine && !ok) {
      std::fprintf(stderr, "mlx5 WQE fuzz replay: input %d, a valid WQE, was refused\n", i);
      return 1;
    }
    accepted += ok;
    LLVMFuzzerTestOneInput(w.data(), w.size());
  }
  std::printf("mlx5 WQE fuzz replay: %ld inputs, %ld accepted, every accepted WQE re-encodes to its bytes\n", inputs,
              accepted);
  return 0;
}
