// Railyard's pybind11 module, one per flavour (_C_sim, _C_cuda): creating and
// destroying buffers over a bootstrap, and (simulator flavour) running ranks as
// threads on simulated GPUs. The ops themselves are torch.ops.railyard.* (ops.cpp).
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>

#include "ops.hpp"

#if RAILYARD_IS_SIM
#include <railyard/runtime/sim_bootstrap.hpp>
#include <railyard/sim/sim.hpp>

#endif

namespace py = pybind11;

namespace railyard::python {
namespace {

// A bootstrap on its way into a Buffer (create_buffer takes it over).
struct PyBootstrap {
  std::unique_ptr<runtime::Bootstrap> bootstrap;
};

// torch.distributed (or any Python group) as a bootstrap: allgather(bytes) -> bytes of
// every rank's bytes in rank order, barrier(). Called with the GIL taken.
PyBootstrap callback_bootstrap(int rank, int size, py::function allgather, py::function barrier) {
  runtime::CallbackBootstrap::Options o;
  o.rank = rank;
  o.size = size;
  auto keep_allgather = std::make_shared<py::function>(std::move(allgather));
  auto keep_barrier = std::make_shared<py::function>(std::move(barrier));
  o.callbacks.allgather = [keep_allgather](std::span<const std::byte> mine, std::span<std::byte> all) {
    py::gil_scoped_acquire gil;
    py::bytes out = (*keep_allgather)(py::bytes(reinterpret_cast<const char*>(mine.data()), mine.size()));
    const std::string s = out;
    if (s.size() != all.size())
      throw runtime::BootstrapError("railyard: the allgather callback returned " + std::to_string(s.size()) +
                                    " bytes; expected " + std::to_string(all.size()));
    std::memcpy(all.data(), s.data(), s.size());
  };
  o.callbacks.barrier = [keep_barrier] {
    py::gil_scoped_acquire gil;
    (*keep_barrier)();
  };
  return PyBootstrap{std::make_unique<runtime::CallbackBootstrap>(std::move(o))};
}

BufferConfig make_config(int64_t hidden, int64_t max_tokens, int64_t num_ranks, int64_t experts_per_rank,
                         bool fp8, int64_t max_top_k, int64_t ranks_per_domain) {
  BufferConfig c;
  c.hidden = hidden;
  c.max_tokens_per_rank = max_tokens;
  c.num_ranks = num_ranks;
  c.experts_per_rank = experts_per_rank;
  c.num_experts = num_ranks * experts_per_rank;
  c.ranks_per_domain = ranks_per_domain;
  c.dispatch_dtype = fp8 ? DType::FP8_E4M3 : DType::BF16;
  c.max_top_k = max_top_k;
  return c;
}

py::dict info(const BufferEntry& e) {
  py::dict d;
  d["id"] = e.id;
  d["rank"] = e.buffer->rank();
  d["device"] = e.device;
  d["required_bytes"] = Buffer::required_bytes(e.buffer->config());
  d["ranks_per_domain"] = e.buffer->config().ranks_per_domain;
  d["transport"] = to_string(e.buffer->transport());
  return d;
}

// Collective. Returns the buffer's id and a description.
py::dict create_buffer(PyBootstrap& bootstrap, int64_t hidden, int64_t max_tokens, int64_t experts_per_rank,
                       bool fp8, int64_t max_top_k, std::optional<int64_t> ranks_per_domain, int dispatch_sms,
                       int combine_sms, int dispatch_chunk_rows, int combine_chunk_rows, uint64_t timeout_cycles,
                       uint64_t handshake_timeout_cycles, bool check_routing, const std::string& transport,
                       uint64_t nccl_comm) {
  if (!bootstrap.bootstrap) throw std::invalid_argument("railyard: this bootstrap was already used by a Buffer");
  auto entry = std::make_shared<BufferEntry>();
  entry->bootstrap = std::move(bootstrap.bootstrap);
  entry->check_routing = check_routing;
  const int64_t R = entry->bootstrap->size();
  BufferOptions options;
  options.allocator = &output_allocator();
  if (ranks_per_domain) options.topology_options.ranks_per_domain = static_cast<int>(*ranks_per_domain);
  {
    // The NVLink domains: detected (collective), or the caller's override; the config
    // says the same (several domains take the RDMA path between them).
    py::gil_scoped_release nogil;
    options.topology = runtime::detect_topology(*entry->bootstrap, options.topology_options);
  }
  const BufferConfig config =
      make_config(hidden, max_tokens, R, experts_per_rank, fp8, max_top_k, options.topology->ranks_per_domain);
  options.dispatch_sms = dispatch_sms;
  options.combine_sms = combine_sms;
  options.dispatch_chunk_rows = dispatch_chunk_rows;
  options.combine_chunk_rows = combine_chunk_rows;
  options.timeout_cycles = timeout_cycles;
  options.handshake_timeout_cycles = handshake_timeout_cycles;
  if (transport == "mlx5") options.transport = Transport::Mlx5;
  else if (transport == "gin") options.transport = Transport::Gin;
  else if (transport != "auto")
    throw std::invalid_argument("railyard.Buffer: transport is '" + transport + "'; expected 'auto', 'mlx5' or 'gin'");
  options.nccl_comm = reinterpret_cast<void*>(static_cast<uintptr_t>(nccl_comm));  // an ncclComm_t, or 0
  {
    py::gil_scoped_release nogil;
    entry->device = runtime::gpu::current();
    entry->buffer = std::make_unique<Buffer>(config, *entry->bootstrap, options);
  }
  add_buffer(entry);
  return info(*entry);
}

// Collective: every rank destroys its buffers in the same order.
void destroy_buffer(int64_t id) {
  auto entry = remove_buffer(id);
  if (!entry) return;
  py::gil_scoped_release nogil;
  make_current(entry->device);
  entry->buffer->destroy();
}

// Runs `body`; a kernel failure it meets (railyard::Error Timeout naming the rank and
// the peer or row; Aborted naming the rank that gave up and why) is raised as the ops
// raise it.
template <class F>
void raising_kernel_failures(F&& body) {
  try {
    body();
  } catch (const railyard::Error& e) {
    const char* prefix = kernel_failure_prefix(e.code());
    if (prefix == nullptr) throw;
    throw std::runtime_error(prefix + std::string(e.what()));
  }
}

// Waits for the buffer's stream (the current one on a GPU).
void synchronize_buffer(int64_t id) {
  auto entry = get_buffer(id, "synchronize");
  py::gil_scoped_release nogil;
  make_current(entry->device);
  raising_kernel_failures([&] { entry->buffer->synchronize(op_stream(*entry)); });
}

// Collective: Buffer::barrier on the buffer's stream (the current one on a GPU), then
// waits for it, so the caller goes on only once every rank has entered the barrier.
void barrier_buffer(int64_t id) {
  auto entry = get_buffer(id, "barrier");
  py::gil_scoped_release nogil;
  make_current(entry->device);
  const GpuStream stream = op_stream(*entry);
  raising_kernel_failures([&] {
    entry->buffer->barrier(stream);
    entry->buffer->synchronize(stream);
  });
}

#if RAILYARD_IS_SIM
// One rank of a simulator run: its coordinates and the run's rendezvous (the
// bootstraps of its Buffers, railyard.sim's barrier and collectives).
struct SimRank {
  std::shared_ptr<runtime::InProcessGroup> rendezvous;
  int rank = 0;
  int size = 1;
};

// One round of the rendezvous: every rank's bytes in rank order. Waits without the
// GIL (the other rank threads need it to arrive).
py::list sim_exchange(SimRank& r, py::bytes mine, const std::string& what) {
  const std::string s = mine;
  std::vector<std::vector<std::byte>> all;
  {
    py::gil_scoped_release nogil;
    all = r.rendezvous->exchange(r.rank, std::as_bytes(std::span<const char>(s.data(), s.size())), what.c_str());
  }
  py::list out;
  for (const auto& part : all) out.append(py::bytes(reinterpret_cast<const char*>(part.data()), part.size()));
  return out;
}

// Resets the simulator, makes `world_size` simulated GPUs in domains of
// `ranks_per_domain`, and runs fn(SimRank) on one thread per rank (each with its device
// current). fn must not raise (python/railyard/sim.py catches and reports).
void sim_run(int world_size, int ranks_per_domain, uint64_t seed, const std::string& device, double preemption,
             double timeout_seconds, int sm_count, bool timed, py::function fn) {
  if (world_size < 1) throw std::invalid_argument("railyard.sim.run: world_size is " + std::to_string(world_size) + "; expected >= 1");
  if (ranks_per_domain < 1 || world_size % ranks_per_domain != 0)
    throw std::invalid_argument("railyard.sim.run: ranks_per_domain is " + std::to_string(ranks_per_domain) +
                                "; expected a divisor of world_size = " + std::to_string(world_size));
  sim::DeviceProps props;
  if (device == "h100") props = sim::h100_props();
  else if (device == "b200") props = sim::b200_props();
  else throw std::invalid_argument("railyard.sim.run: device is '" + device + "'; expected 'h100' or 'b200'");
  if (sm_count > 0) props.sm_count = sm_count;
  sim::Config config;
  config.seed = seed;
  config.preemption = preemption;
  config.timed = timed;
  sim::reset(config);
  for (int r = 0; r < world_size; ++r) {
    props.nvlink_domain = r / ranks_per_domain;
    sim::add_device(props);
  }
  // The ranks' meeting point: a waiting rank lets the engine run the others' kernels,
  // and a rank that fails aborts it, so its peers raise at once.
  auto rendezvous = runtime::InProcessGroup::create(
      {.num_ranks = world_size,
       .timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)),
       .waiting = runtime::sim_waiting()});
  py::gil_scoped_release nogil;
  sim::run_ranks(world_size, [&](int rank) {
    runtime::gpu::set_current(rank);
    py::gil_scoped_acquire gil;
    fn(SimRank{rendezvous, rank, world_size});
  });
}

// Timed mode (railyard.sim.record_event and the rest): events on the calling rank's
// stream, the one its Buffer's operations use.
int sim_record_event() { return sim::record_event(sim::default_stream(runtime::gpu::current())).id; }
void sim_wait_event(int event) {
  sim::stream_wait_event(sim::default_stream(runtime::gpu::current()), sim::Event{event});
}
double sim_elapsed_ns(int start, int end) {
  {
    py::gil_scoped_release nogil;  // the other ranks' threads may need it to finish the work
    sim::event_synchronize(sim::Event{start});
    sim::event_synchronize(sim::Event{end});
  }
  return sim::elapsed_ns(sim::Event{start}, sim::Event{end});
}
py::list sim_busy_time() {
  py::list out;
  for (const sim::BusyTime& b : sim::busy_time()) {
    py::dict d;
    d["nvlink_out"] = b.nvlink_out_ns, d["nvlink_in"] = b.nvlink_in_ns, d["hbm"] = b.hbm_ns;
    d["sm_issue"] = b.sm_issue_ns, d["sm_smem"] = b.sm_smem_ns, d["sm_tma"] = b.sm_tma_ns;
    d["nic_tx"] = b.nic_tx_ns, d["nic_rx"] = b.nic_rx_ns;
    out.append(d);
  }
  return out;
}

py::dict sim_traffic() {
  const sim::Traffic t = sim::traffic();
  py::dict d;
  d["num_devices"] = t.num_devices;
  d["write_bytes"] = t.write_bytes;
  d["read_bytes"] = t.read_bytes;
  d["nic_bytes"] = t.nic_bytes;  // [from * num_devices + to]: bytes a device's NIC placed in another's memory
  return d;
}
#endif

}  // namespace
}  // namespace railyard::python

PYBIND11_MODULE(RAILYARD_MODULE_NAME, m) {
  using namespace railyard::python;
  m.doc() = "Railyard's buffer, bootstrap and simulator controls (see docs/python-api.md)";
  m.attr("flavour") = RAILYARD_IS_SIM ? "sim" : "cuda";
  py::class_<PyBootstrap>(m, "Bootstrap");
  m.def("callback_bootstrap", &callback_bootstrap, py::arg("rank"), py::arg("size"), py::arg("allgather"),
        py::arg("barrier"));
  m.def("create_buffer", &create_buffer, py::arg("bootstrap"), py::arg("hidden"), py::arg("max_tokens"),
        py::arg("experts_per_rank"), py::arg("fp8"), py::arg("max_top_k"), py::arg("ranks_per_domain"),
        py::arg("dispatch_sms"), py::arg("combine_sms"), py::arg("dispatch_chunk_rows"), py::arg("combine_chunk_rows"),
        py::arg("timeout_cycles"), py::arg("handshake_timeout_cycles"), py::arg("check_routing"),
        py::arg("transport"), py::arg("nccl_comm") = 0);
  m.def("destroy_buffer", &destroy_buffer, py::arg("id"));
  m.def("synchronize_buffer", &synchronize_buffer, py::arg("id"));
  m.def("barrier_buffer", &barrier_buffer, py::arg("id"));
  m.def("bootstrap_allgather", [](PyBootstrap& b, py::bytes mine) {
    // The bootstrap's own allgather (size check first, then the transport): lets a test
    // drive a Python group through the C++ side.
    const std::string s = mine;
    std::vector<std::byte> all;
    {
      py::gil_scoped_release nogil;
      all = b.bootstrap->allgather(std::as_bytes(std::span<const char>(s.data(), s.size())));
    }
    return py::bytes(reinterpret_cast<const char*>(all.data()), all.size());
  });
  m.def("required_bytes", [](int64_t hidden, int64_t max_tokens, int64_t num_ranks, int64_t experts_per_rank,
                             bool fp8, int64_t max_top_k) {
    return railyard::Buffer::required_bytes(
        make_config(hidden, max_tokens, num_ranks, experts_per_rank, fp8, max_top_k, num_ranks));
  });
#if RAILYARD_IS_SIM
  py::class_<SimRank>(m, "SimRank")
      .def_readonly("rank", &SimRank::rank)
      .def_readonly("size", &SimRank::size)
      .def("bootstrap", [](SimRank& r) { return PyBootstrap{r.rendezvous->bootstrap(r.rank)}; })
      .def("exchange", &sim_exchange, py::arg("mine"), py::arg("what"))
      .def("abort", [](SimRank& r, const std::string& why) { r.rendezvous->abort(r.rank, why, "railyard.sim:"); },
           py::arg("why"));
  m.def("sim_run", &sim_run, py::arg("world_size"), py::arg("ranks_per_domain"), py::arg("seed"), py::arg("device"),
        py::arg("preemption"), py::arg("timeout_seconds"), py::arg("sm_count"), py::arg("timed"), py::arg("fn"));
  m.def("sim_traffic", &sim_traffic);
  m.def("sim_record_event", &sim_record_event);
  m.def("sim_wait_event", &sim_wait_event, py::arg("event"));
  m.def("sim_elapsed_ns", &sim_elapsed_ns, py::arg("start"), py::arg("end"));
  m.def("sim_busy_time", &sim_busy_time);
  m.def("sim_reset_traffic", [] { railyard::sim::reset_traffic(); });
#endif
}
