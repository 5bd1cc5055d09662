// The simulated H100 SXM5 80 GB: device properties and the timed mode's costs
// (include/railyard/sim/timing.hpp). Each constant: value, source, uncertainty.
// [V] vendor specification, [M] public measurement, [L] a library's tuning constant,
// [D] derived from the rows named, [E] estimate without a public source: a free
// parameter until scripts/gpu-calibrate.sh measures it (docs/performance-model.md).
#include "railyard/sim/sim.hpp"

namespace railyard::sim {

DeviceProps h100_props() {
  DeviceProps p;
  p.name = "sim-H100";
  p.sm_count = 132;  // [V] H100 whitepaper, SXM5; deviceQuery "132 multiprocessors"
  p.cc_major = 9;
  p.cc_minor = 0;
  p.smem_per_block_optin_bytes = 232448;  // [V] 227 KiB per block (CUDA programming guide, compute capability 9.0)
  p.global_mem_bytes = std::size_t{80} << 30;

  TimingModel& t = p.timing;
  // [M/E] deviceQuery max clock 1980 MHz; no public SXM clock trace under load;
  // communication kernels draw little power. -10% / +8%.
  t.sm_clock_ghz = 1.83;
  t.issue_ops_per_cycle = 128;  // [V] 4 sub-partitions x 1 warp instruction per cycle (H100 whitepaper)
  t.op_cycles = 4;              // [E] a dependent integer/address operation; x/÷ 2
  // [V/M] 32 banks x 4 B per cycle (CUDA programming guide); te42kyfo/gpu-benches
  // "gpu-cache": close to 128 B/cycle/SM on H100. +-5%.
  t.smem_bytes_per_cycle = 128;
  // [M] Luo et al., "Benchmarking and Dissecting the Nvidia Hopper GPU Architecture",
  // arXiv 2402.13499: about 29 cycles (H800). +-15%.
  t.smem_latency_cycles = 30;
  // [E] no public per-SM figure for H100's TMA; 64 B/cycle at 1.83 GHz. -40% / +100%.
  t.tma_gbps = 117;
  t.tma_issue_cycles = 16;  // [E] x/÷ 2
  // [M] gpu-benches gpu-latency/h100_pcie.txt: 34.2 cycles (19.5 ns at 1755 MHz) for
  // data sets up to 216 KB. +-10%.
  t.l1_latency_cycles = 34;
  // [D] 256 KiB of L1 and shared memory per SM [V, whitepaper] less the carve-out for
  // Railyard's kernels' FIFOs (up to 227 KiB [V]); the rest is L1. -50% / +100%.
  t.l1_bytes = 32768;
  // [D] HBM3 3.35 TB/s [V, datasheet] x 0.87-0.92, the copy efficiency measured on
  // GH200, H200 and H100 PCIe (gpu-benches "gpu-stream"). +-7%.
  t.hbm_gbps = 3000;
  // [M] gpu-benches gpu-latency/h100_pcie.txt: L2 hit 265 cycles near, 475 far
  // (151 / 271 ns at 1755 MHz); HBM 626-658 cycles. Data another SM just wrote is in
  // L2: the mean of the two halves. +-30%.
  t.global_latency_ns = 210;
  // [M] NVIDIA/nccl issue #1264, HGX H100 p2pBandwidthLatencyTest: 376 GB/s per
  // direction of 450 nominal [V]; [L] NCCL src/graph/topo.h SM90_NVLINK_BW 20.6 x 18
  // = 370.8. +-8% for SM-driven bulk copies to 7 peers.
  t.nvlink_gbps = 370;
  // [E] no public load-to-use latency over NVSwitch: cudaMemcpy-based P2P latency
  // tests give 1.8-2.3 µs (an upper bound), simulator projects use 0.5-0.7 µs. x/÷ 2.
  t.remote_load_ns = 1500;
  t.remote_store_ns = 750;    // [E] about half the round trip. x/÷ 2
  t.remote_atomic_ns = 1500;  // [E] one round trip. x/÷ 2
  t.fence_gpu_ns = 100;       // [E] MEMBAR.GPU with no stores outstanding. x/÷ 3
  t.fence_sys_ns = 500;       // [E] MEMBAR.SYS with no stores outstanding. x/÷ 3
  t.acquire_sys_extra_ns = 20;  // [E] CCTL.IVALL after LDG.E.STRONG.SYS (gpu-review.md finding 6). x/÷ 2
  t.mbarrier_cycles = 20;       // [E] x/÷ 2
  t.barrier_cycles = 30;        // [E] bar.sync after the last arrival. x/÷ 2
  t.warp_collective_cycles = 8;  // [E] x/÷ 2
  // [M] gpu-benches gpu-small-kernels/h200.txt: back-to-back kernels in one stream
  // cost 2.5 µs each on H200 (same die). +-30%.
  t.launch_us = 2.5;
  // The GPU's NIC: a ConnectX-7 400 Gb/s port behind a PCIe Gen5 x16 switch, as in a
  // DGX H100 [V, DGX H100 user guide: 8 single-port ConnectX-7, 400 Gb/s].
  // [V] 400 Gb/s per direction (ConnectX-7 datasheet); the payload rate is a few %
  // lower (packet headers, not modelled): perftest ib_write_bw reports about 48 GB/s.
  // -5% / +0.
  t.nic_gbps = 50;
  // [D] PCIe Gen5 x16: 64 GB/s per direction [V, PCI-SIG] x 0.86 for 128b/130b and
  // TLP headers at a 256-byte payload. -10% / +8%.
  t.nic_pcie_gbps = 55;
  t.nic_doorbell_ns = 400;   // [E] a posted MMIO write through the PCIe switch. x/÷ 2
  t.nic_wqe_fetch_ns = 800;  // [E] a DMA read round trip of GPU memory over PCIe. x/÷ 2
  t.nic_pcie_read_ns = 800;  // [E] the same round trip, for a WRITE's payload. x/÷ 2
  // [E] NIC transmit and receive pipelines, FEC, cable and one or two switch hops;
  // perftest ib_write_lat reports 1-2 µs host to host on NDR, which includes the
  // doorbell and the reads above. x/÷ 2.
  t.nic_wire_ns = 1000;
  t.nic_atomic_ns = 800;  // [E] a PCIe read round trip and a write at the responder. x/÷ 2
  t.nic_cqe_ns = 300;     // [E] a posted PCIe write into GPU memory. x/÷ 2
  return p;
}

}  // namespace railyard::sim
