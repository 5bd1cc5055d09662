// The mlx5 wire format (include/railyard/transport/mlx5/wire.cuh) against rdma-core's
// public header infiniband/mlx5dv.h, the independent reference: layouts by sizeof and
// offsetof, constants by value, and every encoding byte for byte with rdma-core's own
// setters (mlx5dv_set_ctrl_seg, mlx5dv_set_data_seg) or with its structs filled field
// by field with htobe*, as its post path (providers/mlx5/qp.c) fills them. Then the CQE
// ownership rule over a wrapping ring, and the WQE parser: round trips and every error.
#include "railyard/transport/mlx5/wire.cuh"

#include <endian.h>
#include <gtest/gtest.h>
#include <infiniband/mlx5dv.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace railyard::transport::mlx5 {
namespace {

std::string hex(const void* data, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    char byte[4];
    std::snprintf(byte, sizeof(byte), "%02x ", static_cast<const uint8_t*>(data)[i]);
    out += byte;
  }
  return out;
}

// Byte-for-byte equality of a Railyard encoding and rdma-core's, with both dumped on a
// mismatch.
template <class Ours, class Theirs>
::testing::AssertionResult same_bytes(const Ours& ours, const Theirs& theirs) {
  static_assert(sizeof(Ours) == sizeof(Theirs));
  if (std::memcmp(&ours, &theirs, sizeof(Ours)) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\n  railyard:  " << hex(&ours, sizeof(Ours))
                                       << "\n  rdma-core: " << hex(&theirs, sizeof(Theirs));
}

// std::mt19937 yields 32 random bits in an unsigned long.
uint32_t random32(std::mt19937& rng) { return static_cast<uint32_t>(rng()); }

uint64_t random64(std::mt19937& rng) {
  const uint64_t high = random32(rng);
  return high << 32 | random32(rng);
}

mlx5_wqe_ctrl_seg rdma_core_ctrl(const CtrlFields& f) {
  mlx5_wqe_ctrl_seg seg;
  // mlx5dv_set_ctrl_seg leaves dci_stream_channel_id alone; a fresh WQE slot is zero.
  std::memset(&seg, 0, sizeof(seg));
  mlx5dv_set_ctrl_seg(&seg, f.wqe_idx, static_cast<uint8_t>(f.opcode), f.opmod, f.qpn, f.fm_ce_se, f.ds, 0, f.imm);
  return seg;
}

CtrlFields random_ctrl(std::mt19937& rng) {
  return CtrlFields{.wqe_idx = static_cast<uint16_t>(random32(rng)),
                    .opcode = static_cast<Opcode>(random32(rng)),
                    .opmod = static_cast<uint8_t>(random32(rng)),
                    .qpn = random32(rng) & kMaxQpn,
                    .ds = static_cast<uint8_t>(random32(rng) % (kMaxDs + 1)),
                    .fm_ce_se = static_cast<uint8_t>(random32(rng)),
                    .imm = random32(rng)};
}

// ---- Layouts ----------------------------------------------------------------------

TEST(Mlx5WireLayout, SegmentsMatchRdmaCore) {
  EXPECT_EQ(sizeof(CtrlSeg), sizeof(mlx5_wqe_ctrl_seg));
  EXPECT_EQ(offsetof(CtrlSeg, opmod_idx_opcode), offsetof(mlx5_wqe_ctrl_seg, opmod_idx_opcode));
  EXPECT_EQ(offsetof(CtrlSeg, qpn_ds), offsetof(mlx5_wqe_ctrl_seg, qpn_ds));
  EXPECT_EQ(offsetof(CtrlSeg, signature), offsetof(mlx5_wqe_ctrl_seg, signature));
  EXPECT_EQ(offsetof(CtrlSeg, stream_channel_id), offsetof(mlx5_wqe_ctrl_seg, dci_stream_channel_id));
  EXPECT_EQ(offsetof(CtrlSeg, fm_ce_se), offsetof(mlx5_wqe_ctrl_seg, fm_ce_se));
  EXPECT_EQ(offsetof(CtrlSeg, imm), offsetof(mlx5_wqe_ctrl_seg, imm));

  EXPECT_EQ(sizeof(RaddrSeg), sizeof(mlx5_wqe_raddr_seg));
  EXPECT_EQ(offsetof(RaddrSeg, raddr), offsetof(mlx5_wqe_raddr_seg, raddr));
  EXPECT_EQ(offsetof(RaddrSeg, rkey), offsetof(mlx5_wqe_raddr_seg, rkey));
  EXPECT_EQ(offsetof(RaddrSeg, reserved), offsetof(mlx5_wqe_raddr_seg, reserved));

  EXPECT_EQ(sizeof(DataSeg), sizeof(mlx5_wqe_data_seg));
  EXPECT_EQ(offsetof(DataSeg, byte_count), offsetof(mlx5_wqe_data_seg, byte_count));
  EXPECT_EQ(offsetof(DataSeg, lkey), offsetof(mlx5_wqe_data_seg, lkey));
  EXPECT_EQ(offsetof(DataSeg, addr), offsetof(mlx5_wqe_data_seg, addr));

  EXPECT_EQ(sizeof(AtomicSeg), sizeof(mlx5_wqe_atomic_seg));
  EXPECT_EQ(offsetof(AtomicSeg, swap_add), offsetof(mlx5_wqe_atomic_seg, swap_add));
  EXPECT_EQ(offsetof(AtomicSeg, compare), offsetof(mlx5_wqe_atomic_seg, compare));

  EXPECT_EQ(sizeof(InlineHeader), sizeof(mlx5_wqe_inl_data_seg));
  EXPECT_EQ(kSegmentBytes, sizeof(mlx5_wqe_data_seg));
}

TEST(Mlx5WireLayout, CqeMatchesCqe64AndErrCqe) {
  EXPECT_EQ(sizeof(Cqe), sizeof(mlx5_cqe64));
  EXPECT_EQ(sizeof(Cqe), sizeof(mlx5_err_cqe));
  EXPECT_EQ(offsetof(Cqe, srqn_uidx), offsetof(mlx5_cqe64, srqn_uidx));
  EXPECT_EQ(offsetof(Cqe, imm_inval_pkey), offsetof(mlx5_cqe64, imm_inval_pkey));
  EXPECT_EQ(offsetof(Cqe, app), offsetof(mlx5_cqe64, app));
  EXPECT_EQ(offsetof(Cqe, app_op), offsetof(mlx5_cqe64, app_op));
  EXPECT_EQ(offsetof(Cqe, app_info), offsetof(mlx5_cqe64, app_info));
  EXPECT_EQ(offsetof(Cqe, byte_cnt), offsetof(mlx5_cqe64, byte_cnt));
  EXPECT_EQ(offsetof(Cqe, timestamp), offsetof(mlx5_cqe64, timestamp));
  EXPECT_EQ(offsetof(Cqe, sop_drop_qpn), offsetof(mlx5_cqe64, sop_drop_qpn));
  EXPECT_EQ(offsetof(Cqe, wqe_counter), offsetof(mlx5_cqe64, wqe_counter));
  EXPECT_EQ(offsetof(Cqe, signature), offsetof(mlx5_cqe64, signature));
  EXPECT_EQ(offsetof(Cqe, op_own), offsetof(mlx5_cqe64, op_own));

  EXPECT_EQ(offsetof(Cqe, vendor_err_synd), offsetof(mlx5_err_cqe, vendor_err_synd));
  EXPECT_EQ(offsetof(Cqe, syndrome), offsetof(mlx5_err_cqe, syndrome));
  EXPECT_EQ(offsetof(Cqe, sop_drop_qpn), offsetof(mlx5_err_cqe, s_wqe_opcode_qpn));
  EXPECT_EQ(offsetof(Cqe, wqe_counter), offsetof(mlx5_err_cqe, wqe_counter));
  EXPECT_EQ(offsetof(Cqe, signature), offsetof(mlx5_err_cqe, signature));
  EXPECT_EQ(offsetof(Cqe, op_own), offsetof(mlx5_err_cqe, op_own));
}

// ---- Constants --------------------------------------------------------------------

TEST(Mlx5WireConstants, WqeOpcodes) {
  EXPECT_EQ(static_cast<int>(Opcode::Nop), MLX5_OPCODE_NOP);
  EXPECT_EQ(static_cast<int>(Opcode::RdmaWrite), MLX5_OPCODE_RDMA_WRITE);
  EXPECT_EQ(static_cast<int>(Opcode::RdmaWriteImm), MLX5_OPCODE_RDMA_WRITE_IMM);
  EXPECT_EQ(static_cast<int>(Opcode::AtomicCs), MLX5_OPCODE_ATOMIC_CS);
  EXPECT_EQ(static_cast<int>(Opcode::AtomicFa), MLX5_OPCODE_ATOMIC_FA);
}

TEST(Mlx5WireConstants, GeometryFlagsAndDoorbellWords) {
  EXPECT_EQ(kWqeBasicBlockBytes, static_cast<uint32_t>(MLX5_SEND_WQE_BB));
  EXPECT_EQ(kWqeBasicBlockShift, static_cast<uint32_t>(MLX5_SEND_WQE_SHIFT));
  EXPECT_EQ(1u << kWqeBasicBlockShift, kWqeBasicBlockBytes);
  EXPECT_EQ(kInlineFlag, static_cast<uint32_t>(MLX5_INLINE_SEG));
  EXPECT_EQ(kCtrlCqUpdate, MLX5_WQE_CTRL_CQ_UPDATE);
  EXPECT_EQ(kCtrlSolicited, MLX5_WQE_CTRL_SOLICITED);
  EXPECT_EQ(fence_bits(FenceMode::InitiatorSmall), MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE);
  EXPECT_EQ(fence_bits(FenceMode::FenceAndInitiatorSmall), MLX5_WQE_CTRL_FENCE);
  EXPECT_EQ(fence_bits(FenceMode::None), 0);
  // No flag rdma-core defines touches the bits the parser treats as unassigned.
  for (const int flag : {MLX5_WQE_CTRL_CQ_UPDATE, MLX5_WQE_CTRL_SOLICITED, MLX5_WQE_CTRL_FENCE,
                         MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE}) {
    EXPECT_EQ(flag & kCtrlUnassignedBits, 0) << flag;
  }
  EXPECT_EQ(kDbrReceiveWord, static_cast<uint32_t>(MLX5_RCV_DBR));
  EXPECT_EQ(kDbrSendWord, static_cast<uint32_t>(MLX5_SND_DBR));
}

TEST(Mlx5WireConstants, CqeOpcodesAndSyndromes) {
  EXPECT_EQ(static_cast<int>(CqeOpcode::Req), MLX5_CQE_REQ);
  EXPECT_EQ(static_cast<int>(CqeOpcode::RespWrImm), MLX5_CQE_RESP_WR_IMM);
  EXPECT_EQ(static_cast<int>(CqeOpcode::ReqErr), MLX5_CQE_REQ_ERR);
  EXPECT_EQ(static_cast<int>(CqeOpcode::RespErr), MLX5_CQE_RESP_ERR);
  EXPECT_EQ(static_cast<int>(CqeOpcode::Invalid), MLX5_CQE_INVALID);
  EXPECT_EQ(kCqeInitialOpOwn, MLX5_CQE_INVALID << 4 | MLX5_CQE_OWNER_MASK);

  EXPECT_EQ(static_cast<int>(Syndrome::LocalLength), MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
  EXPECT_EQ(static_cast<int>(Syndrome::LocalQpOp), MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
  EXPECT_EQ(static_cast<int>(Syndrome::LocalProt), MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
  EXPECT_EQ(static_cast<int>(Syndrome::WrFlush), MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
  EXPECT_EQ(static_cast<int>(Syndrome::BadResp), MLX5_CQE_SYNDROME_BAD_RESP_ERR);
  EXPECT_EQ(static_cast<int>(Syndrome::LocalAccess), MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR);
  EXPECT_EQ(static_cast<int>(Syndrome::RemoteInvalReq), MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR);
  EXPECT_EQ(static_cast<int>(Syndrome::RemoteAccess), MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
  EXPECT_EQ(static_cast<int>(Syndrome::RemoteOp), MLX5_CQE_SYNDROME_REMOTE_OP_ERR);
  EXPECT_EQ(static_cast<int>(Syndrome::TransportRetryExc), MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
  EXPECT_EQ(static_cast<int>(Syndrome::RnrRetryExc), MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(static_cast<int>(Syndrome::RemoteAborted), MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR);
}

// ---- Byte order -------------------------------------------------------------------

TEST(Mlx5WireByteOrder, SwapsMatchHtobe) {
  static_assert(bswap16(0x1122) == 0x2211 && bswap32(0x11223344u) == 0x44332211u &&
                bswap64(0x1122334455667788ull) == 0x8877665544332211ull);
  std::mt19937 rng(1301);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t v = random64(rng);
    ASSERT_EQ(to_be16(static_cast<uint16_t>(v)), htobe16(static_cast<uint16_t>(v)));
    ASSERT_EQ(to_be32(static_cast<uint32_t>(v)), htobe32(static_cast<uint32_t>(v)));
    ASSERT_EQ(to_be64(v), htobe64(v));
    ASSERT_EQ(from_be64(to_be64(v)), v);
    ASSERT_EQ(from_be32(to_be32(static_cast<uint32_t>(v))), static_cast<uint32_t>(v));
    ASSERT_EQ(from_be16(to_be16(static_cast<uint16_t>(v))), static_cast<uint16_t>(v));
  }
}

// ---- Segments against rdma-core ---------------------------------------------------

TEST(Mlx5WireCtrl, DesignDocExample) {
  const CtrlFields fields{.wqe_idx = 0x1234, .opcode = Opcode::RdmaWrite, .qpn = 0xabcde, .ds = 3,
                          .fm_ce_se = kCtrlCqUpdate};
  const std::array<uint8_t, 16> expected = {0x00, 0x12, 0x34, 0x08, 0x0a, 0xbc, 0xde, 0x03,
                                            0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00};
  EXPECT_TRUE(same_bytes(encode_ctrl(fields), expected));
  EXPECT_TRUE(same_bytes(encode_ctrl(fields), rdma_core_ctrl(fields)));
}

TEST(Mlx5WireCtrl, MatchesSetCtrlSeg) {
  std::mt19937 rng(1302);
  for (int i = 0; i < 20000; ++i) {
    const CtrlFields fields = random_ctrl(rng);
    ASSERT_TRUE(same_bytes(encode_ctrl(fields), rdma_core_ctrl(fields))) << i;
    ASSERT_EQ(decode_ctrl(encode_ctrl(fields)), fields) << i;
  }
  // Out-of-range qpn and ds are not masked: the bytes stay rdma-core's, and the
  // predicates are what report them.
  for (const auto& [qpn, ds] : {std::pair<uint32_t, uint8_t>{0xff123456u, 3}, {0x10u, 0xff}}) {
    const CtrlFields fields{.opcode = Opcode::RdmaWrite, .qpn = qpn, .ds = ds};
    EXPECT_TRUE(same_bytes(encode_ctrl(fields), rdma_core_ctrl(fields)));
    EXPECT_FALSE(valid_qpn(qpn) && valid_ds(ds));
  }
}

// The comparison can fail: a field left in host order, or an imm swapped that should
// pass through, gives other bytes than rdma-core.
TEST(Mlx5WireCtrl, WrongByteOrderDiffers) {
  const CtrlFields fields{.wqe_idx = 0x1234, .opcode = Opcode::RdmaWriteImm, .qpn = 0xabcde, .ds = 3,
                          .fm_ce_se = kCtrlCqUpdate, .imm = 0x01020304};
  CtrlSeg native_qpn_ds = encode_ctrl(fields);
  native_qpn_ds.qpn_ds = fields.qpn << 8 | fields.ds;
  EXPECT_FALSE(same_bytes(native_qpn_ds, rdma_core_ctrl(fields)));
  CtrlSeg swapped_imm = encode_ctrl(fields);
  swapped_imm.imm = to_be32(fields.imm);
  EXPECT_FALSE(same_bytes(swapped_imm, rdma_core_ctrl(fields)));
  EXPECT_TRUE(same_bytes(encode_ctrl(fields), rdma_core_ctrl(fields)));
}

TEST(Mlx5WireData, MatchesSetDataSeg) {
  std::mt19937 rng(1303);
  for (int i = 0; i < 20000; ++i) {
    const DataFields fields{.byte_count = random32(rng) & kMaxByteCount, .lkey = random32(rng), .addr = random64(rng)};
    mlx5_wqe_data_seg theirs;
    mlx5dv_set_data_seg(&theirs, fields.byte_count, fields.lkey, fields.addr);
    ASSERT_TRUE(same_bytes(encode_data(fields), theirs)) << i;
    ASSERT_EQ(decode_data(encode_data(fields)), fields) << i;
  }
}

TEST(Mlx5WireRaddr, MatchesPostPathFill) {
  std::mt19937 rng(1304);
  for (int i = 0; i < 20000; ++i) {
    const RaddrFields fields{.raddr = random64(rng), .rkey = random32(rng)};
    mlx5_wqe_raddr_seg theirs;
    theirs.raddr = htobe64(fields.raddr);
    theirs.rkey = htobe32(fields.rkey);
    theirs.reserved = 0;
    ASSERT_TRUE(same_bytes(encode_raddr(fields), theirs)) << i;
    ASSERT_EQ(decode_raddr(encode_raddr(fields)), fields) << i;
  }
}

// qp.c's atomic setter: compare-and-swap puts swap and compare in their own words;
// fetch-and-add puts the addend in swap_add (compare is ignored; Railyard zeroes it).
TEST(Mlx5WireAtomic, MatchesPostPathFill) {
  std::mt19937 rng(1305);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t a = random64(rng), b = random64(rng);
    mlx5_wqe_atomic_seg cas;
    cas.swap_add = htobe64(b);
    cas.compare = htobe64(a);
    ASSERT_TRUE(same_bytes(encode_atomic(compare_swap_operands(a, b)), cas)) << i;
    mlx5_wqe_atomic_seg fa;
    fa.swap_add = htobe64(a);
    fa.compare = 0;
    ASSERT_TRUE(same_bytes(encode_atomic(fetch_add_operands(a)), fa)) << i;
    ASSERT_EQ(decode_atomic(encode_atomic(compare_swap_operands(a, b))), compare_swap_operands(a, b));
  }
}

TEST(Mlx5WireInline, HeaderAndUnits) {
  for (uint32_t n = 0; n <= kMaxWriteInlineBytes; ++n) {
    mlx5_wqe_inl_data_seg theirs;
    theirs.byte_count = htobe32(n | MLX5_INLINE_SEG);
    ASSERT_TRUE(same_bytes(encode_inline_header(n), theirs)) << n;
    // Header and payload, padded to whole segments.
    ASSERT_GE(inline_units(n) * kSegmentBytes, kInlineHeaderBytes + n) << n;
    ASSERT_LT(inline_units(n) * kSegmentBytes - (kInlineHeaderBytes + n), kSegmentBytes) << n;
  }
  EXPECT_EQ(inline_units(0), 1u);
  EXPECT_EQ(inline_units(12), 1u);
  EXPECT_EQ(inline_units(13), 2u);
  EXPECT_EQ(inline_units(28), 2u);
  EXPECT_EQ(inline_units(29), 3u);
}

// ---- Whole WQEs, validation, doorbells --------------------------------------------

TEST(Mlx5WireWqe, DsAndBasicBlocks) {
  EXPECT_EQ(kNopDs, 1);
  EXPECT_EQ(kWriteDs, 3);
  EXPECT_EQ(kWriteImmDs, 3);
  EXPECT_EQ(kAtomicDs, 4);
  // The GPU references' inline WRITE: ds 3 up to 12 bytes, 4 up to 28.
  EXPECT_EQ(write_inline_ds(12), 3);
  EXPECT_EQ(write_inline_ds(13), 4);
  EXPECT_EQ(write_inline_ds(28), 4);
  EXPECT_EQ(write_inline_ds(kMaxWriteInlineBytes), kMaxDs);
  for (const uint8_t ds : {kNopDs, kWriteDs, kWriteImmDs, kAtomicDs, write_inline_ds(28)}) {
    EXPECT_EQ(wqebb_count(ds), 1u) << int{ds};
  }
  EXPECT_EQ(wqebb_count(write_inline_ds(29)), 2u);
  EXPECT_EQ(wqebb_count(8), 2u);
  EXPECT_EQ(wqebb_count(9), 3u);
  EXPECT_EQ(wqebb_count(kMaxDs), 16u);
}

TEST(Mlx5WireWqe, RingSlots) {
  for (uint32_t log2 = 0; log2 <= 15; ++log2) {
    const uint32_t n = 1u << log2;
    for (const uint32_t pi : {0u, 1u, n - 1, n, n + 1, 3 * n + 5, 0xfffffffeu, 0xffffffffu}) {
      EXPECT_EQ(wqe_slot(pi, log2), pi % n) << pi << " " << n;
      EXPECT_EQ(wqe_byte_offset(pi, log2), (pi % n) * MLX5_SEND_WQE_BB) << pi << " " << n;
    }
  }
}

TEST(Mlx5WireValidation, Predicates) {
  EXPECT_TRUE(valid_qpn(0));
  EXPECT_TRUE(valid_qpn(0xffffff));
  EXPECT_FALSE(valid_qpn(0x1000000));
  EXPECT_FALSE(valid_ds(0));
  EXPECT_TRUE(valid_ds(1));
  EXPECT_TRUE(valid_ds(63));
  EXPECT_FALSE(valid_ds(64));
  EXPECT_TRUE(valid_byte_count(0x7fffffffu));
  EXPECT_FALSE(valid_byte_count(0x80000000u));
  EXPECT_TRUE(inline_fits(kMaxWriteInlineBytes));
  EXPECT_FALSE(inline_fits(kMaxWriteInlineBytes + 1));
  // The limit is exact: one byte more would need ds 64.
  EXPECT_EQ(write_inline_ds(kMaxWriteInlineBytes), kMaxDs);
  EXPECT_EQ(write_inline_ds(kMaxWriteInlineBytes + 1), kMaxDs + 1);
}

TEST(Mlx5WireDoorbell, RecordValues) {
  std::mt19937 rng(1306);
  for (int i = 0; i < 10000; ++i) {
    const uint32_t pi = random32(rng);
    // qp.c: the send record is BE32 of the next free WQEBB index, 16 bits.
    ASSERT_EQ(send_dbr_value(pi), htobe32(pi & 0xffff)) << pi;
    // cq.c: the CQ record's consumer index is 24 bits.
    ASSERT_EQ(cq_consumer_dbr_value(pi), htobe32(pi & 0xffffff)) << pi;
  }
}

// The 8-byte doorbell is the first 8 bytes of rdma-core's ctrl segment, stored by one
// little-endian 64-bit store.
TEST(Mlx5WireDoorbell, ValueIsFirstEightBytesOfCtrl) {
  std::mt19937 rng(1307);
  for (int i = 0; i < 10000; ++i) {
    const CtrlFields fields = random_ctrl(rng);
    const uint64_t value = doorbell_value(encode_ctrl(fields));
    const mlx5_wqe_ctrl_seg theirs = rdma_core_ctrl(fields);
    ASSERT_EQ(std::memcmp(&value, &theirs, sizeof(value)), 0) << hex(&value, 8) << " vs " << hex(&theirs, 8);
  }
}

// ---- CQEs -------------------------------------------------------------------------

Cqe as_cqe(const void* theirs) {
  Cqe cqe;
  std::memcpy(&cqe, theirs, sizeof(cqe));
  return cqe;
}

TEST(Mlx5WireCqe, DecodesRequesterCqeFilledByFields) {
  std::mt19937 rng(1308);
  for (int i = 0; i < 10000; ++i) {
    mlx5_cqe64 theirs;
    std::memset(&theirs, 0, sizeof(theirs));
    const uint32_t qpn = random32(rng) & kMaxQpn, byte_count = random32(rng), imm = random32(rng);
    const uint16_t wqe_counter = static_cast<uint16_t>(random32(rng));
    const uint8_t owner = random32(rng) & 1, solicited = random32(rng) & 1;
    theirs.sop_drop_qpn = htobe32(static_cast<uint32_t>(MLX5_OPCODE_ATOMIC_FA) << 24 | qpn);
    theirs.wqe_counter = htobe16(wqe_counter);
    theirs.byte_cnt = htobe32(byte_count);
    theirs.imm_inval_pkey = imm;
    theirs.timestamp = htobe64(random64(rng));
    theirs.op_own = static_cast<uint8_t>(MLX5_CQE_REQ << 4 | solicited << 1 | owner);
    const CqeFields fields = decode_cqe(as_cqe(&theirs));
    ASSERT_EQ(fields.opcode, CqeOpcode::Req);
    ASSERT_EQ(fields.owner, mlx5dv_get_cqe_owner(&theirs) != 0);
    ASSERT_EQ(fields.solicited, mlx5dv_get_cqe_se(&theirs) != 0);
    ASSERT_EQ(fields.format, mlx5dv_get_cqe_format(&theirs));
    ASSERT_EQ(fields.wqe_counter, wqe_counter);
    ASSERT_EQ(fields.qpn, qpn);
    ASSERT_EQ(fields.wqe_opcode, MLX5_OPCODE_ATOMIC_FA);
    ASSERT_EQ(fields.byte_count, byte_count);
    ASSERT_EQ(fields.imm, imm);
    // Bytes 54 and 55 are the timestamp's here, not syndromes.
    ASSERT_EQ(fields.syndrome, Syndrome{});
    ASSERT_EQ(fields.vendor_syndrome, 0);
  }
}

TEST(Mlx5WireCqe, DecodesErrCqeFilledByFields) {
  std::mt19937 rng(1309);
  for (int i = 0; i < 10000; ++i) {
    mlx5_err_cqe theirs;
    std::memset(&theirs, 0, sizeof(theirs));
    const uint32_t qpn = random32(rng) & kMaxQpn;
    const uint8_t syndrome = static_cast<uint8_t>(random32(rng)), vendor = static_cast<uint8_t>(random32(rng));
    const uint16_t wqe_counter = static_cast<uint16_t>(random32(rng));
    const uint8_t owner = random32(rng) & 1;
    theirs.syndrome = syndrome;
    theirs.vendor_err_synd = vendor;
    theirs.s_wqe_opcode_qpn = htobe32(static_cast<uint32_t>(MLX5_OPCODE_RDMA_WRITE) << 24 | qpn);
    theirs.wqe_counter = htobe16(wqe_counter);
    theirs.op_own = static_cast<uint8_t>(MLX5_CQE_REQ_ERR << 4 | owner);
    const CqeFields fields = decode_cqe(as_cqe(&theirs));
    ASSERT_EQ(fields.opcode, CqeOpcode::ReqErr);
    ASSERT_EQ(fields.owner, owner != 0);
    ASSERT_EQ(static_cast<uint8_t>(fields.syndrome), syndrome);
    ASSERT_EQ(fields.vendor_syndrome, vendor);
    ASSERT_EQ(fields.qpn, qpn);
    ASSERT_EQ(fields.wqe_opcode, MLX5_OPCODE_RDMA_WRITE);
    ASSERT_EQ(fields.wqe_counter, wqe_counter);
  }
}

// What the simulated NIC writes, read back through rdma-core's struct and accessors.
TEST(Mlx5WireCqe, EncodedCqesReadBackByRdmaCore) {
  std::mt19937 rng(1310);
  for (int i = 0; i < 10000; ++i) {
    const bool error = random32(rng) & 1;
    const CqeFields fields{.opcode = error ? CqeOpcode::ReqErr : CqeOpcode::Req,
                           .owner = (random32(rng) & 1) != 0,
                           .wqe_counter = static_cast<uint16_t>(random32(rng)),
                           .qpn = random32(rng) & kMaxQpn,
                           .wqe_opcode = MLX5_OPCODE_ATOMIC_FA,
                           .byte_count = error ? 0 : 8u,
                           .syndrome = error ? Syndrome::RemoteAccess : Syndrome{},
                           .vendor_syndrome = static_cast<uint8_t>(error ? random32(rng) : 0)};
    const Cqe cqe = encode_cqe(fields);
    mlx5_cqe64 good;
    mlx5_err_cqe err;
    std::memcpy(&good, &cqe, sizeof(good));
    std::memcpy(&err, &cqe, sizeof(err));
    ASSERT_EQ(mlx5dv_get_cqe_opcode(&good), error ? MLX5_CQE_REQ_ERR : MLX5_CQE_REQ);
    ASSERT_EQ(mlx5dv_get_cqe_owner(&good), fields.owner ? 1 : 0);
    ASSERT_EQ(mlx5dv_get_cqe_format(&good), 0);
    ASSERT_EQ(be16toh(good.wqe_counter), fields.wqe_counter);
    ASSERT_EQ(be32toh(good.sop_drop_qpn) & 0xffffff, fields.qpn);
    ASSERT_EQ(be32toh(good.sop_drop_qpn) >> 24, static_cast<uint32_t>(MLX5_OPCODE_ATOMIC_FA));
    ASSERT_EQ(be32toh(good.byte_cnt), fields.byte_count);
    ASSERT_EQ(err.syndrome, static_cast<uint8_t>(fields.syndrome));
    ASSERT_EQ(err.vendor_err_synd, fields.vendor_syndrome);
    ASSERT_EQ(decode_cqe(cqe), fields) << i;
  }
}

// rdma-core's rule, spelled with its accessors: a valid opcode, and the owner bit
// equal to the lap parity of n (cq.c, get_sw_cqe).
bool rdma_core_owned(const Cqe& cqe, uint32_t n, uint32_t ncqe) {
  mlx5_cqe64 theirs;
  std::memcpy(&theirs, &cqe, sizeof(theirs));
  return mlx5dv_get_cqe_opcode(&theirs) != MLX5_CQE_INVALID && !(mlx5dv_get_cqe_owner(&theirs) ^ !!(n & ncqe));
}

// A NIC writes CQEs in bursts into a ring it laps several times (across the 32-bit
// wrap of n too); the consumer, polling by the rule, must see each CQE exactly once,
// in order, and never a stale one from an earlier lap or the initial fill.
TEST(Mlx5WireCqe, OwnershipOverWrappingRing) {
  std::mt19937 rng(1311);
  for (const uint32_t ncqe : {1u, 2u, 8u, 64u}) {
    for (const uint32_t start : {0u, 0xffffffffu - 5 * ncqe}) {
      std::vector<Cqe> ring(ncqe);
      for (Cqe& cqe : ring) cqe.op_own = kCqeInitialOpOwn;
      uint32_t produced = start, consumed = start;
      while (consumed - start < 6 * ncqe) {
        const uint32_t burst = random32(rng) % (ncqe - (produced - consumed) + 1);
        for (uint32_t k = 0; k < burst; ++k, ++produced) {
          ring[produced & (ncqe - 1)] = encode_cqe({.opcode = CqeOpcode::Req,
                                                    .owner = cqe_owner_for(produced, ncqe),
                                                    .wqe_counter = static_cast<uint16_t>(produced)});
        }
        for (;;) {
          const Cqe& cqe = ring[consumed & (ncqe - 1)];
          const bool owned = cqe_owned_by_software(cqe.op_own, consumed, ncqe);
          ASSERT_EQ(owned, rdma_core_owned(cqe, consumed, ncqe)) << consumed;
          ASSERT_EQ(owned, consumed != produced) << "ncqe " << ncqe << " n " << consumed;
          if (!owned) break;
          ASSERT_EQ(decode_cqe(cqe).wqe_counter, static_cast<uint16_t>(consumed));
          ++consumed;
        }
      }
    }
  }
}

// ---- WQE parser -------------------------------------------------------------------

template <class Seg>
void append(std::vector<uint8_t>& wqe, const Seg& seg) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(&seg);
  wqe.insert(wqe.end(), bytes, bytes + sizeof(seg));
}

std::vector<uint8_t> nop_wqe(CtrlFields ctrl) {
  ctrl.opcode = Opcode::Nop;
  ctrl.ds = kNopDs;
  std::vector<uint8_t> wqe;
  append(wqe, encode_ctrl(ctrl));
  return wqe;
}

std::vector<uint8_t> write_wqe(CtrlFields ctrl, const RaddrFields& remote, const DataFields& local) {
  ctrl.ds = kWriteDs;
  std::vector<uint8_t> wqe;
  append(wqe, encode_ctrl(ctrl));
  append(wqe, encode_raddr(remote));
  append(wqe, encode_data(local));
  return wqe;
}

std::vector<uint8_t> write_inline_wqe(CtrlFields ctrl, const RaddrFields& remote, const std::vector<uint8_t>& data) {
  const uint32_t n = static_cast<uint32_t>(data.size());
  ctrl.opcode = Opcode::RdmaWrite;
  ctrl.ds = write_inline_ds(n);
  std::vector<uint8_t> wqe;
  append(wqe, encode_ctrl(ctrl));
  append(wqe, encode_raddr(remote));
  append(wqe, encode_inline_header(n));
  wqe.insert(wqe.end(), data.begin(), data.end());
  wqe.resize(ctrl.ds * kSegmentBytes, 0);
  return wqe;
}

std::vector<uint8_t> atomic_wqe(CtrlFields ctrl, const RaddrFields& remote, const AtomicFields& operands,
                                const DataFields& local) {
  ctrl.ds = kAtomicDs;
  std::vector<uint8_t> wqe;
  append(wqe, encode_ctrl(ctrl));
  append(wqe, encode_raddr(remote));
  append(wqe, encode_atomic(operands));
  append(wqe, encode_data(local));
  return wqe;
}

// A ctrl segment the parser accepts: supported opcode, no opmod, assigned fm_ce_se bits.
CtrlFields valid_ctrl(std::mt19937& rng, Opcode opcode) {
  const uint8_t fence = fence_bits(static_cast<FenceMode>(random32(rng) % (kMaxFenceMode + 1)));
  return CtrlFields{.wqe_idx = static_cast<uint16_t>(random32(rng)),
                    .opcode = opcode,
                    .qpn = random32(rng) & kMaxQpn,
                    .fm_ce_se = static_cast<uint8_t>(fence | (random32(rng) & (kCtrlCqUpdate | kCtrlSolicited))),
                    .imm = opcode == Opcode::RdmaWriteImm ? random32(rng) : 0};
}

WqeParse parse(const std::vector<uint8_t>& wqe) {
  return parse_wqe(wqe.data(), static_cast<uint32_t>(wqe.size()));
}

TEST(Mlx5WireParser, RoundTrips) {
  std::mt19937 rng(1312);
  for (int i = 0; i < 2000; ++i) {
    const RaddrFields remote{.raddr = random64(rng), .rkey = random32(rng)};
    const DataFields local{.byte_count = random32(rng) & kMaxByteCount, .lkey = random32(rng), .addr = random64(rng)};

    const CtrlFields nop = valid_ctrl(rng, Opcode::Nop);
    const WqeParse parsed_nop = parse(nop_wqe(nop));
    ASSERT_EQ(parsed_nop.error, WqeError::None);
    ASSERT_EQ(parsed_nop.wqe, (ParsedWqe{.ctrl = {.wqe_idx = nop.wqe_idx, .qpn = nop.qpn, .ds = kNopDs,
                                                  .fm_ce_se = nop.fm_ce_se, .imm = nop.imm}}));

    for (const Opcode opcode : {Opcode::RdmaWrite, Opcode::RdmaWriteImm}) {
      CtrlFields ctrl = valid_ctrl(rng, opcode);
      const WqeParse parsed = parse(write_wqe(ctrl, remote, local));
      ctrl.ds = kWriteDs;
      ASSERT_EQ(parsed.error, WqeError::None) << wqe_error_name(parsed.error);
      ASSERT_EQ(parsed.wqe, (ParsedWqe{.ctrl = ctrl, .remote = remote, .local = local}));
    }

    for (const Opcode opcode : {Opcode::AtomicFa, Opcode::AtomicCs}) {
      CtrlFields ctrl = valid_ctrl(rng, opcode);
      const AtomicFields operands = opcode == Opcode::AtomicFa ? fetch_add_operands(random64(rng))
                                                               : compare_swap_operands(random64(rng), random64(rng));
      const DataFields old_value{.byte_count = 8, .lkey = random32(rng), .addr = random64(rng)};
      const WqeParse parsed = parse(atomic_wqe(ctrl, remote, operands, old_value));
      ctrl.ds = kAtomicDs;
      ASSERT_EQ(parsed.error, WqeError::None) << wqe_error_name(parsed.error);
      ASSERT_EQ(parsed.wqe, (ParsedWqe{.ctrl = ctrl, .remote = remote, .local = old_value, .atomic = operands}));
    }
  }
}

TEST(Mlx5WireParser, InlineRoundTripsEveryLength) {
  std::mt19937 rng(1313);
  for (uint32_t n = 0; n <= kMaxWriteInlineBytes; ++n) {
    std::vector<uint8_t> payload(n);
    for (uint8_t& byte : payload) byte = static_cast<uint8_t>(random32(rng));
    CtrlFields ctrl = valid_ctrl(rng, Opcode::RdmaWrite);
    const RaddrFields remote{.raddr = random64(rng), .rkey = random32(rng)};
    const std::vector<uint8_t> wqe = write_inline_wqe(ctrl, remote, payload);
    const WqeParse parsed = parse(wqe);
    ctrl.ds = write_inline_ds(n);
    ASSERT_EQ(parsed.error, WqeError::None) << n << ": " << wqe_error_name(parsed.error);
    ASSERT_EQ(parsed.wqe, (ParsedWqe{.ctrl = ctrl, .remote = remote, .is_inline = true, .inline_bytes = n,
                                     .inline_offset = kWriteInlinePayloadOffset}));
    ASSERT_TRUE(std::equal(payload.begin(), payload.end(), wqe.begin() + parsed.wqe.inline_offset)) << n;
  }
}

// A WQE built entirely by rdma-core's setters and structs parses to its fields.
TEST(Mlx5WireParser, ParsesWqeBuiltByRdmaCore) {
  struct {
    mlx5_wqe_ctrl_seg ctrl;
    mlx5_wqe_raddr_seg raddr;
    mlx5_wqe_data_seg data;
  } theirs;
  static_assert(sizeof(theirs) == kWriteDs * kSegmentBytes);
  std::memset(&theirs, 0, sizeof(theirs));
  mlx5dv_set_ctrl_seg(&theirs.ctrl, 0xbeef, MLX5_OPCODE_RDMA_WRITE_IMM, 0, 0x123456, MLX5_WQE_CTRL_CQ_UPDATE, 3, 0,
                      htobe32(0xc0ffee));
  theirs.raddr.raddr = htobe64(0x7f0012345678ull);
  theirs.raddr.rkey = htobe32(0xabcdef01u);
  mlx5dv_set_data_seg(&theirs.data, 4096, 0x10203040u, 0x7e0000001000ull);
  const WqeParse parsed = parse_wqe(reinterpret_cast<const uint8_t*>(&theirs), sizeof(theirs));
  ASSERT_EQ(parsed.error, WqeError::None) << wqe_error_name(parsed.error);
  EXPECT_EQ(parsed.wqe, (ParsedWqe{.ctrl = {.wqe_idx = 0xbeef, .opcode = Opcode::RdmaWriteImm, .qpn = 0x123456,
                                            .ds = 3, .fm_ce_se = kCtrlCqUpdate, .imm = htobe32(0xc0ffee)},
                                   .remote = {.raddr = 0x7f0012345678ull, .rkey = 0xabcdef01u},
                                   .local = {.byte_count = 4096, .lkey = 0x10203040u, .addr = 0x7e0000001000ull}}));
}

// One malformed WQE per error, each a small edit of a valid one.
struct BadWqe {
  const char* what;
  std::vector<uint8_t> bytes;
  WqeError expected;
};

std::vector<BadWqe> bad_wqes() {
  const CtrlFields write{.wqe_idx = 5, .opcode = Opcode::RdmaWrite, .qpn = 77, .fm_ce_se = kCtrlCqUpdate};
  const RaddrFields remote{.raddr = 0x1000, .rkey = 9};
  const DataFields local{.byte_count = 64, .lkey = 3, .addr = 0x2000};
  const std::vector<uint8_t> good = write_wqe(write, remote, local);
  const CtrlFields fa{.wqe_idx = 6, .opcode = Opcode::AtomicFa, .qpn = 77};
  const DataFields old_value{.byte_count = 8, .lkey = 3, .addr = 0x3000};
  const auto edit = [](std::vector<uint8_t> wqe, size_t offset, uint8_t value) {
    wqe[offset] = value;
    return wqe;
  };
  const auto with_ctrl = [&](CtrlFields ctrl) {
    std::vector<uint8_t> wqe = good;
    const CtrlSeg seg = encode_ctrl(ctrl);
    std::memcpy(wqe.data(), &seg, sizeof(seg));
    return wqe;
  };
  // ds is the last byte of qpn_ds; the bytes are padded to what ds claims.
  const auto with_ds = [&](std::vector<uint8_t> wqe, uint8_t ds) {
    wqe.resize(std::max<size_t>(wqe.size(), (ds & kMaxDs) * kSegmentBytes), 0);
    return edit(std::move(wqe), offsetof(CtrlSeg, qpn_ds) + 3, ds);
  };
  const std::vector<uint8_t> inline12 = write_inline_wqe(write, remote, std::vector<uint8_t>(12, 0xab));
  const std::vector<uint8_t> inline13 = write_inline_wqe(write, remote, std::vector<uint8_t>(13, 0xab));
  std::vector<uint8_t> inline_inline_atomic = atomic_wqe(fa, remote, fetch_add_operands(1), old_value);
  const InlineHeader header = encode_inline_header(8);
  std::memcpy(inline_inline_atomic.data() + 3 * kSegmentBytes, &header, sizeof(header));
  return {
      {"empty", {}, WqeError::Truncated},
      {"shorter than ctrl", std::vector<uint8_t>(good.begin(), good.begin() + 15), WqeError::Truncated},
      {"shorter than ds", std::vector<uint8_t>(good.begin(), good.end() - 1), WqeError::Truncated},
      {"SEND opcode", edit(good, 3, MLX5_OPCODE_SEND), WqeError::UnsupportedOpcode},
      {"RDMA_READ opcode", edit(good, 3, MLX5_OPCODE_RDMA_READ), WqeError::UnsupportedOpcode},
      {"masked FA opcode", edit(good, 3, MLX5_OPCODE_ATOMIC_MASKED_FA), WqeError::UnsupportedOpcode},
      {"opmod", edit(good, 0, 1), WqeError::OpmodNonZero},
      {"signature", edit(good, offsetof(CtrlSeg, signature), 0x5a), WqeError::SignatureNonZero},
      {"stream channel id", edit(good, offsetof(CtrlSeg, stream_channel_id) + 1, 1), WqeError::ReservedNonZero},
      {"ds bit 6", with_ds(good, 0x40 | kWriteDs), WqeError::ReservedNonZero},
      {"fm_ce_se bit 0", with_ctrl({.wqe_idx = 5, .opcode = Opcode::RdmaWrite, .qpn = 77, .ds = kWriteDs,
                                    .fm_ce_se = 0x01}),
       WqeError::ReservedNonZero},
      {"fm_ce_se bit 4", with_ctrl({.wqe_idx = 5, .opcode = Opcode::RdmaWrite, .qpn = 77, .ds = kWriteDs,
                                    .fm_ce_se = 0x10}),
       WqeError::ReservedNonZero},
      {"raddr reserved", edit(good, kSegmentBytes + offsetof(RaddrSeg, reserved), 1), WqeError::ReservedNonZero},
      {"fence mode 5", with_ctrl({.wqe_idx = 5, .opcode = Opcode::RdmaWrite, .qpn = 77, .ds = kWriteDs,
                                  .fm_ce_se = 5 << kCtrlFenceShift}),
       WqeError::InvalidFenceMode},
      {"write ds 2", with_ds(good, 2), WqeError::DsMismatch},
      {"write ds 4", with_ds(good, 4), WqeError::DsMismatch},
      {"nop ds 0", with_ds(nop_wqe({}), 0), WqeError::DsMismatch},
      {"nop ds 3", edit(good, 3, MLX5_OPCODE_NOP), WqeError::DsMismatch},
      {"atomic ds 3", with_ds(atomic_wqe(fa, remote, fetch_add_operands(1), old_value), 3), WqeError::DsMismatch},
      {"atomic ds 5", with_ds(atomic_wqe(fa, remote, fetch_add_operands(1), old_value), 5), WqeError::DsMismatch},
      {"inline 12 bytes in ds 4", with_ds(inline12, 4), WqeError::DsMismatch},
      {"inline 13 bytes in ds 3", with_ds(inline13, 3), WqeError::InlineExceedsDs},
      {"atomic data segment inline", inline_inline_atomic, WqeError::DataByteCountInline},
      {"atomic 4 bytes", atomic_wqe(fa, remote, fetch_add_operands(1), {.byte_count = 4, .addr = 0x3000}),
       WqeError::AtomicLengthNot8},
  };
}

TEST(Mlx5WireParser, EveryErrorIsReported) {
  std::set<WqeError> seen;
  for (const BadWqe& bad : bad_wqes()) {
    EXPECT_EQ(parse(bad.bytes).error, bad.expected)
        << bad.what << ": got " << wqe_error_name(parse(bad.bytes).error) << ", bytes " << hex(bad.bytes.data(),
                                                                                               bad.bytes.size());
    seen.insert(bad.expected);
  }
  for (int e = static_cast<int>(WqeError::Truncated); e <= static_cast<int>(WqeError::AtomicLengthNot8); ++e) {
    EXPECT_TRUE(seen.count(static_cast<WqeError>(e))) << "no test for " << wqe_error_name(static_cast<WqeError>(e));
  }
}

TEST(Mlx5WireParser, ErrorNamesAreDistinct) {
  std::set<std::string> names;
  for (int e = static_cast<int>(WqeError::None); e <= static_cast<int>(WqeError::AtomicLengthNot8); ++e) {
    names.insert(wqe_error_name(static_cast<WqeError>(e)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(WqeError::AtomicLengthNot8) + 1);
  EXPECT_EQ(names.count("unknown"), 0u);
  // AtomicLengthNot8 is the last error: a new one must extend the loops above.
  EXPECT_STREQ(wqe_error_name(static_cast<WqeError>(static_cast<int>(WqeError::AtomicLengthNot8) + 1)), "unknown");
}

}  // namespace
}  // namespace railyard::transport::mlx5
