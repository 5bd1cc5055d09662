// Railyard simulator: the cost model of the timed mode (docs/simulator.md, "Timed
// mode"). One preset per GPU model, each constant with its public source and its
// uncertainty beside it: src/sim/gpu_h100.cpp, src/sim/gpu_b200.cpp.
//
// Times are nanoseconds unless a name says cycles (SM cycles at sm_clock_ghz);
// bandwidths are bytes per nanosecond, which is GB/s.
#pragma once

namespace railyard::sim {

struct TimingModel {
  double sm_clock_ghz = 1.0;  // SM cycles per nanosecond under load
  // ---- per SM ----
  double issue_ops_per_cycle = 128;   // thread operations issued per cycle (4 schedulers x 32 lanes)
  double op_cycles = 4;               // a thread's own cost of one simulated operation besides its memory
  double smem_bytes_per_cycle = 128;  // shared-memory bandwidth
  double smem_latency_cycles = 30;    // ld.shared until the value is there
  double tma_gbps = 100;              // one SM's bulk-copy (TMA) engine
  double tma_issue_cycles = 16;       // a thread issuing one cp.async.bulk
  // The SM's L1: weak loads of the device's own memory hit in it (128-byte lines,
  // direct-mapped over l1_bytes); strong loads bypass it, acquires and fences above
  // block scope empty it. Bulk copies do not pass through it.
  double l1_latency_cycles = 34;
  double l1_bytes = 32768;
  // ---- per GPU ----
  double hbm_gbps = 3000;           // device memory, reads and writes together
  double global_latency_ns = 300;   // a load of device memory that misses L1
  double nvlink_gbps = 450;         // NVLink per GPU per direction (through the switch)
  double remote_load_ns = 1000;     // round trip of a load from a peer GPU's memory
  double remote_store_ns = 600;     // a store to a peer GPU until it is visible there
  double remote_atomic_ns = 1000;   // round trip of an atomic on a peer GPU's memory
  double fence_gpu_ns = 100;        // fence.acq_rel.gpu / __threadfence, besides draining stores
  double fence_sys_ns = 500;        // fence.sc.sys / MEMBAR.SYS, besides draining stores
  double acquire_sys_extra_ns = 20;  // ld.acquire.sys over a plain load (L1 invalidate)
  double mbarrier_cycles = 20;      // mbarrier arrive, test_wait, try_wait
  double barrier_cycles = 24;       // bar.sync after the last arrival
  double warp_collective_cycles = 8;  // __syncwarp, shuffle, vote
  double launch_us = 4;             // a kernel launch until its first block runs
  // ---- the GPU's NIC (sim::Nic, docs/simulator.md "Timed mode") ----
  double nic_gbps = 50;            // the port's data rate per direction (TX and RX pipes)
  double nic_pcie_gbps = 55;       // the NIC's DMA reads of GPU memory over PCIe (payload)
  double nic_doorbell_ns = 400;    // a doorbell store (MMIO over PCIe) until the NIC sees it
  double nic_wqe_fetch_ns = 800;   // the NIC's read of the rung WQEs from GPU memory
  double nic_pcie_read_ns = 800;   // a payload read's round trip before its packet leaves
  double nic_wire_ns = 1000;       // a packet from one NIC to another (NIC pipelines, cable, switch)
  double nic_atomic_ns = 800;      // the responder's read-modify-write of GPU memory
  double nic_cqe_ns = 300;         // the ACK's arrival until its CQE is written in GPU memory
};

}  // namespace railyard::sim
