// runtime/registered_buffer on simulated ranks (1, 2, 4 and 8):
//  - creation gives every rank a zeroed buffer of required_bytes on its own device,
//    and peer_ptr(p) for every rank of the domain; a kernel on every rank stores into
//    every peer's buffer (first and last region) through peer_ptr and the owner sees
//    it; the stores cross the simulated NVLink (traffic counted device -> owner);
//  - destruction releases everything: the simulator's live allocations return to
//    their starting count and bytes, and the device API's registry of shareable
//    memory no longer knows the handles (it refuses to free while a peer maps);
//  - a configuration mismatch surfaces from creation on every rank, and so does a
//    size the caller cannot give (its formula throws, says 0, or differs by rank);
//  - an injected failure on one rank (allocate, import, memory registration) is an
//    error on every rank naming the step and that rank, without waiting for any
//    timeout, and nothing leaks; a rank that never joins a collective fails the
//    others within the bootstrap's (short) timeout;
//  - topologies: split and detected multi-domain groups map only domain peers;
//  - memory registrars run after the zero fill and are undone before the free.
#include "railyard/runtime/registered_buffer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "railyard/arch/memory.cuh"
#include "registered_buffer_test_util.hpp"

namespace railyard::runtime {
namespace {

using namespace std::chrono_literals;
using test::errors_on_ranks;
using test::make_group;
using test::reset_sim;
using test::small_config;
using test::test_bytes;

__global__ void store_word(uint32_t* dst, uint32_t value) { arch::st_global(dst, value); }

void launch_store(GpuStream stream, uint32_t* dst, uint32_t value) {
  sim::launch(stream, sim::LaunchConfig{1, 1, 0, "store_word"}, [=] { store_word(dst, value); });
}

uint32_t stamp(int writer, int owner) { return static_cast<uint32_t>((writer + 1) * 1000 + owner); }

// Where rank `writer` stores into a peer's buffer: its barrier flag (the region's
// start) and a word of the last staging row (the buffer's end), so the whole range
// must be mapped.
// Where writer `writer` stamps a buffer of `bytes`: a word at its start and one at its
// end, so that a buffer shorter than asked, or mapped short, fails.
uint32_t* flag_slot(uint8_t* base, int writer) { return reinterpret_cast<uint32_t*>(base) + writer; }
uint32_t* last_row_slot(uint8_t* base, std::size_t bytes, int writer) {
  return reinterpret_cast<uint32_t*>(base + (bytes & ~std::size_t{3})) - 1 - writer;
}

class RegisteredBufferRanks : public ::testing::TestWithParam<int> {};

TEST_P(RegisteredBufferRanks, CreatesZeroedBuffersThatEveryPeerWritesThenReleasesAll) {
  const int n = GetParam();
  reset_sim(n);
  const std::size_t start_count = sim::live_allocation_count();
  const std::size_t start_bytes = sim::live_allocation_bytes();
  const BufferConfig config = small_config(n);
  const std::size_t required = test_bytes(config);
  auto group = make_group(n);
  std::vector<std::vector<std::byte>> stale_handles(static_cast<std::size_t>(n));
  sim::reset_traffic();

  sim::run_ranks(n, [&](int rank) {
    gpu::set_current(rank);
    auto boot = group->bootstrap(rank);
    RegisteredBuffer buffer(config, test_bytes, *boot);
    ASSERT_EQ(buffer.bytes(), required);
    EXPECT_EQ(buffer.rank(), rank);
    EXPECT_EQ(buffer.domain_rank(), rank);
    EXPECT_EQ(buffer.device(), rank);
    EXPECT_EQ(buffer.handle_type(), ShareableHandleType::InProcess);
    ASSERT_EQ(buffer.domain_ptrs().size(), static_cast<std::size_t>(n));
    EXPECT_EQ(buffer.peer_ptr(rank), buffer.local_ptr());
    sim::AllocationInfo info;
    ASSERT_TRUE(sim::find_allocation(buffer.local_ptr(), &info));
    EXPECT_EQ(info.device, rank);
    EXPECT_EQ(info.bytes, required);
    for (int p = 0; p < n; ++p) {
      EXPECT_EQ(buffer.domain_ptrs()[p], buffer.peer_ptr(p));
      if (p != rank) {
        EXPECT_TRUE(sim::peer_access_enabled(rank, p)) << rank << " -> " << p;
      }
    }
    // The simulator poisons new memory with 0xA5; every byte must have been zeroed.
    const uint8_t* mine = buffer.local_ptr();
    EXPECT_TRUE(std::all_of(mine, mine + required, [](uint8_t b) { return b == 0; })) << "rank " << rank;
    boot->barrier();  // nobody writes into a buffer its owner is still checking

    const GpuStream stream = gpu::stream_create();
    for (int p = 0; p < n; ++p) {
      launch_store(stream, flag_slot(buffer.peer_ptr(p), rank), stamp(rank, p));
      launch_store(stream, last_row_slot(buffer.peer_ptr(p), required, rank), stamp(rank, p));
    }
    gpu::stream_synchronize(stream);
    boot->barrier();  // every rank's stores are done
    for (int w = 0; w < n; ++w) {
      EXPECT_EQ(*flag_slot(buffer.local_ptr(), w), stamp(w, rank)) << "writer " << w << " owner " << rank;
      EXPECT_EQ(*last_row_slot(buffer.local_ptr(), required, w), stamp(w, rank)) << "writer " << w << " owner " << rank;
    }
    // A handle to the same memory, kept to show the registry forgets it.
    stale_handles[static_cast<std::size_t>(rank)] =
        gpu::export_handle({.ptr = buffer.local_ptr(), .bytes = buffer.bytes(), .mapped_bytes = buffer.mapped_bytes(),
                            .device = rank, .handle_type = ShareableHandleType::InProcess})
            .bytes;
    boot->barrier();  // every owner has read its buffer
    buffer.destroy();
    EXPECT_FALSE(buffer.valid());
    EXPECT_THROW(buffer.peer_ptr(rank), std::logic_error);
  });

  for (int w = 0; w < n; ++w)
    for (int p = 0; p < n; ++p)
      EXPECT_EQ(sim::traffic().written(w, p), 2 * sizeof(uint32_t)) << "device " << w << " -> owner " << p;
  EXPECT_EQ(sim::live_allocation_count(), start_count);
  EXPECT_EQ(sim::live_allocation_bytes(), start_bytes);
  gpu::set_current(0);
  for (const std::vector<std::byte>& handle : stale_handles) {
    try {
      gpu::import_handle({.bytes = handle});
      ADD_FAILURE() << "a destroyed buffer's handle must no longer import";
    } catch (const DeviceError& e) {
      EXPECT_HAS(std::string(e.what()), "no live shareable allocation");
    }
  }
}

TEST_P(RegisteredBufferRanks, ConfigMismatchSurfacesFromCreationOnEveryRank) {
  const int n = GetParam();
  reset_sim(n);
  auto group = make_group(n);
  const auto errors = errors_on_ranks(n, [&](int rank) {
    BufferConfig config = small_config(n);
    // One rank alone cannot disagree with itself: with one rank the config is invalid.
    if (n == 1) config.hidden = 100;
    else if (rank == n - 1) config.hidden = 512;
    auto boot = group->bootstrap(rank);
    RegisteredBuffer buffer(config, test_bytes, *boot);
  });
  for (int r = 0; r < n; ++r) {
    const test::RankError& e = errors[r];
    ASSERT_TRUE(e.is_registered_buffer_error) << e.message;
    EXPECT_EQ(e.step, RegisteredBufferStep::CheckConfig);
    EXPECT_HAS(e.message, "creation failed at step 'check_config' (rank " + std::to_string(r) + ")");
    if (n == 1) {
      EXPECT_HAS(e.nested, "hidden = 100");
    } else {
      const std::string others = n == 2 ? "rank 0" : "ranks 0-" + std::to_string(n - 2);
      EXPECT_HAS(e.nested, "hidden differs: 256 on " + others + "; 512 on rank " + std::to_string(n - 1));
    }
  }
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

// The caller sizes the buffer after the config is agreed; a size it cannot give fails
// the same step on every rank, before anything is allocated.
TEST_P(RegisteredBufferRanks, SizeTheCallerCannotGiveFailsCheckConfigOnEveryRank) {
  const int n = GetParam();
  reset_sim(n);
  auto group = make_group(n);
  const struct {
    const char* name;
    std::function<std::size_t(int rank, const BufferConfig&)> size;
    std::string expected;
  } cases[] = {
      {"throws", [](int, const BufferConfig&) -> std::size_t { throw std::invalid_argument("injected: too wide"); },
       "injected: too wide"},
      {"zero", [](int, const BufferConfig&) { return std::size_t{0}; }, "required_bytes(config) is 0"},
      {"differs", [n](int rank, const BufferConfig& c) { return test_bytes(c) + (rank == n - 1 ? 16 : 0); },
       "ranks ask for different sizes: " + std::to_string(test_bytes(small_config(n))) + " bytes on rank 0"},
  };
  for (const auto& c : cases) {
    if (n == 1 && std::string(c.name) == "differs") continue;  // one rank agrees with itself
    const auto errors = errors_on_ranks(n, [&](int rank) {
      auto boot = group->bootstrap(rank);
      RegisteredBuffer buffer(small_config(n), [&](const BufferConfig& config) { return c.size(rank, config); },
                              *boot);
    });
    for (int r = 0; r < n; ++r) {
      const test::RankError& e = errors[r];
      ASSERT_TRUE(e.is_registered_buffer_error) << c.name << ": " << e.message;
      EXPECT_EQ(e.step, RegisteredBufferStep::CheckConfig) << c.name;
      EXPECT_HAS(e.nested, c.expected);
    }
  }
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

TEST_P(RegisteredBufferRanks, AllocationFailureOnOneRankIsAnErrorOnEveryRankWithoutATimeout) {
  const int n = GetParam();
  reset_sim(n);
  const std::size_t start_count = sim::live_allocation_count();
  auto group = make_group(n, 20s);
  const int bad = n - 1;
  const auto start = std::chrono::steady_clock::now();
  const auto errors = errors_on_ranks(n, [&](int rank) {
    RegisteredBufferOptions options;
    options.before_step = [&](RegisteredBufferStep step) {
      if (rank == bad && step == RegisteredBufferStep::Allocate) throw DeviceError("injected: out of device memory");
    };
    auto boot = group->bootstrap(rank);
    RegisteredBuffer buffer(small_config(n), test_bytes, *boot, options);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "the failure must be agreed, not timed out";
  std::printf("rank 0 saw: %s\n", errors[0].message.c_str());
  for (int r = 0; r < n; ++r) {
    const test::RankError& e = errors[r];
    ASSERT_TRUE(e.is_registered_buffer_error) << e.message;
    EXPECT_EQ(e.step, RegisteredBufferStep::Allocate);
    EXPECT_EQ(e.failed_ranks, std::vector<int>{bad});
    EXPECT_HAS(e.message, "on rank " + std::to_string(bad) + " at step 'allocate': injected: out of device memory");
    EXPECT_HAS(e.message, "(seen by rank " + std::to_string(r) + ";");
  }
  EXPECT_EQ(sim::live_allocation_count(), start_count);
}

// Rank 0 fails before importing while the others have imported its buffer: it must
// wait for them to unmap before it frees (the simulator refuses otherwise).
TEST_P(RegisteredBufferRanks, ImportFailureRollsBackMappingsOnEveryRank) {
  const int n = GetParam();
  reset_sim(n);
  auto group = make_group(n);
  const auto errors = errors_on_ranks(n, [&](int rank) {
    RegisteredBufferOptions options;
    options.before_step = [&](RegisteredBufferStep step) {
      if (rank == 0 && step == RegisteredBufferStep::Import) throw std::runtime_error("injected import failure");
    };
    auto boot = group->bootstrap(rank);
    RegisteredBuffer buffer(small_config(n), test_bytes, *boot, options);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[r].is_registered_buffer_error) << errors[r].message;
    EXPECT_EQ(errors[r].step, RegisteredBufferStep::Import);
    EXPECT_EQ(errors[r].failed_ranks, std::vector<int>{0});
    EXPECT_HAS(errors[r].message, "on rank 0 at step 'import': injected import failure");
    EXPECT_EQ(errors[r].message.find("while releasing"), std::string::npos) << errors[r].message;
  }
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

// A rank that never joins a collective (as if it crashed) is bounded by the
// bootstrap's timeout; everyone still releases what it holds.
TEST_P(RegisteredBufferRanks, RankThatNeverJoinsFailsTheOthersWithinTheBootstrapTimeout) {
  const int n = GetParam();
  reset_sim(n);
  auto group = make_group(n, 300ms);
  const int missing = n - 1;
  const auto start = std::chrono::steady_clock::now();
  const auto errors = errors_on_ranks(n, [&](int rank) {
    RegisteredBufferOptions options;
    options.before_step = [&](RegisteredBufferStep step) {
      if (rank == missing && step == RegisteredBufferStep::ExchangeHandles) throw std::runtime_error("rank crashed");
    };
    auto boot = group->bootstrap(rank);
    RegisteredBuffer buffer(small_config(n), test_bytes, *boot, options);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  std::printf("rank 0 saw: %s\n  caused by: %s\n", errors[0].message.c_str(), errors[0].nested.c_str());
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[r].is_registered_buffer_error) << errors[r].message;
    EXPECT_EQ(errors[r].step, RegisteredBufferStep::ExchangeHandles);
    EXPECT_HAS(errors[r].message, "creation failed at step 'exchange_handles' (rank " + std::to_string(r) + ")");
    if (r == missing) {
      EXPECT_EQ(errors[r].nested, "rank crashed");
    } else {
      EXPECT_HAS(errors[r].nested, "for rank(s) " + std::to_string(missing) + ", which never arrived");
    }
  }
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

TEST_P(RegisteredBufferRanks, DestructorAndMoveReleaseEverything) {
  const int n = GetParam();
  reset_sim(n);
  auto group = make_group(n);
  sim::run_ranks(n, [&](int rank) {
    gpu::set_current(rank);
    auto boot = group->bootstrap(rank);
    RegisteredBuffer first(small_config(n), test_bytes, *boot);
    uint8_t* const ptr = first.local_ptr();
    RegisteredBuffer moved(std::move(first));
    EXPECT_FALSE(first.valid());
    EXPECT_THROW(first.local_ptr(), std::logic_error);
    first.destroy();  // a moved-from buffer has nothing to release (and joins no collective)
    EXPECT_EQ(moved.local_ptr(), ptr);
  });  // ~RegisteredBuffer destroys collectively on every rank
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Ranks, RegisteredBufferRanks, ::testing::Values(1, 2, 4, 8));

// ---- topology ---------------------------------------------------------------------------

TEST(RegisteredBufferTopology, SplitDomainsMapOnlyDomainPeers) {
  reset_sim(4);  // one simulated NVLink domain, split into two by the override
  auto group = make_group(4);
  sim::run_ranks(4, [&](int rank) {
    gpu::set_current(rank);
    auto boot = group->bootstrap(rank);
    RegisteredBufferOptions options;
    options.topology_options.ranks_per_domain = 2;
    RegisteredBuffer buffer(small_config(4, 2), test_bytes, *boot, options);
    EXPECT_EQ(buffer.domain_ptrs().size(), 2u);
    EXPECT_EQ(buffer.domain_rank(), rank % 2);
    const int partner = rank ^ 1;
    EXPECT_NE(buffer.peer_ptr(partner), nullptr);
    const int outsider = (rank + 2) % 4;
    try {
      buffer.peer_ptr(outsider);
      ADD_FAILURE() << "rank " << outsider << " is in the other domain";
    } catch (const std::out_of_range& e) {
      EXPECT_HAS(std::string(e.what()), "rank " + std::to_string(outsider) + " is not in rank " + std::to_string(rank) +
                                            "'s NVLink domain (ranks " + std::to_string(rank / 2 * 2) + "-" +
                                            std::to_string(rank / 2 * 2 + 1) + ")");
    }
    EXPECT_FALSE(sim::peer_access_enabled(rank, outsider)) << "nothing was imported across domains";
    const GpuStream stream = gpu::stream_create();
    launch_store(stream, flag_slot(buffer.peer_ptr(partner), buffer.domain_rank()), stamp(rank, partner));
    gpu::stream_synchronize(stream);
    boot->barrier();
    EXPECT_EQ(*flag_slot(buffer.local_ptr(), partner % 2), stamp(partner, rank));
    boot->barrier();
  });
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

// Devices in two simulated NVLink domains: detection finds them, and creation succeeds
// only because nothing is imported across them (the simulator refuses such imports).
TEST(RegisteredBufferTopology, DetectedDomains) {
  reset_sim({0, 0, 1, 1});
  auto group = make_group(4);
  sim::run_ranks(4, [&](int rank) {
    gpu::set_current(rank);
    auto boot = group->bootstrap(rank);  // outlives the buffer: destruction is collective
    RegisteredBuffer buffer(small_config(4, 2), test_bytes, *boot);
    EXPECT_EQ(buffer.topology().describe(), "4 ranks in 2 NVLink domains of 2 (ranks 0-1, 2-3)");
  });
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

TEST(RegisteredBufferTopology, TopologyThatContradictsTheConfigIsAnErrorOnEveryRank) {
  reset_sim(4);  // detection: one domain of 4
  auto group = make_group(4);
  const auto errors = errors_on_ranks(4, [&](int rank) {
    auto boot = group->bootstrap(rank);
    RegisteredBuffer buffer(small_config(4, 2), test_bytes, *boot);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(errors[r].step, RegisteredBufferStep::Topology) << errors[r].message;
    EXPECT_HAS(errors[r].nested, "the topology is 4 ranks in 1 NVLink domain");
    EXPECT_HAS(errors[r].nested, "but the BufferConfig says num_ranks = 4, ranks_per_domain = 2");
  }
}

TEST(RegisteredBufferTopology, CallerTopologiesMustAgree) {
  reset_sim(2);
  auto group = make_group(2);
  const auto errors = errors_on_ranks(2, [&](int rank) {
    RegisteredBufferOptions options;
    options.topology = rank == 0 ? make_topology(2, 2) : make_topology(2, 1);
    auto boot = group->bootstrap(rank);
    RegisteredBuffer buffer(small_config(2), test_bytes, *boot, options);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r].step, RegisteredBufferStep::Topology) << errors[r].message;
    EXPECT_HAS(errors[r].nested, "ranks disagree on the topology: rank 0 has 2 ranks in domains of 2, rank 1 has 2 "
                                 "in domains of 1");
  }
}

// ---- memory registrars (the RDMA hook) ------------------------------------------------------

struct RegistrarLog {
  std::mutex mutex;
  std::vector<std::string> events;
  void add(std::string e) {
    std::lock_guard lock(mutex);
    events.push_back(std::move(e));
  }
  int count(const std::string& prefix) {
    std::lock_guard lock(mutex);
    return static_cast<int>(std::count_if(events.begin(), events.end(),
                                          [&](const std::string& e) { return e.rfind(prefix, 0) == 0; }));
  }
};

// Records calls and checks what a NIC registration relies on: the memory is zeroed
// and sized as asked when registered, and still allocated when deregistered.
class RecordingRegistrar final : public MemoryRegistrar {
 public:
  RecordingRegistrar(RegistrarLog* log, std::size_t expected_bytes, int fail_on_rank = -1)
      : log_(log), expected_bytes_(expected_bytes), fail_on_rank_(fail_on_rank) {}
  std::string name() const override { return "recording"; }
  void register_memory(const RegisteredRegion& region) override {
    if (region.rank == fail_on_rank_) throw std::runtime_error("injected: ibv_reg_dmabuf_mr failed");
    const auto* p = static_cast<const uint8_t*>(region.ptr);
    const bool zeroed = std::all_of(p, p + region.bytes, [](uint8_t b) { return b == 0; });
    log_->add("register rank " + std::to_string(region.rank) + (zeroed ? " zeroed" : " NOT zeroed") +
              (region.bytes == expected_bytes_ ? " sized" : " MISSIZED"));
  }
  void deregister_memory(const RegisteredRegion& region) noexcept override {
    const bool live = sim::find_allocation(region.ptr, nullptr);
    log_->add("deregister rank " + std::to_string(region.rank) + (live ? " live" : " FREED"));
  }

 private:
  RegistrarLog* log_;
  std::size_t expected_bytes_;
  int fail_on_rank_;
};

TEST(RegisteredBufferRegistrars, RegisteredAfterZeroFillAndDeregisteredBeforeFree) {
  reset_sim(2);
  auto group = make_group(2);
  RegistrarLog log;
  const BufferConfig config = small_config(2);
  auto registrar = std::make_shared<RecordingRegistrar>(&log, test_bytes(config));
  sim::run_ranks(2, [&](int rank) {
    gpu::set_current(rank);
    RegisteredBufferOptions options;
    options.registrars = {registrar};
    auto boot = group->bootstrap(rank);
    RegisteredBuffer buffer(config, test_bytes, *boot, options);
    EXPECT_EQ(log.count("register rank " + std::to_string(rank) + " zeroed sized"), 1);
  });
  EXPECT_EQ(log.count("deregister rank 0 live"), 1);
  EXPECT_EQ(log.count("deregister rank 1 live"), 1);
  EXPECT_EQ(log.events.size(), 4u);
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

// A registrar is offered the buffer's dma-buf, or told why there is none: the
// simulator has no dma-buf (a GPU test checks the descriptor where the driver has one).
class DmabufRegistrar final : public MemoryRegistrar {
 public:
  std::string name() const override { return "dma-buf"; }
  void register_memory(const RegisteredRegion& region) override {
    fd = region.dmabuf_fd;
    problem = region.dmabuf_problem;
  }
  void deregister_memory(const RegisteredRegion&) noexcept override {}
  int fd = 0;
  std::string problem;
};

TEST(RegisteredBufferRegistrars, RegistrarsAreOfferedTheDmabufOrToldWhyThereIsNone) {
  reset_sim(1);
  auto group = make_group(1);
  auto registrar = std::make_shared<DmabufRegistrar>();
  sim::run_ranks(1, [&](int rank) {
    gpu::set_current(rank);
    RegisteredBufferOptions options;
    options.registrars = {registrar};
    auto boot = group->bootstrap(rank);
    RegisteredBuffer buffer(small_config(1), test_bytes, *boot, options);
  });
  EXPECT_EQ(registrar->fd, -1);
  EXPECT_NE(registrar->problem.find("the simulator has no dma-buf"), std::string::npos) << registrar->problem;
}

TEST(RegisteredBufferRegistrars, RegistrationFailureOnOneRankUndoesTheOthers) {
  reset_sim(2);
  auto group = make_group(2);
  RegistrarLog log;
  const BufferConfig config = small_config(2);
  const std::size_t bytes = test_bytes(config);
  auto good = std::make_shared<RecordingRegistrar>(&log, bytes);
  auto failing = std::make_shared<RecordingRegistrar>(&log, bytes, /*fail_on_rank=*/1);
  const auto errors = errors_on_ranks(2, [&](int rank) {
    RegisteredBufferOptions options;
    options.registrars = {good, failing};
    auto boot = group->bootstrap(rank);
    RegisteredBuffer buffer(config, test_bytes, *boot, options);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r].step, RegisteredBufferStep::RegisterMemory) << errors[r].message;
    EXPECT_HAS(errors[r].message,
               "on rank 1 at step 'register_memory': registrar 'recording': injected: ibv_reg_dmabuf_mr failed");
  }
  // Rank 0 registered twice, rank 1 once (its second registrar failed): each undone.
  EXPECT_EQ(log.count("register rank 0"), 2);
  EXPECT_EQ(log.count("register rank 1"), 1);
  EXPECT_EQ(log.count("deregister rank 0 live"), 2);
  EXPECT_EQ(log.count("deregister rank 1 live"), 1);
  EXPECT_EQ(sim::live_allocation_count(), 0u);
}

}  // namespace
}  // namespace railyard::runtime
