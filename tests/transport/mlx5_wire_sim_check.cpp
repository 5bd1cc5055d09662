// The mlx5 wire format compiled in the simulator flavour (RAILYARD_SIM=1, the CUDA
// keywords defined by the simulator), where the simulated NIC and the sim-flavour
// kernels include it. Compiled, never linked: mlx5_wire_test.cpp holds the golden tests
// (plain host flavour); here the encoders are evaluated at compile time.
#include "railyard/transport/mlx5/wire.cuh"

#if !RAILYARD_IS_SIM
#error "mlx5_wire_sim_check.cpp is the simulator-flavour compile check"
#endif

namespace railyard::transport::mlx5 {
namespace {

// The RDMA WRITE of docs/design-internode.md: bytes 00 12 34 08 | 0a bc de 03 | 00 00 00 08 | 0.
constexpr CtrlSeg kExample = encode_ctrl(
    {.wqe_idx = 0x1234, .opcode = Opcode::RdmaWrite, .qpn = 0xabcde, .ds = kWriteDs, .fm_ce_se = kCtrlCqUpdate});
static_assert(from_be32(kExample.opmod_idx_opcode) == 0x00123408u && from_be32(kExample.qpn_ds) == 0x0abcde03u &&
              kExample.fm_ce_se == 0x08 && kExample.imm == 0);
static_assert(decode_ctrl(kExample).qpn == 0xabcde);
static_assert(decode_cqe(encode_cqe({.opcode = CqeOpcode::ReqErr, .owner = true, .wqe_counter = 7, .qpn = 5,
                                     .syndrome = Syndrome::RemoteAccess}))
                  .syndrome == Syndrome::RemoteAccess);

}  // namespace

// Instantiates the parser, which is not constexpr (it reads bytes with memcpy).
__device__ WqeError parse_in_sim(const uint8_t* wqe) { return parse_wqe(wqe, kWqeBasicBlockBytes).error; }

}  // namespace railyard::transport::mlx5
