// Railyard runtime: the mlx5 firmware commands that create a queue pair whose queues
// live in memory Railyard chose (GPU memory, through DEVX user memory), and move it
// RESET -> INIT -> RTR -> RTS.
//
// The commands are the ConnectX Programmer's Reference Manual (PRM) layouts: big-endian
// mailboxes whose fields sit at bit offsets counted from the first byte's most
// significant bit. rdma-core passes them to the firmware unchanged
// (mlx5dv_devx_obj_create / mlx5dv_devx_obj_modify); src/runtime/rdma_mlx5.cpp is the
// one caller. Nothing here depends on rdma-core, so the layouts are tested everywhere:
// tests/transport/mlx5_prm_test.cpp compares every field below with the Linux kernel's
// include/linux/mlx5/mlx5_ifc.h (the independent reference), and the fields DEVX adds
// (umem ids and offsets, which the kernel never fills and leaves reserved) with the
// reserved bits they occupy there.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace railyard::runtime::rdma::prm {

// A field: `width` bits from bit `bit` of its mailbox.
struct Field {
  uint32_t bit = 0;
  uint32_t width = 0;
};
constexpr Field at(uint32_t base, Field f) { return {base + f.bit, f.width}; }

// One named field of a command, for the layout test and for error messages.
struct NamedField {
  std::string_view path;  // mlx5_ifc.h's struct and member path, e.g. "create_cq_in.cq_context.log_cq_size"
  Field field;
};

inline constexpr uint32_t kOpCreateCq = 0x400;
inline constexpr uint32_t kOpCreateQp = 0x500;
inline constexpr uint32_t kOpRst2InitQp = 0x502;
inline constexpr uint32_t kOpInit2RtrQp = 0x503;
inline constexpr uint32_t kOpRtr2RtsQp = 0x504;

inline constexpr uint32_t kQpcStRc = 0x0;
inline constexpr uint32_t kQpcPmStateMigrated = 0x3;
inline constexpr uint32_t kQpcAtomicModeIbSpec = 0x1;  // 8-byte atomics as the IB specification has them
inline constexpr uint32_t kRqTypeZeroLength = 0x3;     // no receive queue (include/linux/mlx5/qp.h)
inline constexpr uint32_t kCqeSize64 = 0x0;

// Every command in and out mailbox has these sizes (in bytes): the inputs end with
// reserved space and no page list (the queues are user memory), the outputs are the
// status, the syndrome and one word.
inline constexpr std::size_t kCommandInBytes = 0x880 / 8;
inline constexpr std::size_t kCommandOutBytes = 0x80 / 8;

// The fields Railyard sets or reads, by mlx5_ifc.h path (fields_in_use() lists them).
namespace fields {
inline constexpr Field opcode{0x0, 16};
inline constexpr Field out_status{0x0, 8};
inline constexpr Field out_syndrome{0x20, 32};
inline constexpr Field out_object{0x48, 24};  // create_cq_out.cqn, create_qp_out.qpn
inline constexpr Field modify_qpn{0x48, 24};  // rst2init_qp_in.qpn and its two successors

inline constexpr uint32_t kCqContext = 0x80;  // create_cq_in.cq_context
namespace cqc {
inline constexpr Field dbr_umem_valid{0x06, 1};
inline constexpr Field cqe_sz{0x08, 3};
inline constexpr Field dbr_umem_id{0x20, 32};  // DEVX
inline constexpr Field log_cq_size{0x63, 5};
inline constexpr Field uar_page{0x68, 24};
inline constexpr Field c_eqn{0xa0, 32};
inline constexpr Field log_page_size{0xc3, 5};
inline constexpr Field dbr_addr{0x1c0, 64};
}  // namespace cqc
inline constexpr Field cq_umem_offset{0x280, 64};  // DEVX
inline constexpr Field cq_umem_id{0x2c0, 32};      // DEVX
inline constexpr Field cq_umem_valid{0x2e0, 1};

inline constexpr uint32_t kQpc = 0xc0;  // create_qp_in.qpc, and the modify commands'
namespace qpc {
inline constexpr Field st{0x08, 8};
inline constexpr Field pm_state{0x13, 2};
inline constexpr Field pd{0x28, 24};
inline constexpr Field mtu{0x40, 3};
inline constexpr Field log_msg_max{0x43, 5};
inline constexpr Field log_sq_size{0x51, 4};
inline constexpr Field uar_page{0x68, 24};
inline constexpr Field log_page_size{0xa3, 5};
inline constexpr Field remote_qpn{0xa8, 24};
inline constexpr uint32_t kPrimaryPath = 0xc0;
inline constexpr Field log_sra_max{0x388, 3};
inline constexpr Field retry_count{0x38d, 3};
inline constexpr Field rnr_retry{0x390, 3};
inline constexpr Field next_send_psn{0x3c8, 24};
inline constexpr Field cqn_snd{0x3e8, 24};
inline constexpr Field log_rra_max{0x488, 3};
inline constexpr Field atomic_mode{0x48c, 4};
inline constexpr Field rre{0x490, 1};
inline constexpr Field rwe{0x491, 1};
inline constexpr Field rae{0x492, 1};
inline constexpr Field min_rnr_nak{0x4a3, 5};
inline constexpr Field next_rcv_psn{0x4a8, 24};
inline constexpr Field cqn_rcv{0x4e8, 24};
inline constexpr Field dbr_addr{0x500, 64};
inline constexpr Field rq_type{0x565, 3};
inline constexpr Field dbr_umem_valid{0x683, 1};
inline constexpr Field dbr_umem_id{0x720, 32};  // DEVX
}  // namespace qpc
namespace ads {  // an address path (qpc.primary_address_path)
inline constexpr Field pkey_index{0x10, 16};
inline constexpr Field grh{0x28, 1};
inline constexpr Field rlid{0x30, 16};
inline constexpr Field ack_timeout{0x40, 5};
inline constexpr Field src_addr_index{0x48, 8};
inline constexpr Field hop_limit{0x58, 8};
inline constexpr Field tclass{0x64, 8};
inline constexpr Field rgid_rip{0x80, 128};
inline constexpr Field udp_sport{0x110, 16};
inline constexpr Field eth_prio{0x121, 3};
inline constexpr Field sl{0x124, 4};
inline constexpr Field vhca_port_num{0x128, 8};
inline constexpr Field rmac_47_32{0x130, 16};
inline constexpr Field rmac_31_0{0x140, 32};
}  // namespace ads
inline constexpr Field wq_umem_offset{0x800, 64};
inline constexpr Field wq_umem_id{0x840, 32};
inline constexpr Field wq_umem_valid{0x860, 1};
}  // namespace fields

// Every field above at its place in each command that uses it.
std::span<const NamedField> fields_in_use();

// A command mailbox. set() refuses a value wider than its field (std::invalid_argument
// naming the field's offset, width and value): nothing is truncated.
class Mailbox {
 public:
  explicit Mailbox(std::size_t bytes) : bytes_(bytes, 0) {}
  void set(Field f, uint64_t value);
  void set_bytes(Field f, std::span<const uint8_t> value);  // width == 8 * value.size()
  uint64_t get(Field f) const;
  std::vector<uint8_t>& bytes() { return bytes_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Where a queue pair's queues lie in its one user-memory region (umem): the send queue,
// then the completion queue, then a page holding the two doorbell records, each queue
// starting on a page.
struct QueueLayout {
  std::size_t page_bytes = 0;
  std::size_t sq_offset = 0, sq_bytes = 0;
  std::size_t cq_offset = 0, cq_bytes = 0;
  std::size_t qp_dbr_offset = 0, cq_dbr_offset = 0;
  std::size_t total_bytes = 0;
  uint32_t log_page_size = 0;  // PRM: log2(page_bytes) - 12
};
// std::invalid_argument unless page_bytes is a power of two >= 4096.
QueueLayout queue_layout(uint32_t log2_sq_wqebbs, uint32_t log2_ncqe, std::size_t page_bytes);

struct CqParams {
  uint32_t log_ncqe = 0;
  uint32_t uar_page = 0;
  uint32_t eqn = 0;
  uint32_t umem_id = 0;
  QueueLayout layout;
};
Mailbox create_cq(const CqParams& p);

struct QpParams {
  uint32_t pd = 0;
  uint32_t uar_page = 0;
  uint32_t log_sq_wqebbs = 0;
  uint32_t cqn = 0;  // sends and (absent) receives complete there
  uint32_t umem_id = 0;
  QueueLayout layout;
};
Mailbox create_qp(const QpParams& p);

// RESET -> INIT: port `port`, partition key index 0, remote reads, writes and 8-byte
// atomics allowed.
Mailbox rst2init(uint32_t qpn, uint32_t port);

// The remote end's address: InfiniBand by LID, RoCE v2 by GID and next-hop MAC.
struct AddressPath {
  uint32_t port = 1;
  bool global = false;  // RoCE: GRH with rgid, rmac, src_addr_index, hop_limit, tclass, udp_sport
  uint16_t rlid = 0;
  uint8_t sl = 0;  // InfiniBand service level; Ethernet priority on RoCE
  std::array<uint8_t, 16> rgid{};
  std::array<uint8_t, 6> rmac{};
  uint8_t src_addr_index = 0;
  uint8_t hop_limit = 0;
  uint8_t tclass = 0;
  uint16_t udp_sport = 0;
};
struct RtrParams {
  uint32_t qpn = 0;
  uint32_t mtu = 0;  // PRM code: 1 = 256 B .. 5 = 4096 B
  uint32_t remote_qpn = 0;
  uint32_t rq_psn = 0;
  uint32_t log_rra_max = 0;  // responder: 2^n outstanding reads/atomics
  uint32_t min_rnr_nak = 0;
  uint32_t log_msg_max = 30;
  AddressPath path;
};
Mailbox init2rtr(const RtrParams& p);

struct RtsParams {
  uint32_t qpn = 0;
  uint32_t sq_psn = 0;
  uint32_t log_sra_max = 0;  // requester: 2^n outstanding reads/atomics
  uint32_t retry_count = 0;
  uint32_t rnr_retry = 0;
  uint32_t ack_timeout = 0;  // 4.096 us x 2^n
};
Mailbox rtr2rts(const RtsParams& p);

// PRM MTU code of an MTU in bytes (the largest of 256..4096 not above it).
uint32_t mtu_code(uint32_t mtu_bytes);

}  // namespace railyard::runtime::rdma::prm
