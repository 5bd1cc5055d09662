// Railyard runtime: the registered buffer's collective creation and destruction.
// Written once against device_api.hpp, compiled into both flavour libraries.
#include "railyard/runtime/registered_buffer.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "railyard/runtime/bootstrap.hpp"
#include "registered_buffer_exchange.hpp"

namespace railyard::runtime {
namespace {

using detail::StepFailure;

// What each rank tells every other about its buffer, in one allgather.
struct PeerRecord {
  std::byte handle[kHandleBytes];
  uint64_t host_id;
  uint64_t net_namespace;  // network_namespace_id(): abstract sockets stay inside one
  uint64_t socket_token;
  int32_t handle_type;
  int32_t device;
  char socket_name[detail::kSocketNameBytes];  // NUL-terminated; empty unless PosixFd
};
static_assert(std::is_trivially_copyable_v<PeerRecord>);

// The message of the exception being handled (call inside a catch block).
std::string current_exception_message() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// POSIX fds travel over Unix sockets; an abstract one is visible only inside its
// network namespace, so a domain whose ranks sit in several (one container per GPU)
// must rendezvous through socket files in a shared directory instead.
void check_fd_rendezvous(const std::vector<PeerRecord>& records, int first, int last, const std::string& domain) {
  std::map<uint64_t, std::vector<int>> ranks_by_namespace;
  std::vector<int> abstract;
  for (int r = first; r <= last; ++r) {
    const PeerRecord& record = records[static_cast<std::size_t>(r)];
    ranks_by_namespace[record.net_namespace].push_back(r);
    if (record.socket_name[0] != '\0' && record.socket_name[0] != '/') abstract.push_back(r);
  }
  if (ranks_by_namespace.size() < 2 || abstract.empty()) return;
  std::ostringstream os;
  os << "railyard RegisteredBuffer: " << domain << " passes POSIX fd handles over abstract Unix sockets (ranks "
     << format_ranks(abstract) << "), but its ranks are in " << ranks_by_namespace.size()
     << " network namespaces (";
  bool first_namespace = true;
  for (const auto& [ns, ranks] : ranks_by_namespace) {
    os << (first_namespace ? "" : "; ") << "ranks " << format_ranks(ranks);
    first_namespace = false;
  }
  os << ") and abstract sockets do not cross network namespaces (one container per GPU): set "
        "RAILYARD_FD_SOCKET_DIR (or RegisteredBufferOptions::fd_socket_dir) on every rank to a directory that "
        "every rank's container mounts at the same path";
  throw std::runtime_error(os.str());
}

// Every rank of a domain exports the same handle type, and POSIX fds stay on one host.
// Checked over every domain (not only this rank's), so that every rank decides alike.
void check_records(const std::vector<PeerRecord>& records, const Topology& topology) {
  for (int d = 0; d < topology.num_domains(); ++d) {
    const int first = d * topology.ranks_per_domain, last = first + topology.ranks_per_domain - 1;
    std::map<int32_t, std::vector<int>> ranks_by_type;
    std::map<uint64_t, std::vector<int>> ranks_by_host;
    for (int r = first; r <= last; ++r) {
      ranks_by_type[records[static_cast<std::size_t>(r)].handle_type].push_back(r);
      ranks_by_host[records[static_cast<std::size_t>(r)].host_id].push_back(r);
    }
    const std::string domain = "NVLink domain " + std::to_string(d) + " (ranks " + std::to_string(first) + "-" +
                               std::to_string(last) + ")";
    if (ranks_by_type.size() > 1) {
      std::ostringstream os;
      os << "railyard RegisteredBuffer: " << domain << " mixes handle types:";
      for (const auto& [type, ranks] : ranks_by_type)
        os << ' ' << to_string(static_cast<ShareableHandleType>(type)) << " on ranks " << format_ranks(ranks) << ';';
      os << " every rank of a domain must export the same type (RegisteredBufferOptions::handle_type)";
      throw std::runtime_error(os.str());
    }
    const auto type = static_cast<ShareableHandleType>(ranks_by_type.begin()->first);
    if ((type == ShareableHandleType::PosixFd || type == ShareableHandleType::InProcess) && ranks_by_host.size() > 1) {
      std::ostringstream os;
      os << "railyard RegisteredBuffer: " << domain << " spans " << ranks_by_host.size() << " hosts (";
      bool first_host = true;
      for (const auto& [host, ranks] : ranks_by_host) {
        os << (first_host ? "" : "; ") << "ranks " << format_ranks(ranks);
        first_host = false;
      }
      os << "), but " << to_string(type)
         << " handles cannot leave a host; multi-node NVLink needs Fabric handles";
      throw std::runtime_error(os.str());
    }
    if (type == ShareableHandleType::PosixFd) check_fd_rendezvous(records, first, last, domain);
  }
}

}  // namespace

struct RegisteredBuffer::State {
  Bootstrap* bootstrap = nullptr;
  BufferConfig config;
  Topology topology;
  int rank = -1;
  ShareableAllocation own;
  std::vector<PeerMapping> mappings;  // by domain rank; this rank's slot stays empty
  std::vector<uint8_t*> domain_ptrs;  // by domain rank
  std::vector<std::shared_ptr<MemoryRegistrar>> registered;  // those that succeeded, in order
  UniqueFd dmabuf;  // exported for the registrars, if the driver can
  std::string dmabuf_problem;

  RegisteredRegion region() const {
    return RegisteredRegion{.ptr = own.ptr, .bytes = own.bytes, .mapped_bytes = own.mapped_bytes,
                            .device = own.device, .rank = rank, .dmabuf_fd = dmabuf.get(),
                            .dmabuf_problem = dmabuf_problem};
  }

  // Releases what this rank holds. `barrier_first`: peers may map this rank's memory,
  // so wait for all of them to unmap before freeing it. Returns what went wrong.
  std::vector<std::string> release(bool barrier_first) {
    std::vector<std::string> problems;
    for (PeerMapping& m : mappings) {
      if (!m.ptr) continue;
      try {
        gpu::unmap(m);
      } catch (const std::exception& e) {
        problems.push_back(std::string("unmap: ") + e.what());
        m = PeerMapping{};  // never retried: a second unmap of the same mapping is an error
      }
    }
    for (auto it = registered.rbegin(); it != registered.rend(); ++it) (*it)->deregister_memory(region());
    registered.clear();
    if (barrier_first) {
      try {
        bootstrap->barrier();
      } catch (const std::exception& e) {
        problems.push_back(std::string("barrier before free: ") + e.what());
      }
    }
    if (own.ptr) {
      try {
        gpu::shareable_free(own);
      } catch (const std::exception& e) {
        problems.push_back(std::string("free: ") + e.what());
      }
    }
    std::fill(domain_ptrs.begin(), domain_ptrs.end(), nullptr);
    return problems;
  }
};

RegisteredBuffer::RegisteredBuffer(const BufferConfig& config, const RequiredBytes& required_bytes,
                                   Bootstrap& bootstrap, const RegisteredBufferOptions& options) {
  const int rank = bootstrap.rank();
  auto hook = [&](RegisteredBufferStep step) {
    if (options.before_step) options.before_step(step);
  };
  auto collective_error = [&](RegisteredBufferStep step, const std::string& why,
                              const std::vector<std::string>& rollback_problems) {
    std::string message = "railyard RegisteredBuffer: creation failed at step '" + std::string(to_string(step)) +
                          "' (rank " + std::to_string(rank) + "): " + why;
    for (const std::string& p : rollback_problems) message += "; while releasing: " + p;
    return RegisteredBufferError(step, {}, message);
  };

  // ---- collective steps before anything is acquired: every rank throws alike --------
  std::size_t bytes = 0;
  try {
    hook(RegisteredBufferStep::CheckConfig);
    config.check_agreement(bootstrap);
    bytes = required_bytes(config);  // the agreed config, so every rank decides alike
    if (bytes == 0)
      throw std::invalid_argument("railyard RegisteredBuffer: the caller's required_bytes(config) is 0; expected "
                                  "the bytes of the regions its path uses (> 0)");
    // The same formula on an agreed config gives the same size; a caller whose ranks
    // size it differently would corrupt peers' regions, so compare.
    const std::vector<uint64_t> all = allgather_value(bootstrap, static_cast<uint64_t>(bytes));
    for (int r = 1; r < bootstrap.size(); ++r)
      if (all[r] != all[0])
        throw std::invalid_argument("railyard RegisteredBuffer: ranks ask for different sizes: " +
                                    std::to_string(all[0]) + " bytes on rank 0, " + std::to_string(all[r]) +
                                    " on rank " + std::to_string(r) + "; expected one size (required_bytes of the "
                                    "agreed config)");
  } catch (...) {
    std::throw_with_nested(collective_error(RegisteredBufferStep::CheckConfig, current_exception_message(), {}));
  }
  Topology topology;
  try {
    hook(RegisteredBufferStep::Topology);
    topology = options.topology ? *options.topology : detect_topology(bootstrap, options.topology_options);
    struct Shape {
      int32_t num_ranks, ranks_per_domain;
    };
    // A caller-supplied topology may differ between ranks: compare everyone's with
    // rank 0's, so every rank takes the same branch.
    const std::vector<Shape> all = allgather_value(bootstrap, Shape{topology.num_ranks, topology.ranks_per_domain});
    for (int r = 1; r < bootstrap.size(); ++r)
      if (all[r].num_ranks != all[0].num_ranks || all[r].ranks_per_domain != all[0].ranks_per_domain)
        throw TopologyError("railyard RegisteredBuffer: ranks disagree on the topology: rank 0 has " +
                            std::to_string(all[0].num_ranks) + " ranks in domains of " +
                            std::to_string(all[0].ranks_per_domain) + ", rank " + std::to_string(r) + " has " +
                            std::to_string(all[r].num_ranks) + " in domains of " +
                            std::to_string(all[r].ranks_per_domain));
    if (topology.num_ranks != config.num_ranks || topology.ranks_per_domain != config.ranks_per_domain)
      throw TopologyError("railyard RegisteredBuffer: the topology is " + topology.describe() +
                          ", but the BufferConfig says num_ranks = " + std::to_string(config.num_ranks) +
                          ", ranks_per_domain = " + std::to_string(config.ranks_per_domain));
  } catch (...) {
    std::throw_with_nested(collective_error(RegisteredBufferStep::Topology, current_exception_message(), {}));
  }

  auto state = std::make_unique<State>(State{.bootstrap = &bootstrap,
                                             .config = config,
                                             .topology = topology,
                                             .rank = rank});
  State& s = *state;
  const int domain_size = topology.ranks_per_domain;
  const int domain_first = topology.domain_of(rank) * domain_size;
  s.mappings.resize(static_cast<std::size_t>(domain_size));
  s.domain_ptrs.assign(static_cast<std::size_t>(domain_size), nullptr);

  // ---- local steps, each round of them followed by an outcome exchange ----------------
  std::optional<StepFailure> failure;  // the first local step that failed on this rank
  auto local_step = [&](RegisteredBufferStep step, const std::function<void()>& fn) {
    if (failure) return;  // an earlier step failed; the rank still joins the outcome round
    try {
      hook(step);
      fn();
    } catch (...) {
      failure = StepFailure{step, current_exception_message()};
    }
  };
  // `peers_may_map`: some rank may have imported this rank's buffer by now.
  auto agree = [&](RegisteredBufferStep round, bool peers_may_map) {
    std::vector<detail::RankFailure> failures;
    try {
      failures = detail::gather_failures(bootstrap, failure);
    } catch (...) {
      // The bootstrap itself failed (a rank never arrived): no agreement is possible.
      std::throw_with_nested(collective_error(round, current_exception_message(), s.release(peers_may_map)));
    }
    if (failures.empty()) return;
    const std::vector<std::string> problems = s.release(peers_may_map);
    RegisteredBufferError error = detail::failures_error(failures, rank);
    if (problems.empty()) throw error;
    std::string message = error.what();
    for (const std::string& p : problems) message += "; while releasing: " + p;
    throw RegisteredBufferError(error.step(), error.failed_ranks(), message);
  };

  local_step(RegisteredBufferStep::Allocate, [&] {
    s.own = gpu::shareable_malloc({.bytes = bytes,
                                   .handle_type = options.handle_type,
                                   .label = "registered buffer (rank " + std::to_string(rank) + ")"});
  });
  local_step(RegisteredBufferStep::ZeroFill, [&] {
    // Flags, count rows and sequence numbers must start at 0 before any peer can see
    // the buffer (it is imported only after the next outcome round).
    const GpuStream stream = gpu::stream_create();
    try {
      gpu::memset_async(s.own.ptr, 0, s.own.bytes, stream);
      gpu::stream_synchronize(stream);
    } catch (...) {
      gpu::stream_destroy(stream);
      throw;
    }
    gpu::stream_destroy(stream);
  });
  local_step(RegisteredBufferStep::RegisterMemory, [&] {
    if (!options.registrars.empty()) {
      try {
        s.dmabuf = gpu::export_dmabuf(s.own.ptr, s.own.mapped_bytes);
      } catch (const std::exception& e) {
        s.dmabuf_problem = e.what();  // the registrars fall back (nvidia-peermem)
      }
    }
    for (const std::shared_ptr<MemoryRegistrar>& registrar : options.registrars) {
      try {
        registrar->register_memory(s.region());
      } catch (const std::exception& e) {
        throw std::runtime_error("registrar '" + registrar->name() + "': " + e.what());
      }
      s.registered.push_back(registrar);
    }
  });
  ExportedHandle exported;
  std::optional<detail::FdListener> listener;
  local_step(RegisteredBufferStep::Export, [&] {
    exported = gpu::export_handle(s.own);
    // Listen before the allgather, so the name travels with the handle.
    if (s.own.handle_type == ShareableHandleType::PosixFd && domain_size > 1)
      listener = detail::listen_for_fds(rank, detail::fd_socket_dir(options.fd_socket_dir));
  });
  agree(RegisteredBufferStep::Export, /*peers_may_map=*/false);

  PeerRecord mine{};
  std::memcpy(mine.handle, exported.bytes.data(), kHandleBytes);
  mine.host_id = local_host_id();
  mine.net_namespace = network_namespace_id();
  mine.handle_type = static_cast<int32_t>(s.own.handle_type);
  mine.device = s.own.device;
  if (listener) {
    mine.socket_token = listener->token;
    std::snprintf(mine.socket_name, sizeof(mine.socket_name), "%s", listener->name.c_str());
  }
  std::vector<PeerRecord> records;
  try {
    hook(RegisteredBufferStep::ExchangeHandles);
    records = allgather_value(bootstrap, mine);
    check_records(records, topology);  // identical records: every rank decides alike
  } catch (...) {
    std::throw_with_nested(collective_error(RegisteredBufferStep::ExchangeHandles, current_exception_message(),
                                            s.release(/*barrier_first=*/false)));
  }

  std::map<int, UniqueFd> peer_fds;
  if (listener) {
    local_step(RegisteredBufferStep::PassFds, [&] {
      detail::FdExchange exchange{.rank = rank,
                                  .listener = listener->socket.get(),
                                  .token = listener->token,
                                  .fd = exported.fd.get(),
                                  .timeout = options.fd_timeout};
      for (int p = domain_first; p < domain_first + domain_size; ++p)
        if (p != rank) exchange.peers.push_back(p);
      for (const PeerRecord& r : records) {
        exchange.socket_names.emplace_back(r.socket_name);
        exchange.tokens.push_back(r.socket_token);
      }
      peer_fds = detail::exchange_fds(exchange);
    });
  }
  s.domain_ptrs[static_cast<std::size_t>(rank - domain_first)] = static_cast<uint8_t*>(s.own.ptr);
  local_step(RegisteredBufferStep::Import, [&] {
    for (int p = domain_first; p < domain_first + domain_size; ++p) {
      if (p == rank) continue;
      const PeerRecord& r = records[static_cast<std::size_t>(p)];
      const auto fd = peer_fds.find(p);
      PeerMapping& m = s.mappings[static_cast<std::size_t>(p - domain_first)];
      try {
        m = gpu::import_handle({.bytes = std::span<const std::byte>(r.handle, kHandleBytes),
                                .fd = fd == peer_fds.end() ? -1 : fd->second.get()});
      } catch (const std::exception& e) {
        throw std::runtime_error("importing rank " + std::to_string(p) + "'s buffer: " + e.what());
      }
      s.domain_ptrs[static_cast<std::size_t>(p - domain_first)] = static_cast<uint8_t*>(m.ptr);
    }
  });
  // Also the end of creation on every rank: nobody returns before every buffer of its
  // domain is zeroed and mapped.
  agree(RegisteredBufferStep::Import, /*peers_may_map=*/true);
  state_ = std::move(state);
}

RegisteredBuffer::RegisteredBuffer(RegisteredBuffer&& other) noexcept = default;

RegisteredBuffer::~RegisteredBuffer() {
  try {
    destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

void RegisteredBuffer::destroy() {
  if (!state_) return;
  const std::unique_ptr<State> s = std::move(state_);
  // Kernels still running (an asynchronous operation nobody waited for, an exception
  // path) access every peer's buffer through the mappings: on a GPU an unmap under
  // them is an MMU fault. So wait for the device first; a failure there (a kernel
  // that faulted) does not stop the release.
  std::vector<std::string> problems;
  try {
    gpu::device_synchronize(s->own.device);
  } catch (const std::exception& e) {
    problems.push_back(std::string("synchronize before unmap: ") + e.what());
  }
  // Unmap first: once every rank has passed the barrier, nobody maps this rank's
  // memory any more (and, its device synchronized, nobody writes into it).
  for (std::string& p : s->release(/*barrier_first=*/true)) problems.push_back(std::move(p));
  if (problems.empty()) return;
  std::string message = "railyard RegisteredBuffer: destroy on rank " + std::to_string(s->rank) + " failed:";
  for (std::size_t i = 0; i < problems.size(); ++i) message += (i ? "; " : " ") + problems[i];
  throw RegisteredBufferError(RegisteredBufferStep::Destroy, {s->rank}, message);
}

const RegisteredBuffer::State& RegisteredBuffer::state(const char* what) const {
  if (!state_)
    throw std::logic_error(std::string("railyard RegisteredBuffer::") + what +
                           ": the buffer was destroyed (or moved from)");
  return *state_;
}

int RegisteredBuffer::rank() const { return state("rank").rank; }
const BufferConfig& RegisteredBuffer::config() const { return state("config").config; }
const Topology& RegisteredBuffer::topology() const { return state("topology").topology; }
std::size_t RegisteredBuffer::bytes() const { return state("bytes").own.bytes; }
std::size_t RegisteredBuffer::mapped_bytes() const { return state("mapped_bytes").own.mapped_bytes; }
ShareableHandleType RegisteredBuffer::handle_type() const { return state("handle_type").own.handle_type; }
int RegisteredBuffer::device() const { return state("device").own.device; }
uint8_t* RegisteredBuffer::local_ptr() const { return static_cast<uint8_t*>(state("local_ptr").own.ptr); }

uint8_t* RegisteredBuffer::peer_ptr(int peer) const {
  const State& s = state("peer_ptr");
  const Topology& t = s.topology;
  if (peer < 0 || peer >= t.num_ranks || !t.same_domain(s.rank, peer)) {
    const int first = t.domain_of(s.rank) * t.ranks_per_domain;
    throw std::out_of_range("railyard RegisteredBuffer::peer_ptr: rank " + std::to_string(peer) + " is not in rank " +
                            std::to_string(s.rank) + "'s NVLink domain (ranks " + std::to_string(first) + "-" +
                            std::to_string(first + t.ranks_per_domain - 1) +
                            "); only ranks of one domain map each other's buffer");
  }
  return s.domain_ptrs[static_cast<std::size_t>(t.local_rank(peer))];
}

std::span<uint8_t* const> RegisteredBuffer::domain_ptrs() const { return state("domain_ptrs").domain_ptrs; }
int RegisteredBuffer::domain_rank() const {
  const State& s = state("domain_rank");
  return s.topology.local_rank(s.rank);
}

}  // namespace railyard::runtime
