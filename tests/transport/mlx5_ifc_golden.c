/* The kernel's layouts of the mlx5 commands src/runtime/mlx5_prm.hpp builds: every
 * field it sets or reads, the reserved bits that hold the fields only DEVX uses (the
 * kernel never fills umem ids), the structs' sizes and the constants' values. */
#include <stddef.h>
#include <stdint.h>

typedef uint8_t u8; /* the kernel's type: one byte stands for one bit */
#define BIT(n) (1UL << (n))
#define BIT_ULL(n) (1ULL << (n))
#define DECLARE_FLEX_ARRAY(TYPE, NAME) \
  struct {                             \
    struct {                           \
    } __empty_##NAME;                  \
    TYPE NAME[];                       \
  }
#include <linux/mlx5/mlx5_ifc.h>

#include "mlx5_ifc_golden.h"

#define FIELD(typ, path)                                                   \
  {                                                                        \
    #typ "." #path, offsetof(struct mlx5_ifc_##typ##_bits, path),          \
        sizeof(((struct mlx5_ifc_##typ##_bits*)0)->path)                   \
  }
#define SIZE(typ) {#typ, 0, sizeof(struct mlx5_ifc_##typ##_bits)}

const struct railyard_ifc_field railyard_ifc_fields[] = {
    FIELD(create_cq_in, opcode),
    FIELD(create_cq_in, cq_context.dbr_umem_valid),
    FIELD(create_cq_in, cq_context.cqe_sz),
    FIELD(create_cq_in, cq_context.reserved_at_20), /* DEVX: dbr_umem_id */
    FIELD(create_cq_in, cq_context.log_cq_size),
    FIELD(create_cq_in, cq_context.uar_page),
    FIELD(create_cq_in, cq_context.c_eqn_or_apu_element),
    FIELD(create_cq_in, cq_context.log_page_size),
    FIELD(create_cq_in, cq_context.dbr_addr),
    FIELD(create_cq_in, reserved_at_280), /* DEVX: cq_umem_offset, cq_umem_id */
    FIELD(create_cq_in, cq_umem_valid),
    FIELD(create_cq_out, status),
    FIELD(create_cq_out, syndrome),
    FIELD(create_cq_out, cqn),
    FIELD(create_qp_in, opcode),
    FIELD(create_qp_in, qpc.st),
    FIELD(create_qp_in, qpc.pm_state),
    FIELD(create_qp_in, qpc.pd),
    FIELD(create_qp_in, qpc.log_sq_size),
    FIELD(create_qp_in, qpc.uar_page),
    FIELD(create_qp_in, qpc.log_page_size),
    FIELD(create_qp_in, qpc.cqn_snd),
    FIELD(create_qp_in, qpc.cqn_rcv),
    FIELD(create_qp_in, qpc.dbr_addr),
    FIELD(create_qp_in, qpc.rq_type),
    FIELD(create_qp_in, qpc.dbr_umem_valid),
    FIELD(create_qp_in, qpc.reserved_at_684), /* DEVX: dbr_umem_id, its last word */
    FIELD(create_qp_in, wq_umem_offset),
    FIELD(create_qp_in, wq_umem_id),
    FIELD(create_qp_in, wq_umem_valid),
    FIELD(create_qp_out, status),
    FIELD(create_qp_out, syndrome),
    FIELD(create_qp_out, qpn),
    FIELD(rst2init_qp_in, opcode),
    FIELD(rst2init_qp_in, qpn),
    FIELD(rst2init_qp_in, qpc.pm_state),
    FIELD(rst2init_qp_in, qpc.atomic_mode),
    FIELD(rst2init_qp_in, qpc.rre),
    FIELD(rst2init_qp_in, qpc.rwe),
    FIELD(rst2init_qp_in, qpc.rae),
    FIELD(rst2init_qp_in, qpc.primary_address_path.pkey_index),
    FIELD(rst2init_qp_in, qpc.primary_address_path.vhca_port_num),
    FIELD(rst2init_qp_out, status),
    FIELD(rst2init_qp_out, syndrome),
    FIELD(init2rtr_qp_in, opcode),
    FIELD(init2rtr_qp_in, qpn),
    FIELD(init2rtr_qp_in, qpc.mtu),
    FIELD(init2rtr_qp_in, qpc.log_msg_max),
    FIELD(init2rtr_qp_in, qpc.remote_qpn),
    FIELD(init2rtr_qp_in, qpc.log_rra_max),
    FIELD(init2rtr_qp_in, qpc.min_rnr_nak),
    FIELD(init2rtr_qp_in, qpc.next_rcv_psn),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.grh),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.rlid),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.src_addr_index),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.hop_limit),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.tclass),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.rgid_rip),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.udp_sport),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.eth_prio),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.sl),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.vhca_port_num),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.rmac_47_32),
    FIELD(init2rtr_qp_in, qpc.primary_address_path.rmac_31_0),
    FIELD(init2rtr_qp_out, status),
    FIELD(init2rtr_qp_out, syndrome),
    FIELD(rtr2rts_qp_in, opcode),
    FIELD(rtr2rts_qp_in, qpn),
    FIELD(rtr2rts_qp_in, qpc.log_sra_max),
    FIELD(rtr2rts_qp_in, qpc.retry_count),
    FIELD(rtr2rts_qp_in, qpc.rnr_retry),
    FIELD(rtr2rts_qp_in, qpc.next_send_psn),
    FIELD(rtr2rts_qp_in, qpc.primary_address_path.ack_timeout),
    FIELD(rtr2rts_qp_out, status),
    FIELD(rtr2rts_qp_out, syndrome),
    SIZE(create_cq_in),
    SIZE(create_cq_out),
    SIZE(create_qp_in),
    SIZE(create_qp_out),
    SIZE(rst2init_qp_in),
    SIZE(rst2init_qp_out),
    SIZE(init2rtr_qp_in),
    SIZE(init2rtr_qp_out),
    SIZE(rtr2rts_qp_in),
    SIZE(rtr2rts_qp_out),
};
const size_t railyard_ifc_field_count = sizeof railyard_ifc_fields / sizeof railyard_ifc_fields[0];

#define CONSTANT(name) {#name, (uint32_t)(name)}
const struct railyard_ifc_constant railyard_ifc_constants[] = {
    CONSTANT(MLX5_CMD_OP_CREATE_CQ),        CONSTANT(MLX5_CMD_OP_CREATE_QP),
    CONSTANT(MLX5_CMD_OP_RST2INIT_QP),      CONSTANT(MLX5_CMD_OP_INIT2RTR_QP),
    CONSTANT(MLX5_CMD_OP_RTR2RTS_QP),       CONSTANT(MLX5_QPC_ST_RC),
    CONSTANT(MLX5_QPC_PM_STATE_MIGRATED),   CONSTANT(MLX5_QPC_ATOMIC_MODE_IB_SPEC),
    CONSTANT(MLX5_CQC_CQE_SZ_64_BYTES),     CONSTANT(MLX5_QPC_MTU_256_BYTES),
    CONSTANT(MLX5_QPC_MTU_512_BYTES),       CONSTANT(MLX5_QPC_MTU_1K_BYTES),
    CONSTANT(MLX5_QPC_MTU_2K_BYTES),        CONSTANT(MLX5_QPC_MTU_4K_BYTES),
};
const size_t railyard_ifc_constant_count = sizeof railyard_ifc_constants / sizeof railyard_ifc_constants[0];
