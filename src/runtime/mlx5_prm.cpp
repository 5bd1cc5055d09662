// Railyard runtime: mlx5 PRM commands (src/runtime/mlx5_prm.hpp).
#include "src/runtime/mlx5_prm.hpp"

#include <cstdio>
#include <stdexcept>
#include <string>

#include "railyard/transport/mlx5/wire.cuh"

namespace railyard::runtime::rdma::prm {
namespace {

using namespace fields;

std::string describe(Field f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "field at bit 0x%x (%u bits)", f.bit, f.width);
  return buf;
}

void check_in(const std::vector<uint8_t>& bytes, Field f) {
  if (f.width == 0 || (f.bit + f.width + 7) / 8 > bytes.size())
    throw std::invalid_argument("mlx5 PRM: " + describe(f) + " lies outside its " + std::to_string(bytes.size()) +
                                "-byte mailbox");
}

bool is_power_of_two(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }
std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
uint32_t log2_of(std::size_t n) {
  uint32_t log = 0;
  while ((std::size_t{1} << log) < n) ++log;
  return log;
}

Mailbox command(uint32_t opcode) {
  Mailbox m(kCommandInBytes);
  m.set(fields::opcode, opcode);
  return m;
}

Mailbox modify(uint32_t opcode, uint32_t qpn) {
  Mailbox m = command(opcode);
  m.set(modify_qpn, qpn);
  return m;
}

Field in_qpc(Field f) { return at(kQpc, f); }
Field in_path(Field f) { return at(kQpc + qpc::kPrimaryPath, f); }
Field in_cqc(Field f) { return at(kCqContext, f); }

}  // namespace

void Mailbox::set(Field f, uint64_t value) {
  check_in(bytes_, f);
  if (f.width > 64 || (f.width < 64 && (value >> f.width) != 0))
    throw std::invalid_argument("mlx5 PRM: value " + std::to_string(value) + " does not fit the " + describe(f) +
                                "; expected below 2^" + std::to_string(f.width));
  for (uint32_t i = 0; i < f.width; ++i) {
    const uint32_t p = f.bit + i;
    const auto mask = static_cast<uint8_t>(0x80u >> (p % 8));
    if ((value >> (f.width - 1 - i)) & 1)
      bytes_[p / 8] = static_cast<uint8_t>(bytes_[p / 8] | mask);
    else
      bytes_[p / 8] = static_cast<uint8_t>(bytes_[p / 8] & ~mask);
  }
}

void Mailbox::set_bytes(Field f, std::span<const uint8_t> value) {
  check_in(bytes_, f);
  if (f.bit % 8 != 0 || f.width != 8 * value.size())
    throw std::invalid_argument("mlx5 PRM: " + std::to_string(value.size()) + " bytes do not fill the " + describe(f));
  for (std::size_t i = 0; i < value.size(); ++i) bytes_[f.bit / 8 + i] = value[i];
}

uint64_t Mailbox::get(Field f) const {
  check_in(bytes_, f);
  if (f.width > 64) throw std::invalid_argument("mlx5 PRM: get: the " + describe(f) + " is wider than 64 bits");
  uint64_t value = 0;
  for (uint32_t i = 0; i < f.width; ++i) {
    const uint32_t p = f.bit + i;
    value = value << 1 | ((bytes_[p / 8] >> (7 - p % 8)) & 1u);
  }
  return value;
}

std::span<const NamedField> fields_in_use() {
  static const NamedField table[] = {
      {"create_cq_in.opcode", opcode},
      {"create_cq_in.cq_context.dbr_umem_valid", in_cqc(cqc::dbr_umem_valid)},
      {"create_cq_in.cq_context.cqe_sz", in_cqc(cqc::cqe_sz)},
      {"create_cq_in.cq_context.dbr_umem_id", in_cqc(cqc::dbr_umem_id)},
      {"create_cq_in.cq_context.log_cq_size", in_cqc(cqc::log_cq_size)},
      {"create_cq_in.cq_context.uar_page", in_cqc(cqc::uar_page)},
      {"create_cq_in.cq_context.c_eqn_or_apu_element", in_cqc(cqc::c_eqn)},
      {"create_cq_in.cq_context.log_page_size", in_cqc(cqc::log_page_size)},
      {"create_cq_in.cq_context.dbr_addr", in_cqc(cqc::dbr_addr)},
      {"create_cq_in.cq_umem_offset", cq_umem_offset},
      {"create_cq_in.cq_umem_id", cq_umem_id},
      {"create_cq_in.cq_umem_valid", cq_umem_valid},
      {"create_cq_out.status", out_status},
      {"create_cq_out.syndrome", out_syndrome},
      {"create_cq_out.cqn", out_object},
      {"create_qp_in.opcode", opcode},
      {"create_qp_in.qpc.st", in_qpc(qpc::st)},
      {"create_qp_in.qpc.pm_state", in_qpc(qpc::pm_state)},
      {"create_qp_in.qpc.pd", in_qpc(qpc::pd)},
      {"create_qp_in.qpc.log_sq_size", in_qpc(qpc::log_sq_size)},
      {"create_qp_in.qpc.uar_page", in_qpc(qpc::uar_page)},
      {"create_qp_in.qpc.log_page_size", in_qpc(qpc::log_page_size)},
      {"create_qp_in.qpc.cqn_snd", in_qpc(qpc::cqn_snd)},
      {"create_qp_in.qpc.cqn_rcv", in_qpc(qpc::cqn_rcv)},
      {"create_qp_in.qpc.dbr_addr", in_qpc(qpc::dbr_addr)},
      {"create_qp_in.qpc.rq_type", in_qpc(qpc::rq_type)},
      {"create_qp_in.qpc.dbr_umem_valid", in_qpc(qpc::dbr_umem_valid)},
      {"create_qp_in.qpc.dbr_umem_id", in_qpc(qpc::dbr_umem_id)},
      {"create_qp_in.wq_umem_offset", wq_umem_offset},
      {"create_qp_in.wq_umem_id", wq_umem_id},
      {"create_qp_in.wq_umem_valid", wq_umem_valid},
      {"create_qp_out.status", out_status},
      {"create_qp_out.syndrome", out_syndrome},
      {"create_qp_out.qpn", out_object},
      {"rst2init_qp_in.opcode", opcode},
      {"rst2init_qp_in.qpn", modify_qpn},
      {"rst2init_qp_in.qpc.pm_state", in_qpc(qpc::pm_state)},
      {"rst2init_qp_in.qpc.atomic_mode", in_qpc(qpc::atomic_mode)},
      {"rst2init_qp_in.qpc.rre", in_qpc(qpc::rre)},
      {"rst2init_qp_in.qpc.rwe", in_qpc(qpc::rwe)},
      {"rst2init_qp_in.qpc.rae", in_qpc(qpc::rae)},
      {"rst2init_qp_in.qpc.primary_address_path.pkey_index", in_path(ads::pkey_index)},
      {"rst2init_qp_in.qpc.primary_address_path.vhca_port_num", in_path(ads::vhca_port_num)},
      {"rst2init_qp_out.status", out_status},
      {"rst2init_qp_out.syndrome", out_syndrome},
      {"init2rtr_qp_in.opcode", opcode},
      {"init2rtr_qp_in.qpn", modify_qpn},
      {"init2rtr_qp_in.qpc.mtu", in_qpc(qpc::mtu)},
      {"init2rtr_qp_in.qpc.log_msg_max", in_qpc(qpc::log_msg_max)},
      {"init2rtr_qp_in.qpc.remote_qpn", in_qpc(qpc::remote_qpn)},
      {"init2rtr_qp_in.qpc.log_rra_max", in_qpc(qpc::log_rra_max)},
      {"init2rtr_qp_in.qpc.min_rnr_nak", in_qpc(qpc::min_rnr_nak)},
      {"init2rtr_qp_in.qpc.next_rcv_psn", in_qpc(qpc::next_rcv_psn)},
      {"init2rtr_qp_in.qpc.primary_address_path.grh", in_path(ads::grh)},
      {"init2rtr_qp_in.qpc.primary_address_path.rlid", in_path(ads::rlid)},
      {"init2rtr_qp_in.qpc.primary_address_path.src_addr_index", in_path(ads::src_addr_index)},
      {"init2rtr_qp_in.qpc.primary_address_path.hop_limit", in_path(ads::hop_limit)},
      {"init2rtr_qp_in.qpc.primary_address_path.tclass", in_path(ads::tclass)},
      {"init2rtr_qp_in.qpc.primary_address_path.rgid_rip", in_path(ads::rgid_rip)},
      {"init2rtr_qp_in.qpc.primary_address_path.udp_sport", in_path(ads::udp_sport)},
      {"init2rtr_qp_in.qpc.primary_address_path.eth_prio", in_path(ads::eth_prio)},
      {"init2rtr_qp_in.qpc.primary_address_path.sl", in_path(ads::sl)},
      {"init2rtr_qp_in.qpc.primary_address_path.vhca_port_num", in_path(ads::vhca_port_num)},
      {"init2rtr_qp_in.qpc.primary_address_path.rmac_47_32", in_path(ads::rmac_47_32)},
      {"init2rtr_qp_in.qpc.primary_address_path.rmac_31_0", in_path(ads::rmac_31_0)},
      {"init2rtr_qp_out.status", out_status},
      {"init2rtr_qp_out.syndrome", out_syndrome},
      {"rtr2rts_qp_in.opcode", opcode},
      {"rtr2rts_qp_in.qpn", modify_qpn},
      {"rtr2rts_qp_in.qpc.log_sra_max", in_qpc(qpc::log_sra_max)},
      {"rtr2rts_qp_in.qpc.retry_count", in_qpc(qpc::retry_count)},
      {"rtr2rts_qp_in.qpc.rnr_retry", in_qpc(qpc::rnr_retry)},
      {"rtr2rts_qp_in.qpc.next_send_psn", in_qpc(qpc::next_send_psn)},
      {"rtr2rts_qp_in.qpc.primary_address_path.ack_timeout", in_path(ads::ack_timeout)},
      {"rtr2rts_qp_out.status", out_status},
      {"rtr2rts_qp_out.syndrome", out_syndrome},
  };
  return table;
}

QueueLayout queue_layout(uint32_t log2_sq_wqebbs, uint32_t log2_ncqe, std::size_t page_bytes) {
  if (!is_power_of_two(page_bytes) || page_bytes < 4096)
    throw std::invalid_argument("mlx5 PRM: queue_layout: page size " + std::to_string(page_bytes) +
                                "; expected a power of two >= 4096");
  constexpr std::size_t kDoorbellRecordBytes = 64;  // a cache line each
  QueueLayout l;
  l.page_bytes = page_bytes;
  l.log_page_size = log2_of(page_bytes) - 12;
  l.sq_offset = 0;
  l.sq_bytes = std::size_t{transport::mlx5::kWqeBasicBlockBytes} << log2_sq_wqebbs;
  l.cq_offset = round_up(l.sq_offset + l.sq_bytes, page_bytes);
  l.cq_bytes = sizeof(transport::mlx5::Cqe) << log2_ncqe;
  l.qp_dbr_offset = round_up(l.cq_offset + l.cq_bytes, page_bytes);
  l.cq_dbr_offset = l.qp_dbr_offset + kDoorbellRecordBytes;
  l.total_bytes = l.qp_dbr_offset + page_bytes;
  return l;
}

Mailbox create_cq(const CqParams& p) {
  Mailbox m = command(kOpCreateCq);
  m.set(in_cqc(cqc::cqe_sz), kCqeSize64);
  m.set(in_cqc(cqc::log_cq_size), p.log_ncqe);
  m.set(in_cqc(cqc::uar_page), p.uar_page);
  m.set(in_cqc(cqc::c_eqn), p.eqn);
  m.set(in_cqc(cqc::log_page_size), p.layout.log_page_size);
  m.set(in_cqc(cqc::dbr_umem_valid), 1);
  m.set(in_cqc(cqc::dbr_umem_id), p.umem_id);
  m.set(in_cqc(cqc::dbr_addr), p.layout.cq_dbr_offset);
  m.set(cq_umem_valid, 1);
  m.set(cq_umem_id, p.umem_id);
  m.set(cq_umem_offset, p.layout.cq_offset);
  return m;
}

Mailbox create_qp(const QpParams& p) {
  Mailbox m = command(kOpCreateQp);
  m.set(in_qpc(qpc::st), kQpcStRc);
  m.set(in_qpc(qpc::pm_state), kQpcPmStateMigrated);
  m.set(in_qpc(qpc::pd), p.pd);
  m.set(in_qpc(qpc::uar_page), p.uar_page);
  m.set(in_qpc(qpc::log_sq_size), p.log_sq_wqebbs);
  m.set(in_qpc(qpc::log_page_size), p.layout.log_page_size);
  m.set(in_qpc(qpc::rq_type), kRqTypeZeroLength);
  m.set(in_qpc(qpc::cqn_snd), p.cqn);
  m.set(in_qpc(qpc::cqn_rcv), p.cqn);
  m.set(in_qpc(qpc::dbr_umem_valid), 1);
  m.set(in_qpc(qpc::dbr_umem_id), p.umem_id);
  m.set(in_qpc(qpc::dbr_addr), p.layout.qp_dbr_offset);
  m.set(wq_umem_valid, 1);
  m.set(wq_umem_id, p.umem_id);
  m.set(wq_umem_offset, p.layout.sq_offset);
  return m;
}

Mailbox rst2init(uint32_t qpn, uint32_t port) {
  Mailbox m = modify(kOpRst2InitQp, qpn);
  m.set(in_qpc(qpc::pm_state), kQpcPmStateMigrated);
  m.set(in_qpc(qpc::rre), 1);
  m.set(in_qpc(qpc::rwe), 1);
  m.set(in_qpc(qpc::rae), 1);
  m.set(in_qpc(qpc::atomic_mode), kQpcAtomicModeIbSpec);
  m.set(in_path(ads::vhca_port_num), port);
  m.set(in_path(ads::pkey_index), 0);
  return m;
}

Mailbox init2rtr(const RtrParams& p) {
  Mailbox m = modify(kOpInit2RtrQp, p.qpn);
  m.set(in_qpc(qpc::mtu), p.mtu);
  m.set(in_qpc(qpc::log_msg_max), p.log_msg_max);
  m.set(in_qpc(qpc::remote_qpn), p.remote_qpn);
  m.set(in_qpc(qpc::next_rcv_psn), p.rq_psn);
  m.set(in_qpc(qpc::log_rra_max), p.log_rra_max);
  m.set(in_qpc(qpc::min_rnr_nak), p.min_rnr_nak);
  const AddressPath& a = p.path;
  m.set(in_path(ads::vhca_port_num), a.port);
  if (a.global) {
    m.set(in_path(ads::grh), 1);
    m.set_bytes(in_path(ads::rgid_rip), a.rgid);
    m.set(in_path(ads::rmac_47_32), uint64_t{a.rmac[0]} << 8 | a.rmac[1]);
    m.set(in_path(ads::rmac_31_0),
          uint64_t{a.rmac[2]} << 24 | uint64_t{a.rmac[3]} << 16 | uint64_t{a.rmac[4]} << 8 | a.rmac[5]);
    m.set(in_path(ads::src_addr_index), a.src_addr_index);
    m.set(in_path(ads::hop_limit), a.hop_limit);
    m.set(in_path(ads::tclass), a.tclass);
    m.set(in_path(ads::udp_sport), a.udp_sport);
    m.set(in_path(ads::eth_prio), a.sl);  // refused above 7
  } else {
    m.set(in_path(ads::rlid), a.rlid);
    m.set(in_path(ads::sl), a.sl);
  }
  return m;
}

Mailbox rtr2rts(const RtsParams& p) {
  Mailbox m = modify(kOpRtr2RtsQp, p.qpn);
  m.set(in_qpc(qpc::next_send_psn), p.sq_psn);
  m.set(in_qpc(qpc::log_sra_max), p.log_sra_max);
  m.set(in_qpc(qpc::retry_count), p.retry_count);
  m.set(in_qpc(qpc::rnr_retry), p.rnr_retry);
  m.set(in_path(ads::ack_timeout), p.ack_timeout);
  return m;
}

uint32_t mtu_code(uint32_t mtu_bytes) {
  uint32_t code = 1;  // 256
  while (code < 5 && (256u << code) <= mtu_bytes) ++code;
  return code;
}

}  // namespace railyard::runtime::rdma::prm
