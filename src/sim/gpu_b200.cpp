// The simulated B200 (HGX, 8 GPUs): device properties and the timed mode's costs
// (include/railyard/sim/timing.hpp). Legend as in gpu_h100.cpp: [V] vendor
// specification, [M] public measurement, [L] a library's tuning constant, [D] derived,
// [E] estimate without a public source.
#include "railyard/sim/sim.hpp"

namespace railyard::sim {

DeviceProps b200_props() {
  DeviceProps p = h100_props();  // [E] where B200 has no public figure of its own, H100's
  p.name = "sim-B200";
  p.sm_count = 148;  // [V/M] 2 dies x 74 SMs (Chips and Cheese, "Nvidia's B200"; device property dumps)
  p.cc_major = 10;
  p.cc_minor = 0;
  p.global_mem_bytes = std::size_t{180} << 30;

  TimingModel& t = p.timing;
  t.sm_clock_ghz = 1.9;  // [M/E] public benchmark logs: 1965 MHz max; sustained not published. -8%
  t.smem_latency_cycles = 39;  // [M] Chips and Cheese, B200 L1/shared pointer chase: 39 cycles. +-10%
  t.l1_latency_cycles = 39;    // [M] the same pointer chase hits L1 there. +-10%
  // [M] measured 5-6 TB/s in untuned tests of the 8 TB/s [V] HBM3e (Chips and
  // Cheese; cuda-samples); a tuned copy is expected near 6.5. +-15%.
  t.hbm_gbps = 6500;
  t.global_latency_ns = 150;  // [M] Chips and Cheese: L2 hit about 150 ns within a partition. +-20%
  // [L] NCCL src/graph/topo.h SM100_NVLINK_BW 40.1 x 18 links = 722 GB/s per
  // direction of 900 nominal [V], the same 0.8 ratio as H100's measured rate. +-7%.
  t.nvlink_gbps = 722;
  // The NIC: H100's constants. [V] DGX B200 datasheet: 8 single-port ConnectX-7 VPI,
  // 400 Gb/s, PCIe Gen5 (ConnectX-8 at 800 Gb/s comes with B300 / GB300 systems).
  return p;
}

}  // namespace railyard::sim
