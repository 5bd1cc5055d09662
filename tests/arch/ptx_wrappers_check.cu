// Compile-only check for the CUDA flavour: instantiates every arch wrapper in one
// kernel so that ptxas validates each asm string for the target architectures.
// Not run. Build with:
//   nvcc -std=c++20 -gencode arch=compute_90a,code=sm_90a \
//        -gencode arch=compute_100a,code=sm_100a -Iinclude -I. -c tests/arch/ptx_wrappers_check.cu
#include <cstdint>

#include "railyard/arch/barrier.cuh"
#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/convert.cuh"
#include "railyard/arch/fault.cuh"
#include "railyard/arch/mbarrier.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/mmio.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"

namespace railyard::arch {

struct CheckStorage {
  alignas(128) uint8_t slot[256];
  uint64_t bar;
  uint32_t word;
  uint64_t dword;
  uint16_t half;
  uint8_t byte;
};

template <class T>
__device__ void exercise_words(T* g, T v, T* out) {
  T acc = ld_relaxed_gpu(g) + ld_relaxed_sys(g) + ld_acquire_gpu(g) + ld_acquire_sys(g);
  st_relaxed_gpu(g, acc);
  st_relaxed_sys(g, acc);
  st_release_gpu(g, acc);
  st_release_sys(g, acc);
  acc += atomic_add_relaxed_gpu(g, v);
  acc += atomic_add_release_gpu(g, v);
  acc += atomic_add_release_sys(g, v);
  red_add_release_sys(g, v);
  st_global(out, acc + ld_global(g));
}

__global__ void ptx_wrappers_check(uint32_t* g32, uint64_t* g64, int32_t* gs32, float* gf,
                                   uint8_t* g8, uint16_t* g16, uint4* g128, uint8_t* gbytes) {
  CheckStorage& s = carve<CheckStorage>();
  if (elect_one_sync()) {
    mbarrier_init(&s.bar, 1);
    fence_mbarrier_init_release_cluster();
  }
  named_barrier_sync(1, 64);
  named_barrier_arrive(2, 64);

  exercise_words(g32, 1u, g32 + 1);
  exercise_words(g64, uint64_t{1}, g64 + 1);
  st_mmio_relaxed_sys(g64 + 2, ld_global(g64));
  exercise_words(gs32, -1, gs32 + 1);
  exercise_words(gf, 1.0f, gf + 1);
  st_global(g32 + 3, bf16x2_rn(ld_global(gf), round_to_bf16(ld_global(gf + 1))));
  st_global(g8, static_cast<uint8_t>(ld_global(g8) + 1));
  st_global(g16, static_cast<uint16_t>(ld_global(g16) + 1));
  st_global(g128 + 1, ld_global(g128));

  st_global(g32 + 2, ld_volatile_shared(&s.word) + static_cast<uint32_t>(ld_volatile_shared(&s.dword)));
  st_shared(&s.word, ld_shared(&s.word) + 1u);
  st_shared(&s.dword, ld_shared(&s.dword) + 1u);
  st_shared(&s.half, static_cast<uint16_t>(ld_shared(&s.half) + 1));
  st_shared(&s.byte, static_cast<uint8_t>(ld_shared(&s.byte) + 1));
  st_shared(reinterpret_cast<uint4*>(s.slot), ld_shared(reinterpret_cast<const uint4*>(s.slot) + 1));
  fence_proxy_async_global();
  fence_acq_rel_gpu();
  fence_acq_rel_sys();
  fence_sc_sys();

  mbarrier_expect_tx(&s.bar, 256);
  uint64_t token = mbarrier_arrive_expect_tx(&s.bar, 0);
  bulk_copy_g2s(s.slot, gbytes, 256, &s.bar);
  token += mbarrier_try_wait_parity(&s.bar, 0);  // kernels loop through pipeline/wait.cuh
  token += mbarrier_test_wait_parity(&s.bar, 0);
  token += mbarrier_arrive(&s.bar);
  fence_proxy_async_shared_cta();
  bulk_copy_s2g(gbytes + 256, s.slot, 256);
  bulk_commit_group();
  bulk_wait_group_read<1>();
  bulk_wait_group<0>();
  mbarrier_inval(&s.bar);
  st_global(g64 + 3, token + lane_idx() + warp_idx() + dynamic_smem_bytes());
  if (token == 12345) trap("unreachable");
}

}  // namespace railyard::arch
