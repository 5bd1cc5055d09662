// Railyard transport, mlx5 backend: the wire format a GPU-initiated sender writes and
// a ConnectX NIC reads. Send-queue segments, the doorbell record and doorbell values,
// and completion-queue entries, as encoders, decoders and a WQE parser shared by the
// device code that posts work, the simulated NIC that executes it and the host tests.
//
// Layouts and constants follow rdma-core's public header infiniband/mlx5dv.h (struct
// mlx5_wqe_{ctrl,raddr,data,atomic,inl_data}_seg, mlx5_cqe64, mlx5_err_cqe,
// MLX5_OPCODE_*, MLX5_CQE_*) and the semantics of its CPU post and poll paths
// (providers/mlx5/qp.c, cq.c). tests/transport/mlx5_wire_test.cpp compares every
// encoding here byte for byte with that header. See docs/design-internode.md.
//
// Byte order: every multi-byte field the NIC reads is big-endian. A segment struct
// holds each field as it lies on the wire (a uint32_t whose bytes in memory are
// big-endian), so posting a segment is copying its 16 bytes into the ring. Encoders
// take native values and swap; decoders swap back. Exceptions, passed through as
// given: `imm` (opaque to the NIC; mlx5dv_set_ctrl_seg stores it unchanged) and
// payload bytes.
//
// Pure header: no CUDA, no rdma-core, no asm. It compiles with a plain host compiler,
// in the simulator flavour and with nvcc.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "railyard/common/byte_order.cuh"
#include "railyard/common/macros.cuh"

namespace railyard::transport::mlx5 {

// GPUs and the hosts Railyard builds for are little-endian, so big-endian is a swap.
static_assert(std::endian::native == std::endian::little, "to_be*/from_be* assume a little-endian machine");

// ---------------------------------------------------------------------------------
// Byte order (common/byte_order.cuh).

using ::railyard::bswap16;
using ::railyard::bswap32;
using ::railyard::bswap64;

RAILYARD_HOST_DEVICE constexpr uint16_t to_be16(uint16_t v) { return bswap16(v); }
RAILYARD_HOST_DEVICE constexpr uint32_t to_be32(uint32_t v) { return bswap32(v); }
RAILYARD_HOST_DEVICE constexpr uint64_t to_be64(uint64_t v) { return bswap64(v); }
RAILYARD_HOST_DEVICE constexpr uint16_t from_be16(uint16_t v) { return bswap16(v); }
RAILYARD_HOST_DEVICE constexpr uint32_t from_be32(uint32_t v) { return bswap32(v); }
RAILYARD_HOST_DEVICE constexpr uint64_t from_be64(uint64_t v) { return bswap64(v); }

// ---------------------------------------------------------------------------------
// Send-queue geometry (mlx5dv.h MLX5_SEND_WQE_BB, MLX5_SEND_WQE_SHIFT). The SQ is a
// power-of-two ring of 64-byte basic blocks (WQEBBs); a WQE is `ds` 16-byte segments
// and takes ceil(ds / 4) WQEBBs. The producer index pi counts WQEBBs; the ctrl
// segment and the doorbell record carry it modulo 2^16.

inline constexpr uint32_t kWqeBasicBlockBytes = 64;
inline constexpr uint32_t kWqeBasicBlockShift = 6;
inline constexpr uint32_t kSegmentBytes = 16;
inline constexpr uint32_t kWqeIndexMask = 0xffff;
inline constexpr uint32_t kMaxQpn = (1u << 24) - 1;  // qpn is bits 31:8 of qpn_ds
inline constexpr uint32_t kMaxDs = 63;               // ds is bits 5:0 of qpn_ds; 7:6 are reserved
// byte_count bit 31 (MLX5_INLINE_SEG) marks an inline segment, so a data segment's
// length must leave it clear.
inline constexpr uint32_t kInlineFlag = 0x80000000u;
inline constexpr uint32_t kMaxByteCount = kInlineFlag - 1;

// WQE opcodes Railyard posts (the low byte of opmod_idx_opcode; MLX5_OPCODE_*).
enum class Opcode : uint8_t {
  Nop = 0x00,
  RdmaWrite = 0x08,
  RdmaWriteImm = 0x09,
  AtomicCs = 0x11,
  AtomicFa = 0x12,
};

// fm_ce_se, byte 11 of the ctrl segment: fence mode in bits 7:5, completion mode in
// bits 3:2, solicited event in bit 1. Bits 4 and 0 carry no MLX5_WQE_CTRL_* flag, and
// the parser rejects them so that a stray flag shows.
inline constexpr uint8_t kCtrlSolicited = 1u << 1;  // MLX5_WQE_CTRL_SOLICITED
inline constexpr uint8_t kCtrlCqUpdate = 2u << 2;   // MLX5_WQE_CTRL_CQ_UPDATE: a CQE on success too
inline constexpr uint8_t kCtrlUnassignedBits = 0x11;
inline constexpr uint32_t kCtrlFenceShift = 5;

// Fence modes, the values of the 3-bit fm field. mlx5dv.h names two of them as flags:
// MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE (1 << 5) and MLX5_WQE_CTRL_FENCE (4 << 5).
enum class FenceMode : uint8_t {
  None = 0,
  InitiatorSmall = 1,
  Fence = 2,
  StrongOrdering = 3,
  FenceAndInitiatorSmall = 4,
};
inline constexpr uint8_t kMaxFenceMode = 4;

RAILYARD_HOST_DEVICE constexpr uint8_t fence_bits(FenceMode mode) {
  return static_cast<uint8_t>(static_cast<uint32_t>(mode) << kCtrlFenceShift);
}

// CQE opcodes (op_own bits 7:4; MLX5_CQE_*). INVALID marks a CQE the NIC has not
// written: rings start with it.
enum class CqeOpcode : uint8_t {
  Req = 0,
  RespWrImm = 1,
  ReqErr = 13,
  RespErr = 14,
  Invalid = 15,
};

// Error-CQE syndromes (byte 55; MLX5_CQE_SYNDROME_*_ERR).
enum class Syndrome : uint8_t {
  LocalLength = 0x01,
  LocalQpOp = 0x02,
  LocalProt = 0x04,
  WrFlush = 0x05,
  BadResp = 0x10,
  LocalAccess = 0x11,
  RemoteInvalReq = 0x12,
  RemoteAccess = 0x13,
  RemoteOp = 0x14,
  TransportRetryExc = 0x15,
  RnrRetryExc = 0x16,
  RemoteAborted = 0x22,
};

// ---------------------------------------------------------------------------------
// Doorbell records: big-endian words in memory the NIC reads. A QP's record holds the
// receive counter in word 0 and the send counter in word 1 (MLX5_RCV_DBR,
// MLX5_SND_DBR); a CQ's holds the consumer index in word 0 (MLX5_CQ_SET_CI of
// rdma-core's providers/mlx5/mlx5.h, not in the public header).

inline constexpr uint32_t kDbrReceiveWord = 0;
inline constexpr uint32_t kDbrSendWord = 1;
inline constexpr uint32_t kCqDbrConsumerWord = 0;

// The send record holds the index of the next free WQEBB, modulo 2^16 (qp.c).
RAILYARD_HOST_DEVICE constexpr uint32_t send_dbr_value(uint32_t pi) { return to_be32(pi & kWqeIndexMask); }

// The CQ consumer index is 24 bits wide (cq.c).
RAILYARD_HOST_DEVICE constexpr uint32_t cq_consumer_dbr_value(uint32_t ci) { return to_be32(ci & 0xffffffu); }

// ---------------------------------------------------------------------------------
// Segments. Each starts on a 16-byte boundary of the WQE (ds counts 16-byte units), so
// alignas(16) lets a writer store a whole segment with one 16-byte vector store. The
// offsets are those of rdma-core's structs (static_asserts below, tests against it).

struct alignas(16) CtrlSeg {
  uint32_t opmod_idx_opcode;     // BE32: opmod << 24 | wqe_idx << 8 | opcode
  uint32_t qpn_ds;               // BE32: qpn << 8 | ds
  uint8_t signature;             // 0: WQE signatures are not enabled
  uint8_t stream_channel_id[2];  // BE16 dci_stream_channel_id: 0 on an RC QP
  uint8_t fm_ce_se;
  uint32_t imm;                  // as given (see CtrlFields::imm)
};

struct alignas(16) RaddrSeg {
  uint64_t raddr;  // BE64 remote virtual address
  uint32_t rkey;   // BE32
  uint32_t reserved;
};

struct alignas(16) DataSeg {
  uint32_t byte_count;  // BE32, bit 31 clear
  uint32_t lkey;        // BE32
  uint64_t addr;        // BE64 local virtual address
};

// Remote atomics on 8 bytes. Compare-and-swap uses both words; fetch-and-add puts the
// addend in swap_add, and rdma-core's post path (qp.c, _set_atomic_seg) leaves compare
// unset, so the NIC does not read it; Railyard writes 0 there.
struct alignas(16) AtomicSeg {
  uint64_t swap_add;  // BE64
  uint64_t compare;   // BE64
};

// Inline data: this 4-byte header, then the payload, padded to a 16-byte multiple.
struct InlineHeader {
  uint32_t byte_count;  // BE32: length | kInlineFlag
};

static_assert(sizeof(CtrlSeg) == 16 && offsetof(CtrlSeg, qpn_ds) == 4 && offsetof(CtrlSeg, signature) == 8 &&
              offsetof(CtrlSeg, stream_channel_id) == 9 && offsetof(CtrlSeg, fm_ce_se) == 11 &&
              offsetof(CtrlSeg, imm) == 12);
static_assert(sizeof(RaddrSeg) == 16 && offsetof(RaddrSeg, rkey) == 8 && offsetof(RaddrSeg, reserved) == 12);
static_assert(sizeof(DataSeg) == 16 && offsetof(DataSeg, lkey) == 4 && offsetof(DataSeg, addr) == 8);
static_assert(sizeof(AtomicSeg) == 16 && offsetof(AtomicSeg, compare) == 8);
static_assert(sizeof(InlineHeader) == 4);
inline constexpr uint32_t kInlineHeaderBytes = sizeof(InlineHeader);

// The fields of each segment as native values: what encoders take and decoders give.
struct CtrlFields {
  uint16_t wqe_idx = 0;  // WQEBB index of this WQE, modulo 2^16
  Opcode opcode = Opcode::Nop;
  uint8_t opmod = 0;
  uint32_t qpn = 0;  // 24 bits
  uint8_t ds = 0;    // WQE size in 16-byte units, ctrl included; 6 bits
  uint8_t fm_ce_se = 0;
  // The 4 bytes the NIC sends, stored unchanged: the receiver of a WRITE_IMM reads
  // them from its CQE exactly as written (ibv_send_wr::imm_data is already __be32).
  uint32_t imm = 0;
  bool operator==(const CtrlFields&) const = default;
};

struct RaddrFields {
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  bool operator==(const RaddrFields&) const = default;
};

struct DataFields {
  uint32_t byte_count = 0;
  uint32_t lkey = 0;
  uint64_t addr = 0;
  bool operator==(const DataFields&) const = default;
};

struct AtomicFields {
  uint64_t swap_add = 0;
  uint64_t compare = 0;
  bool operator==(const AtomicFields&) const = default;
};

RAILYARD_HOST_DEVICE constexpr AtomicFields fetch_add_operands(uint64_t add) { return AtomicFields{add, 0}; }

RAILYARD_HOST_DEVICE constexpr AtomicFields compare_swap_operands(uint64_t compare, uint64_t swap) {
  return AtomicFields{swap, compare};
}

// Encoders mask nothing: for every input they give the bytes mlx5dv_set_ctrl_seg and
// mlx5dv_set_data_seg give, out-of-range values included. The valid_* predicates
// below are what keeps a qpn, ds or length from spilling into a neighbouring field.
RAILYARD_HOST_DEVICE constexpr CtrlSeg encode_ctrl(const CtrlFields& f) {
  const uint32_t opmod_idx_opcode = static_cast<uint32_t>(f.opmod) << 24 | static_cast<uint32_t>(f.wqe_idx) << 8 |
                                    static_cast<uint32_t>(f.opcode);
  return CtrlSeg{to_be32(opmod_idx_opcode), to_be32(f.qpn << 8 | f.ds), 0, {0, 0}, f.fm_ce_se, f.imm};
}

RAILYARD_HOST_DEVICE constexpr CtrlFields decode_ctrl(const CtrlSeg& seg) {
  const uint32_t opmod_idx_opcode = from_be32(seg.opmod_idx_opcode);
  const uint32_t qpn_ds = from_be32(seg.qpn_ds);
  return CtrlFields{.wqe_idx = static_cast<uint16_t>(opmod_idx_opcode >> 8),
                    .opcode = static_cast<Opcode>(opmod_idx_opcode & 0xff),
                    .opmod = static_cast<uint8_t>(opmod_idx_opcode >> 24),
                    .qpn = qpn_ds >> 8,
                    .ds = static_cast<uint8_t>(qpn_ds & 0xff),  // all 8 bits: the parser checks 7:6
                    .fm_ce_se = seg.fm_ce_se,
                    .imm = seg.imm};
}

RAILYARD_HOST_DEVICE constexpr RaddrSeg encode_raddr(const RaddrFields& f) {
  return RaddrSeg{to_be64(f.raddr), to_be32(f.rkey), 0};
}

RAILYARD_HOST_DEVICE constexpr RaddrFields decode_raddr(const RaddrSeg& seg) {
  return RaddrFields{from_be64(seg.raddr), from_be32(seg.rkey)};
}

RAILYARD_HOST_DEVICE constexpr DataSeg encode_data(const DataFields& f) {
  return DataSeg{to_be32(f.byte_count), to_be32(f.lkey), to_be64(f.addr)};
}

RAILYARD_HOST_DEVICE constexpr DataFields decode_data(const DataSeg& seg) {
  return DataFields{from_be32(seg.byte_count), from_be32(seg.lkey), from_be64(seg.addr)};
}

RAILYARD_HOST_DEVICE constexpr AtomicSeg encode_atomic(const AtomicFields& f) {
  return AtomicSeg{to_be64(f.swap_add), to_be64(f.compare)};
}

RAILYARD_HOST_DEVICE constexpr AtomicFields decode_atomic(const AtomicSeg& seg) {
  return AtomicFields{from_be64(seg.swap_add), from_be64(seg.compare)};
}

RAILYARD_HOST_DEVICE constexpr InlineHeader encode_inline_header(uint32_t inline_bytes) {
  return InlineHeader{to_be32(inline_bytes | kInlineFlag)};
}

// 16-byte units an inline segment of n payload bytes takes: header and payload,
// rounded up.
RAILYARD_HOST_DEVICE constexpr uint32_t inline_units(uint32_t inline_bytes) {
  return (kInlineHeaderBytes + inline_bytes + kSegmentBytes - 1) / kSegmentBytes;
}

// ---------------------------------------------------------------------------------
// Whole WQEs. An RC QP needs no address-vector segment, so the WQEs Railyard posts are:
//   NOP                ctrl
//   WRITE / WRITE_IMM  ctrl + raddr + data         (WRITE_IMM's imm rides in ctrl)
//   WRITE inline       ctrl + raddr + inline header and payload
//   ATOMIC_FA / CS     ctrl + raddr + atomic + data (the old value lands at data)

inline constexpr uint8_t kNopDs = 1;
inline constexpr uint8_t kWriteDs = 3;
inline constexpr uint8_t kWriteImmDs = kWriteDs;
inline constexpr uint8_t kAtomicDs = 4;
inline constexpr uint32_t kWriteInlinePayloadOffset = 2 * kSegmentBytes + kInlineHeaderBytes;
// The longest inline payload whose WRITE still fits the 6-bit ds.
inline constexpr uint32_t kMaxWriteInlineBytes = (kMaxDs - 2) * kSegmentBytes - kInlineHeaderBytes;

RAILYARD_HOST_DEVICE constexpr bool valid_qpn(uint32_t qpn) { return qpn <= kMaxQpn; }
RAILYARD_HOST_DEVICE constexpr bool valid_ds(uint32_t ds) { return ds >= 1 && ds <= kMaxDs; }
RAILYARD_HOST_DEVICE constexpr bool valid_byte_count(uint32_t byte_count) { return byte_count <= kMaxByteCount; }
RAILYARD_HOST_DEVICE constexpr bool inline_fits(uint32_t inline_bytes) { return inline_bytes <= kMaxWriteInlineBytes; }

// Precondition: inline_fits(inline_bytes).
RAILYARD_HOST_DEVICE constexpr uint8_t write_inline_ds(uint32_t inline_bytes) {
  return static_cast<uint8_t>(2 + inline_units(inline_bytes));
}

RAILYARD_HOST_DEVICE constexpr uint32_t wqebb_count(uint32_t ds) {
  return (ds * kSegmentBytes + kWqeBasicBlockBytes - 1) >> kWqeBasicBlockShift;
}

// Slot of WQEBB number pi in a ring of 2^log2_num_wqebbs WQEBBs, and its byte offset
// from the ring's base.
RAILYARD_HOST_DEVICE constexpr uint32_t wqe_slot(uint32_t pi, uint32_t log2_num_wqebbs) {
  return pi & ((1u << log2_num_wqebbs) - 1);
}

RAILYARD_HOST_DEVICE constexpr uint32_t wqe_byte_offset(uint32_t pi, uint32_t log2_num_wqebbs) {
  return wqe_slot(pi, log2_num_wqebbs) << kWqeBasicBlockShift;
}

// The 8-byte doorbell: exactly the first 8 bytes of a ctrl segment, opmod_idx_opcode
// then qpn_ds. rdma-core's post path (qp.c) writes those of the last WQE it posted to
// the UAR's BlueFlame register with one 64-bit MMIO store; the NIC takes the QPN and
// the WQE index from them, while the send record says how far the ring is filled.
// (GPU initiators ring the same shape with only index and QPN set: encode a CtrlFields
// holding just those.) Returned as the 64-bit word whose little-endian bytes are those
// 8 bytes, so one 8-byte store writes them in order.
RAILYARD_HOST_DEVICE constexpr uint64_t doorbell_value(const CtrlSeg& ctrl) {
  return static_cast<uint64_t>(ctrl.qpn_ds) << 32 | ctrl.opmod_idx_opcode;
}

// ---------------------------------------------------------------------------------
// Completion queue: a power-of-two ring of 64-byte CQEs (struct mlx5_cqe64, and
// struct mlx5_err_cqe for errors, which reuses the timestamp's last two bytes).

struct Cqe {
  uint8_t receive_info[32];  // receive-side fields (wqe_id, slid, flags_rqpn, ...)
  uint32_t srqn_uidx;        // BE32
  uint32_t imm_inval_pkey;   // responder CQE of a WRITE_IMM: imm as the sender gave it
  uint8_t app;
  uint8_t app_op;
  uint16_t app_info;         // BE16
  uint32_t byte_cnt;         // BE32
  uint8_t timestamp[6];      // first 6 bytes of the BE64 timestamp; reserved in an error CQE
  uint8_t vendor_err_synd;   // error CQE; the timestamp's byte 6 otherwise
  uint8_t syndrome;          // error CQE; the timestamp's byte 7 otherwise
  uint32_t sop_drop_qpn;     // BE32: WQE opcode << 24 | QPN (s_wqe_opcode_qpn in an error CQE)
  uint16_t wqe_counter;      // BE16: index of the (last) WQE this CQE completes
  uint8_t signature;
  uint8_t op_own;            // opcode << 4 | format << 2 | se << 1 | owner
};

static_assert(sizeof(Cqe) == 64 && offsetof(Cqe, srqn_uidx) == 32 && offsetof(Cqe, imm_inval_pkey) == 36 &&
              offsetof(Cqe, app_info) == 42 && offsetof(Cqe, byte_cnt) == 44 && offsetof(Cqe, timestamp) == 48 &&
              offsetof(Cqe, vendor_err_synd) == 54 && offsetof(Cqe, syndrome) == 55 &&
              offsetof(Cqe, sop_drop_qpn) == 56 && offsetof(Cqe, wqe_counter) == 60 &&
              offsetof(Cqe, signature) == 62 && offsetof(Cqe, op_own) == 63);

// Every CQE of a new ring: opcode INVALID, so nothing reads as written, and owner 1,
// the opposite of what the NIC writes on its first lap.
inline constexpr uint8_t kCqeInitialOpOwn = static_cast<uint8_t>(static_cast<uint8_t>(CqeOpcode::Invalid) << 4 | 1);

RAILYARD_HOST_DEVICE constexpr CqeOpcode cqe_opcode(uint8_t op_own) { return static_cast<CqeOpcode>(op_own >> 4); }
RAILYARD_HOST_DEVICE constexpr bool cqe_owner(uint8_t op_own) { return (op_own & 1) != 0; }

RAILYARD_HOST_DEVICE constexpr bool cqe_is_error(CqeOpcode opcode) {
  return opcode == CqeOpcode::ReqErr || opcode == CqeOpcode::RespErr;
}

// The owner bit the NIC writes into CQE number n (counted from 0, never wrapped) of a
// ring of ncqe entries: it flips on every lap.
RAILYARD_HOST_DEVICE constexpr bool cqe_owner_for(uint32_t n, uint32_t ncqe) { return (n & ncqe) != 0; }

// Software owns CQE number n when the NIC has written it on the current lap: a valid
// opcode and the lap's owner bit (rdma-core cq.c, get_sw_cqe).
RAILYARD_HOST_DEVICE constexpr bool cqe_owned_by_software(uint8_t op_own, uint32_t n, uint32_t ncqe) {
  return cqe_opcode(op_own) != CqeOpcode::Invalid && cqe_owner(op_own) == cqe_owner_for(n, ncqe);
}

struct CqeFields {
  CqeOpcode opcode = CqeOpcode::Invalid;
  bool owner = false;
  bool solicited = false;
  uint8_t format = 0;  // 0: a full CQE (3 would be a compressed block, never enabled here)
  uint16_t wqe_counter = 0;
  uint32_t qpn = 0;
  // Requester and error CQEs: the opcode of the completed WQE (rdma-core cq.c reads it
  // from the top byte of sop_drop_qpn).
  uint8_t wqe_opcode = 0;
  uint32_t byte_count = 0;
  uint32_t imm = 0;  // as on the wire
  Syndrome syndrome{};  // 0 unless the CQE is an error
  uint8_t vendor_syndrome = 0;
  bool operator==(const CqeFields&) const = default;
};

RAILYARD_HOST_DEVICE constexpr uint8_t encode_op_own(CqeOpcode opcode, bool solicited, uint8_t format, bool owner) {
  return static_cast<uint8_t>(static_cast<uint32_t>(opcode) << 4 | (format & 3u) << 2 |
                              static_cast<uint32_t>(solicited) << 1 | static_cast<uint32_t>(owner));
}

// What the NIC writes: a requester CQE (opcode Req, wqe_counter, qpn, wqe_opcode) or an
// error CQE (ReqErr with syndrome and vendor syndrome); every other byte zero.
RAILYARD_HOST_DEVICE constexpr Cqe encode_cqe(const CqeFields& f) {
  Cqe cqe{};
  cqe.imm_inval_pkey = f.imm;
  cqe.byte_cnt = to_be32(f.byte_count);
  cqe.vendor_err_synd = f.vendor_syndrome;
  cqe.syndrome = static_cast<uint8_t>(f.syndrome);
  cqe.sop_drop_qpn = to_be32(static_cast<uint32_t>(f.wqe_opcode) << 24 | (f.qpn & kMaxQpn));
  cqe.wqe_counter = to_be16(f.wqe_counter);
  cqe.op_own = encode_op_own(f.opcode, f.solicited, f.format, f.owner);
  return cqe;
}

// Bytes 54 and 55 read as syndromes only in an error CQE; elsewhere they are part of
// the timestamp and decode as 0.
RAILYARD_HOST_DEVICE constexpr CqeFields decode_cqe(const Cqe& cqe) {
  const CqeOpcode opcode = cqe_opcode(cqe.op_own);
  const bool error = cqe_is_error(opcode);
  const uint32_t sop_drop_qpn = from_be32(cqe.sop_drop_qpn);
  return CqeFields{.opcode = opcode,
                   .owner = cqe_owner(cqe.op_own),
                   .solicited = ((cqe.op_own >> 1) & 1) != 0,
                   .format = static_cast<uint8_t>((cqe.op_own >> 2) & 3),
                   .wqe_counter = from_be16(cqe.wqe_counter),
                   .qpn = sop_drop_qpn & kMaxQpn,
                   .wqe_opcode = static_cast<uint8_t>(sop_drop_qpn >> 24),
                   .byte_count = from_be32(cqe.byte_cnt),
                   .imm = cqe.imm_inval_pkey,
                   .syndrome = error ? static_cast<Syndrome>(cqe.syndrome) : Syndrome{},
                   .vendor_syndrome = error ? cqe.vendor_err_synd : uint8_t{0}};
}

// ---------------------------------------------------------------------------------
// WQE parser: what the simulated NIC (and a fuzzer) reads from a send queue. It takes
// the WQE's bytes in order (a WQE that wraps the ring is gathered first) and checks
// them against the shapes above, so a malformed WQE is named, not executed.

enum class WqeError : uint8_t {
  None,
  Truncated,            // fewer bytes than the ctrl segment, or than ds says
  UnsupportedOpcode,    // not one of Opcode
  OpmodNonZero,         // no Railyard opcode uses an opcode modifier
  SignatureNonZero,     // WQE signatures are not enabled
  ReservedNonZero,      // ds bits 7:6, stream channel id, fm_ce_se bits 4 and 0, raddr reserved
  InvalidFenceMode,     // fm above FenceAndInitiatorSmall
  DsMismatch,           // ds differs from what the opcode's segments need
  DataByteCountInline,  // a data segment's byte_count has bit 31 (inline) set
  InlineExceedsDs,      // the inline length needs more 16-byte units than ds leaves
  AtomicLengthNot8,     // the atomic's data segment is not 8 bytes
};

RAILYARD_HOST_DEVICE constexpr const char* wqe_error_name(WqeError error) {
  switch (error) {
    case WqeError::None: return "none";
    case WqeError::Truncated: return "truncated WQE";
    case WqeError::UnsupportedOpcode: return "unsupported opcode";
    case WqeError::OpmodNonZero: return "opcode modifier not zero";
    case WqeError::SignatureNonZero: return "signature not zero";
    case WqeError::ReservedNonZero: return "reserved bits not zero";
    case WqeError::InvalidFenceMode: return "invalid fence mode";
    case WqeError::DsMismatch: return "ds inconsistent with the opcode";
    case WqeError::DataByteCountInline: return "data segment byte_count has the inline bit";
    case WqeError::InlineExceedsDs: return "inline length does not fit ds";
    case WqeError::AtomicLengthNot8: return "atomic data segment is not 8 bytes";
  }
  return "unknown";
}

struct ParsedWqe {
  CtrlFields ctrl;
  RaddrFields remote;   // WRITE, WRITE_IMM, atomics
  DataFields local;     // WRITE with a data segment; atomics (where the old value lands)
  AtomicFields atomic;  // atomics
  bool is_inline = false;
  uint32_t inline_bytes = 0;
  uint32_t inline_offset = 0;  // of the payload, from the WQE's first byte
  bool operator==(const ParsedWqe&) const = default;
};

struct WqeParse {
  WqeError error = WqeError::None;
  ParsedWqe wqe;
};

namespace detail {

// memcpy: the WQE bytes may sit at any alignment (a fuzzer's buffer, a gathered copy).
template <class Seg>
RAILYARD_HOST_DEVICE Seg load_seg(const uint8_t* bytes) {
  Seg seg;
  memcpy(&seg, bytes, sizeof(seg));
  return seg;
}

RAILYARD_HOST_DEVICE constexpr bool supported_opcode(Opcode opcode) {
  return opcode == Opcode::Nop || opcode == Opcode::RdmaWrite || opcode == Opcode::RdmaWriteImm ||
         opcode == Opcode::AtomicCs || opcode == Opcode::AtomicFa;
}

RAILYARD_HOST_DEVICE constexpr WqeError check_ctrl(const CtrlSeg& seg, const CtrlFields& f) {
  if (!supported_opcode(f.opcode)) return WqeError::UnsupportedOpcode;
  if (f.opmod != 0) return WqeError::OpmodNonZero;
  if (seg.signature != 0) return WqeError::SignatureNonZero;
  if (f.ds > kMaxDs || seg.stream_channel_id[0] != 0 || seg.stream_channel_id[1] != 0 ||
      (f.fm_ce_se & kCtrlUnassignedBits) != 0) {
    return WqeError::ReservedNonZero;
  }
  if ((f.fm_ce_se >> kCtrlFenceShift) > kMaxFenceMode) return WqeError::InvalidFenceMode;
  return WqeError::None;
}

RAILYARD_HOST_DEVICE WqeError parse_raddr(const uint8_t* wqe, ParsedWqe& out) {
  const RaddrSeg seg = load_seg<RaddrSeg>(wqe + kSegmentBytes);
  if (seg.reserved != 0) return WqeError::ReservedNonZero;
  out.remote = decode_raddr(seg);
  return WqeError::None;
}

// The segment after raddr is a data segment or, with bit 31 of its first word set,
// an inline header (the NIC tells them apart the same way).
RAILYARD_HOST_DEVICE WqeError parse_write(const uint8_t* wqe, ParsedWqe& out) {
  const uint8_t ds = out.ctrl.ds;
  if (ds < kWriteDs) return WqeError::DsMismatch;
  if (const WqeError error = parse_raddr(wqe, out); error != WqeError::None) return error;
  const uint32_t byte_count = from_be32(load_seg<InlineHeader>(wqe + 2 * kSegmentBytes).byte_count);
  if ((byte_count & kInlineFlag) == 0) {
    if (ds != kWriteDs) return WqeError::DsMismatch;
    out.local = decode_data(load_seg<DataSeg>(wqe + 2 * kSegmentBytes));
    return WqeError::None;
  }
  const uint32_t inline_bytes = byte_count & ~kInlineFlag;
  if (inline_units(inline_bytes) > ds - 2u) return WqeError::InlineExceedsDs;
  if (ds != write_inline_ds(inline_bytes)) return WqeError::DsMismatch;
  out.is_inline = true;
  out.inline_bytes = inline_bytes;
  out.inline_offset = kWriteInlinePayloadOffset;
  return WqeError::None;
}

RAILYARD_HOST_DEVICE WqeError parse_atomic(const uint8_t* wqe, ParsedWqe& out) {
  if (out.ctrl.ds != kAtomicDs) return WqeError::DsMismatch;
  if (const WqeError error = parse_raddr(wqe, out); error != WqeError::None) return error;
  out.atomic = decode_atomic(load_seg<AtomicSeg>(wqe + 2 * kSegmentBytes));
  out.local = decode_data(load_seg<DataSeg>(wqe + 3 * kSegmentBytes));
  if ((out.local.byte_count & kInlineFlag) != 0) return WqeError::DataByteCountInline;
  if (out.local.byte_count != sizeof(uint64_t)) return WqeError::AtomicLengthNot8;
  return WqeError::None;
}

}  // namespace detail

// Parses the WQE at `wqe` (num_bytes readable). On an error, `wqe` of the result holds
// what was decoded before it.
RAILYARD_HOST_DEVICE WqeParse parse_wqe(const uint8_t* wqe, uint32_t num_bytes) {
  WqeParse result;
  if (num_bytes < sizeof(CtrlSeg)) return WqeParse{WqeError::Truncated, {}};
  const CtrlSeg ctrl = detail::load_seg<CtrlSeg>(wqe);
  ParsedWqe& out = result.wqe;
  out.ctrl = decode_ctrl(ctrl);
  result.error = detail::check_ctrl(ctrl, out.ctrl);
  if (result.error != WqeError::None) return result;
  if (out.ctrl.ds * kSegmentBytes > num_bytes) {
    result.error = WqeError::Truncated;
  } else if (out.ctrl.opcode == Opcode::Nop) {
    result.error = out.ctrl.ds == kNopDs ? WqeError::None : WqeError::DsMismatch;
  } else if (out.ctrl.opcode == Opcode::RdmaWrite || out.ctrl.opcode == Opcode::RdmaWriteImm) {
    result.error = detail::parse_write(wqe, out);
  } else {
    result.error = detail::parse_atomic(wqe, out);
  }
  return result;
}

}  // namespace railyard::transport::mlx5
