// The mlx5 firmware commands (src/runtime/mlx5_prm.hpp) against the Linux kernel's
// include/linux/mlx5/mlx5_ifc.h, the independent reference (read in C by
// mlx5_ifc_golden.c): every field Railyard sets or reads at the kernel's offset and
// width; the fields only DEVX uses inside bits the kernel leaves reserved; sizes and
// constants by value. Then each command, built from random parameters, read back
// through the kernel's offsets the way the kernel's MLX5_GET reads (big-endian 32-bit
// words), with no bit set outside the fields it means to set.
#include "src/runtime/mlx5_prm.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "mlx5_ifc_golden.h"

namespace railyard::runtime::rdma::prm {
namespace {

struct Golden {
  std::size_t bit = 0, width = 0;
};

const std::map<std::string, Golden>& golden() {
  static const std::map<std::string, Golden> table = [] {
    std::map<std::string, Golden> t;
    for (std::size_t i = 0; i < railyard_ifc_field_count; ++i)
      t[railyard_ifc_fields[i].path] = {railyard_ifc_fields[i].bit, railyard_ifc_fields[i].width};
    return t;
  }();
  return table;
}
Golden golden_field(const std::string& path) {
  const auto it = golden().find(path);
  if (it == golden().end()) throw std::runtime_error("mlx5_ifc_golden.c does not list " + path);
  return it->second;
}
uint32_t golden_constant(const std::string& name) {
  for (std::size_t i = 0; i < railyard_ifc_constant_count; ++i)
    if (name == railyard_ifc_constants[i].name) return railyard_ifc_constants[i].value;
  throw std::runtime_error("mlx5_ifc_golden.c does not list " + name);
}

// The kernel's fields that Railyard's DEVX-only fields occupy: the kernel never fills
// umem ids, so its layout leaves those bits reserved.
const std::map<std::string, std::string> kDevxOnly = {
    {"create_cq_in.cq_context.dbr_umem_id", "create_cq_in.cq_context.reserved_at_20"},
    {"create_cq_in.cq_umem_offset", "create_cq_in.reserved_at_280"},
    {"create_cq_in.cq_umem_id", "create_cq_in.reserved_at_280"},
    {"create_qp_in.qpc.dbr_umem_id", "create_qp_in.qpc.reserved_at_684"},
};

TEST(Mlx5Prm, EveryFieldIsWhereTheKernelHasIt) {
  std::set<std::string> compared;
  for (const NamedField& f : fields_in_use()) {
    const std::string path(f.path);
    SCOPED_TRACE(path);
    const auto devx = kDevxOnly.find(path);
    if (devx != kDevxOnly.end()) {
      const Golden reserved = golden_field(devx->second);
      EXPECT_GE(f.field.bit, reserved.bit);
      EXPECT_LE(f.field.bit + f.field.width, reserved.bit + reserved.width);
      compared.insert(devx->second);
      continue;
    }
    const Golden g = golden_field(path);
    EXPECT_EQ(f.field.bit, g.bit) << "bit offset";
    EXPECT_EQ(f.field.width, g.width) << "width";
    compared.insert(path);
  }
  // And the golden list holds nothing Railyard stopped using (sizes aside).
  for (const auto& [path, g] : golden()) {
    if (path.find('.') == std::string::npos) continue;
    EXPECT_TRUE(compared.count(path)) << path << " is compared with nothing";
  }
}

TEST(Mlx5Prm, MailboxSizesAndConstantsAreTheKernels) {
  for (const char* in : {"create_cq_in", "create_qp_in", "rst2init_qp_in", "init2rtr_qp_in", "rtr2rts_qp_in"})
    EXPECT_EQ(kCommandInBytes * 8, golden_field(in).width) << in;
  for (const char* out : {"create_cq_out", "create_qp_out", "rst2init_qp_out", "init2rtr_qp_out", "rtr2rts_qp_out"})
    EXPECT_EQ(kCommandOutBytes * 8, golden_field(out).width) << out;
  EXPECT_EQ(kOpCreateCq, golden_constant("MLX5_CMD_OP_CREATE_CQ"));
  EXPECT_EQ(kOpCreateQp, golden_constant("MLX5_CMD_OP_CREATE_QP"));
  EXPECT_EQ(kOpRst2InitQp, golden_constant("MLX5_CMD_OP_RST2INIT_QP"));
  EXPECT_EQ(kOpInit2RtrQp, golden_constant("MLX5_CMD_OP_INIT2RTR_QP"));
  EXPECT_EQ(kOpRtr2RtsQp, golden_constant("MLX5_CMD_OP_RTR2RTS_QP"));
  EXPECT_EQ(kQpcStRc, golden_constant("MLX5_QPC_ST_RC"));
  EXPECT_EQ(kQpcPmStateMigrated, golden_constant("MLX5_QPC_PM_STATE_MIGRATED"));
  EXPECT_EQ(kQpcAtomicModeIbSpec, golden_constant("MLX5_QPC_ATOMIC_MODE_IB_SPEC"));
  EXPECT_EQ(kCqeSize64, golden_constant("MLX5_CQC_CQE_SZ_64_BYTES"));
  EXPECT_EQ(mtu_code(256), golden_constant("MLX5_QPC_MTU_256_BYTES"));
  EXPECT_EQ(mtu_code(512), golden_constant("MLX5_QPC_MTU_512_BYTES"));
  EXPECT_EQ(mtu_code(1024), golden_constant("MLX5_QPC_MTU_1K_BYTES"));
  EXPECT_EQ(mtu_code(2048), golden_constant("MLX5_QPC_MTU_2K_BYTES"));
  EXPECT_EQ(mtu_code(4096), golden_constant("MLX5_QPC_MTU_4K_BYTES"));
  EXPECT_EQ(mtu_code(8192), golden_constant("MLX5_QPC_MTU_4K_BYTES"));
  EXPECT_EQ(mtu_code(1500), golden_constant("MLX5_QPC_MTU_1K_BYTES"));
}

// The kernel's MLX5_GET: the big-endian 32-bit word holding the field, shifted and
// masked (fields never cross a word, or are whole words); MLX5_GET64 for 64-bit ones.
uint64_t kernel_get(const std::vector<uint8_t>& box, Golden g) {
  auto word = [&](std::size_t dw) {
    uint32_t be;
    std::memcpy(&be, box.data() + 4 * dw, 4);
    return ntohl(be);
  };
  if (g.width == 64) return uint64_t{word(g.bit / 32)} << 32 | word(g.bit / 32 + 1);
  const std::size_t shift = 32 - g.width - (g.bit & 31);
  const uint32_t mask = g.width == 32 ? 0xffffffffu : (1u << g.width) - 1;
  return (word(g.bit / 32) >> shift) & mask;
}

// Reads `expected` (path -> value) back through the kernel's offsets, then checks that
// clearing those fields leaves an all-zero mailbox.
void expect_command(const Mailbox& built, const std::string& command,
                    const std::map<std::string, uint64_t>& expected,
                    const std::map<std::string, std::vector<uint8_t>>& expected_bytes = {}) {
  ASSERT_EQ(built.bytes().size(), kCommandInBytes);
  std::vector<uint8_t> rest = built.bytes();
  auto clear = [&](std::size_t bit, std::size_t width) {
    for (std::size_t b = bit; b < bit + width; ++b) rest[b / 8] = static_cast<uint8_t>(rest[b / 8] & ~(0x80u >> b % 8));
  };
  for (const auto& [field, value] : expected) {
    const std::string path = command + "." + field;
    Golden g;
    if (const auto devx = kDevxOnly.find(path); devx != kDevxOnly.end()) {
      // Where the reserved bits allow only one place: the last word of qpc's, the
      // first word of cqc's, create_cq_in's 64 + 32 bits.
      const Golden reserved = golden_field(devx->second);
      if (field == "qpc.dbr_umem_id") g = {reserved.bit + reserved.width - 32, 32};
      else if (field == "cq_context.dbr_umem_id") g = {reserved.bit, 32};
      else if (field == "cq_umem_offset") g = {reserved.bit, 64};
      else g = {reserved.bit + 64, 32};
    } else {
      g = golden_field(path);
    }
    EXPECT_EQ(kernel_get(built.bytes(), g), value) << path;
    clear(g.bit, g.width);
  }
  for (const auto& [field, bytes] : expected_bytes) {
    const Golden g = golden_field(command + "." + field);
    ASSERT_EQ(g.width, 8 * bytes.size());
    EXPECT_EQ(0, std::memcmp(built.bytes().data() + g.bit / 8, bytes.data(), bytes.size())) << field;
    clear(g.bit, g.width);
  }
  for (std::size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], 0) << command << ": stray bits in byte " << i;
}

TEST(Mlx5Prm, CommandsCarryTheirParametersAndNothingElse) {
  std::mt19937_64 rng(2026);
  auto bits = [&](int n) { return rng() & ((uint64_t{1} << n) - 1); };
  for (int round = 0; round < 50; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const QueueLayout layout = queue_layout(static_cast<uint32_t>(1 + bits(3)), static_cast<uint32_t>(4 + bits(3)),
                                            std::size_t{4096} << bits(3));
    const CqParams cq{.log_ncqe = static_cast<uint32_t>(1 + bits(4)),
                      .uar_page = static_cast<uint32_t>(bits(24)),
                      .eqn = static_cast<uint32_t>(bits(32)),
                      .umem_id = static_cast<uint32_t>(bits(32)),
                      .layout = layout};
    expect_command(create_cq(cq), "create_cq_in",
                   {{"opcode", 0x400},
                    {"cq_context.cqe_sz", 0},
                    {"cq_context.log_cq_size", cq.log_ncqe},
                    {"cq_context.uar_page", cq.uar_page},
                    {"cq_context.c_eqn_or_apu_element", cq.eqn},
                    {"cq_context.log_page_size", layout.log_page_size},
                    {"cq_context.dbr_umem_valid", 1},
                    {"cq_context.dbr_umem_id", cq.umem_id},
                    {"cq_context.dbr_addr", layout.cq_dbr_offset},
                    {"cq_umem_valid", 1},
                    {"cq_umem_id", cq.umem_id},
                    {"cq_umem_offset", layout.cq_offset}});

    const QpParams qp{.pd = static_cast<uint32_t>(bits(24)),
                      .uar_page = static_cast<uint32_t>(bits(24)),
                      .log_sq_wqebbs = static_cast<uint32_t>(1 + bits(3)),
                      .cqn = static_cast<uint32_t>(bits(24)),
                      .umem_id = static_cast<uint32_t>(bits(32)),
                      .layout = layout};
    expect_command(create_qp(qp), "create_qp_in",
                   {{"opcode", 0x500},
                    {"qpc.st", 0},
                    {"qpc.pm_state", 3},
                    {"qpc.pd", qp.pd},
                    {"qpc.uar_page", qp.uar_page},
                    {"qpc.log_sq_size", qp.log_sq_wqebbs},
                    {"qpc.log_page_size", layout.log_page_size},
                    {"qpc.rq_type", 3},
                    {"qpc.cqn_snd", qp.cqn},
                    {"qpc.cqn_rcv", qp.cqn},
                    {"qpc.dbr_umem_valid", 1},
                    {"qpc.dbr_umem_id", qp.umem_id},
                    {"qpc.dbr_addr", layout.qp_dbr_offset},
                    {"wq_umem_valid", 1},
                    {"wq_umem_id", qp.umem_id},
                    {"wq_umem_offset", layout.sq_offset}});

    const auto qpn = static_cast<uint32_t>(bits(24));
    const auto port = static_cast<uint32_t>(1 + bits(1));
    expect_command(rst2init(qpn, port), "rst2init_qp_in",
                   {{"opcode", 0x502},
                    {"qpn", qpn},
                    {"qpc.pm_state", 3},
                    {"qpc.rre", 1},
                    {"qpc.rwe", 1},
                    {"qpc.rae", 1},
                    {"qpc.atomic_mode", 1},
                    {"qpc.primary_address_path.vhca_port_num", port},
                    {"qpc.primary_address_path.pkey_index", 0}});

    RtrParams rtr{.qpn = qpn,
                  .mtu = mtu_code(static_cast<uint32_t>(256u << bits(3))),
                  .remote_qpn = static_cast<uint32_t>(bits(24)),
                  .rq_psn = static_cast<uint32_t>(bits(24)),
                  .log_rra_max = static_cast<uint32_t>(bits(3)),
                  .min_rnr_nak = static_cast<uint32_t>(bits(5)),
                  .log_msg_max = 30,
                  .path = {.port = port, .rlid = static_cast<uint16_t>(bits(16)), .sl = static_cast<uint8_t>(bits(4))}};
    std::map<std::string, uint64_t> common = {{"opcode", 0x503},
                                              {"qpn", qpn},
                                              {"qpc.mtu", rtr.mtu},
                                              {"qpc.log_msg_max", 30},
                                              {"qpc.remote_qpn", rtr.remote_qpn},
                                              {"qpc.next_rcv_psn", rtr.rq_psn},
                                              {"qpc.log_rra_max", rtr.log_rra_max},
                                              {"qpc.min_rnr_nak", rtr.min_rnr_nak},
                                              {"qpc.primary_address_path.vhca_port_num", port}};
    auto infiniband = common;
    infiniband["qpc.primary_address_path.rlid"] = rtr.path.rlid;
    infiniband["qpc.primary_address_path.sl"] = rtr.path.sl;
    expect_command(init2rtr(rtr), "init2rtr_qp_in", infiniband);

    rtr.path = {.port = port,
                .global = true,
                .sl = static_cast<uint8_t>(bits(3)),
                .src_addr_index = static_cast<uint8_t>(bits(8)),
                .hop_limit = static_cast<uint8_t>(bits(8)),
                .tclass = static_cast<uint8_t>(bits(8)),
                .udp_sport = static_cast<uint16_t>(bits(16))};
    for (auto& b : rtr.path.rgid) b = static_cast<uint8_t>(bits(8));
    for (auto& b : rtr.path.rmac) b = static_cast<uint8_t>(bits(8));
    auto roce = common;
    roce["qpc.primary_address_path.grh"] = 1;
    roce["qpc.primary_address_path.src_addr_index"] = rtr.path.src_addr_index;
    roce["qpc.primary_address_path.hop_limit"] = rtr.path.hop_limit;
    roce["qpc.primary_address_path.tclass"] = rtr.path.tclass;
    roce["qpc.primary_address_path.udp_sport"] = rtr.path.udp_sport;
    roce["qpc.primary_address_path.eth_prio"] = rtr.path.sl;
    const auto& mac = rtr.path.rmac;
    roce["qpc.primary_address_path.rmac_47_32"] = uint64_t{mac[0]} << 8 | mac[1];
    roce["qpc.primary_address_path.rmac_31_0"] =
        uint64_t{mac[2]} << 24 | uint64_t{mac[3]} << 16 | uint64_t{mac[4]} << 8 | mac[5];
    expect_command(init2rtr(rtr), "init2rtr_qp_in", roce,
                   {{"qpc.primary_address_path.rgid_rip", {rtr.path.rgid.begin(), rtr.path.rgid.end()}}});

    const RtsParams rts{.qpn = qpn,
                        .sq_psn = static_cast<uint32_t>(bits(24)),
                        .log_sra_max = static_cast<uint32_t>(bits(3)),
                        .retry_count = static_cast<uint32_t>(bits(3)),
                        .rnr_retry = static_cast<uint32_t>(bits(3)),
                        .ack_timeout = static_cast<uint32_t>(bits(5))};
    expect_command(rtr2rts(rts), "rtr2rts_qp_in",
                   {{"opcode", 0x504},
                    {"qpn", qpn},
                    {"qpc.next_send_psn", rts.sq_psn},
                    {"qpc.log_sra_max", rts.log_sra_max},
                    {"qpc.retry_count", rts.retry_count},
                    {"qpc.rnr_retry", rts.rnr_retry},
                    {"qpc.primary_address_path.ack_timeout", rts.ack_timeout}});
  }
}

TEST(Mlx5Prm, CreatedObjectsAndErrorsAreReadFromTheOutputMailbox) {
  Mailbox out(kCommandOutBytes);
  // A firmware answer, written byte by byte: status 0x05, syndrome 0x1234abcd, qpn 0x00bead.
  const uint8_t answer[16] = {0x05, 0, 0, 0, 0x12, 0x34, 0xab, 0xcd, 0x00, 0x00, 0xbe, 0xad};
  std::memcpy(out.bytes().data(), answer, sizeof answer);
  EXPECT_EQ(out.get(fields::out_status), 0x05u);
  EXPECT_EQ(out.get(fields::out_syndrome), 0x1234abcdu);
  EXPECT_EQ(out.get(fields::out_object), 0xbeadu);
  EXPECT_EQ(kernel_get(out.bytes(), golden_field("create_qp_out.qpn")), 0xbeadu);
}

TEST(Mlx5Prm, QueuesStartOnPagesAndDoNotOverlap) {
  for (std::size_t page : {std::size_t{4096}, std::size_t{65536}}) {
    for (uint32_t log_sq = 1; log_sq <= 15; log_sq += 7) {
      for (uint32_t log_cq = log_sq; log_cq <= 16; log_cq += 5) {
        const QueueLayout l = queue_layout(log_sq, log_cq, page);
        SCOPED_TRACE(std::to_string(page) + " " + std::to_string(log_sq) + " " + std::to_string(log_cq));
        EXPECT_EQ(l.sq_bytes, std::size_t{64} << log_sq);
        EXPECT_EQ(l.cq_bytes, std::size_t{64} << log_cq);
        EXPECT_EQ(l.sq_offset % page, 0u);
        EXPECT_EQ(l.cq_offset % page, 0u);
        EXPECT_EQ(l.qp_dbr_offset % page, 0u);
        EXPECT_GE(l.cq_offset, l.sq_offset + l.sq_bytes);
        EXPECT_GE(l.qp_dbr_offset, l.cq_offset + l.cq_bytes);
        EXPECT_EQ(l.cq_dbr_offset, l.qp_dbr_offset + 64);  // its own cache line
        EXPECT_EQ(l.total_bytes, l.qp_dbr_offset + page);
        EXPECT_EQ(std::size_t{4096} << l.log_page_size, page);
      }
    }
  }
}

TEST(Mlx5Prm, ValuesWiderThanTheirFieldAreRefused) {
  try {
    (void)rst2init(1u << 24, 1);
    FAIL() << "a 25-bit QP number was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit the field at bit 0x48 (24 bits)"), std::string::npos) << e.what();
  }
  RtrParams rtr;
  rtr.path.global = true;
  rtr.path.sl = 8;  // Ethernet priority is 3 bits
  EXPECT_THROW((void)init2rtr(rtr), std::invalid_argument);
  EXPECT_THROW((void)queue_layout(4, 4, 3000), std::invalid_argument);
  EXPECT_THROW((void)queue_layout(4, 4, 2048), std::invalid_argument);
  Mailbox small(4);
  EXPECT_THROW(small.set(fields::out_syndrome, 1), std::invalid_argument);  // past its end
}

}  // namespace
}  // namespace railyard::runtime::rdma::prm
