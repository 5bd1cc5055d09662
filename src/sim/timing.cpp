// Railyard simulator: the timed mode's resources and costs (timing.hpp).
#include "timing.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "engine.hpp"

namespace railyard::sim::detail {

namespace {
constexpr uintptr_t kLineBytes = 128;
}

void Timing::reset(bool enabled) {
  enabled_ = enabled;
  devices_.clear();
  visible_at_.clear();
  doorbells_.clear();
  waits_.clear();
}

void Timing::add_device(const DeviceProps& props) {
  const TimingModel& m = props.timing;
  if (!(m.sm_clock_ghz > 0 && m.issue_ops_per_cycle > 0 && m.smem_bytes_per_cycle > 0 && m.tma_gbps > 0 &&
        m.hbm_gbps > 0 && m.nvlink_gbps > 0 && m.nic_gbps > 0 && m.nic_pcie_gbps > 0 && m.l1_bytes >= 128))
    throw std::invalid_argument("railyard::sim::add_device: device '" + props.name +
                                "' has a TimingModel with a clock or bandwidth <= 0 or l1_bytes < 128; expected every one > 0 and "
                                "l1_bytes >= 128");
  Device d;
  d.model = m;
  d.hbm.ns_per_byte = 1.0 / m.hbm_gbps;
  d.nvlink_out.ns_per_byte = d.nvlink_in.ns_per_byte = 1.0 / m.nvlink_gbps;
  d.nic_tx.ns_per_byte = d.nic_rx.ns_per_byte = 1.0 / m.nic_gbps;
  d.nic_pcie.ns_per_byte = 1.0 / m.nic_pcie_gbps;
  const int slots = props.sm_count * props.max_blocks_per_sm;
  d.sms.resize(static_cast<std::size_t>(props.sm_count));
  for (Sm& sm : d.sms) {
    sm.issue.ns_per_byte = 1.0 / (m.issue_ops_per_cycle * m.sm_clock_ghz);  // one "byte" per thread operation
    sm.smem.ns_per_byte = 1.0 / (m.smem_bytes_per_cycle * m.sm_clock_ghz);
    sm.tma.ns_per_byte = 1.0 / m.tma_gbps;
    sm.l1.assign(static_cast<std::size_t>(m.l1_bytes / static_cast<double>(kLineBytes)), 0);
  }
  for (int s = slots - 1; s >= 0; --s) d.free_sms.push_back(s % props.sm_count);
  devices_.push_back(std::move(d));
}

int Timing::take_sm(int device) {
  Device& d = devices_[device];
  const int sm = d.free_sms.back();
  d.free_sms.pop_back();
  empty_l1(d.sms[sm]);  // a new block starts with an empty L1
  return sm;
}

void Timing::release_sm(int device, int sm) { devices_[device].free_sms.push_back(sm); }

std::vector<BusyTime> Timing::busy() const {
  std::vector<BusyTime> out;
  if (!enabled_) return out;
  for (const Device& d : devices_) {
    BusyTime b{.hbm_ns = d.hbm.busy_ns,
               .nvlink_out_ns = d.nvlink_out.busy_ns,
               .nvlink_in_ns = d.nvlink_in.busy_ns,
               .nic_tx_ns = d.nic_tx.busy_ns,
               .nic_rx_ns = d.nic_rx.busy_ns,
               .nic_pcie_ns = d.nic_pcie.busy_ns};
    for (const Sm& sm : d.sms) {
      b.sm_issue_ns = std::max(b.sm_issue_ns, sm.issue.busy_ns);
      b.sm_smem_ns = std::max(b.sm_smem_ns, sm.smem.busy_ns);
      b.sm_tma_ns = std::max(b.sm_tma_ns, sm.tma.busy_ns);
    }
    out.push_back(b);
  }
  return out;
}

void Timing::reset_busy() {
  for (Device& d : devices_) {
    d.hbm.busy_ns = d.nvlink_out.busy_ns = d.nvlink_in.busy_ns = 0;
    d.nic_tx.busy_ns = d.nic_rx.busy_ns = d.nic_pcie.busy_ns = 0;
    for (Sm& sm : d.sms) sm.issue.busy_ns = sm.smem.busy_ns = sm.tma.busy_ns = 0;
  }
  waits_.clear();
}

namespace {
// Adds the waits `w` to `t`, whose longest becomes w's if that is longer.
void add_waits(WaitTotal& t, const WaitTotal& w) {
  t.waits += w.waits;
  t.total_ns += w.total_ns;
  if (w.max_ns > t.max_ns) {
    t.max_ns = w.max_ns;
    t.longest_device = w.longest_device;
    t.longest_index = w.longest_index;
    t.longest_value = w.longest_value;
  }
}
}  // namespace

void Timing::waited(const Waited& what, device::Loc loc, double ns) {
  add_waits(waits_[{what.what, loc.file_name(), loc.line()}],
            {.waits = 1, .total_ns = ns, .max_ns = ns, .longest_device = what.device,
             .longest_index = what.index, .longest_value = what.value});
}

std::vector<WaitTotal> Timing::wait_profile() const {
  std::map<std::pair<std::string, std::string>, WaitTotal> by_label;
  for (const auto& [key, w] : waits_) {
    const auto& [what, file, line] = key;
    const std::string where = project_file(file) + ":" + std::to_string(line);
    WaitTotal& t = by_label[{what, where}];
    t.what = what;
    t.where = where;
    add_waits(t, w);
  }
  std::vector<WaitTotal> out;
  for (auto& [label, w] : by_label) out.push_back(std::move(w));
  std::stable_sort(out.begin(), out.end(), [](const WaitTotal& a, const WaitTotal& b) { return a.total_ns > b.total_ns; });
  return out;
}

double Timing::issue(Fiber* f) {
  Device& d = devices_[f->device];
  const double issued = sm_of(f).issue.pass(f->clock_ns, 1.0);
  f->clock_ns = issued + d.model.op_cycles / d.model.sm_clock_ghz;
  return issued;
}

void Timing::cycles(Fiber* f, double n) { f->clock_ns += n / devices_[f->device].model.sm_clock_ghz; }

double Timing::move(int self, Target where, double start, std::size_t bytes, bool to_target) {
  Device& mine = devices_[self];
  const auto b = static_cast<double>(bytes);
  if (where.kind == Target::Kind::Local) return mine.hbm.pass(start, b);
  // Over NVLink: a write leaves this device's link and enters the owner's, a read the
  // reverse, and the owner's memory serves it. Pinned host memory (owner -1) is
  // charged to this device's link only.
  const bool peer = where.owner >= 0;
  double done = (to_target ? mine.nvlink_out : mine.nvlink_in).pass(start, b);
  if (peer) {
    Device& other = devices_[where.owner];
    done = std::max(done, (to_target ? other.nvlink_in : other.nvlink_out).pass(start, b));
    done = std::max(done, other.hbm.pass(start, b));
  }
  return done;
}

double Timing::through_smem(Fiber* f, double start, std::size_t bytes, double latencies) {
  const TimingModel& m = devices_[f->device].model;
  return sm_of(f).smem.pass(start, static_cast<double>(bytes)) +
         latencies * m.smem_latency_cycles / m.sm_clock_ghz;
}

void Timing::wait_for_stores(Fiber* f, bool remote) {
  f->clock_ns = std::max({f->clock_ns, f->local_stores_done_ns, remote ? f->remote_stores_done_ns : 0.0});
}

bool Timing::l1_hit(Fiber* f, uintptr_t sim_address) {
  std::vector<uintptr_t>& l1 = sm_of(f).l1;
  const uintptr_t line = sim_address / kLineBytes + 1;
  uintptr_t& set = l1[line % l1.size()];
  const bool hit = set == line;
  set = line;
  return hit;
}

Timing::Sm& Timing::sm_of(const Fiber* f) { return devices_[f->device].sms[f->block->sm]; }

void Timing::empty_l1(Sm& sm) { std::fill(sm.l1.begin(), sm.l1.end(), 0); }

double Timing::in_flight_until(const void* ptr) const {
  auto it = visible_at_.find(reinterpret_cast<uintptr_t>(ptr));
  return it != visible_at_.end() ? it->second : 0.0;
}

void Timing::load(Fiber* f, Target where, const void* ptr, std::size_t bytes, bool strong, bool acquire, bool sys) {
  const double t = issue(f);
  const TimingModel& m = devices_[f->device].model;
  const bool acquire_sys = acquire && sys;
  double done;
  if (where.kind == Target::Kind::Shared) {
    done = through_smem(f, t, bytes, 1);
  } else if (where.kind == Target::Kind::Local && !strong &&
             l1_hit(f, reinterpret_cast<uintptr_t>(ptr) + where.sim_offset)) {
    done = t + m.l1_latency_cycles / m.sm_clock_ghz;
  } else {
    const bool remote = where.kind == Target::Kind::Remote;
    done = move(f->device, where, t, bytes, false) + (remote ? m.remote_load_ns : m.global_latency_ns);
    if (acquire_sys) done += m.acquire_sys_extra_ns;
  }
  if (strong) done = std::max(done, in_flight_until(ptr));  // a value still in flight is seen when it arrives
  if (acquire) empty_l1(sm_of(f));
  f->clock_ns = std::max(f->clock_ns, done);
}

void Timing::release(Fiber* f, int scope) {
  // st.release / red.release compile to the fence of their scope and a strong access
  // (MEMBAR.GPU or MEMBAR.SYS, then ST.STRONG): the same cost as fence(), without the
  // acquire half that empties L1.
  const TimingModel& m = devices_[f->device].model;
  if (scope == 0) return cycles(f, m.op_cycles);
  wait_for_stores(f, scope == 2);
  f->clock_ns += scope == 2 ? m.fence_sys_ns : m.fence_gpu_ns;
}

void Timing::store(Fiber* f, Target where, const void* ptr, std::size_t bytes, bool strong) {
  const double t = issue(f);
  const TimingModel& m = devices_[f->device].model;
  double visible;
  if (where.kind == Target::Kind::Shared) {
    visible = through_smem(f, t, bytes, 1);
  } else if (where.kind == Target::Kind::Local) {
    visible = move(f->device, where, t, bytes, true) + m.global_latency_ns;
    f->local_stores_done_ns = std::max(f->local_stores_done_ns, visible);
  } else {
    visible = move(f->device, where, t, bytes, true) + m.remote_store_ns;
    f->remote_stores_done_ns = std::max(f->remote_stores_done_ns, visible);
  }
  if (strong) visible_at_[reinterpret_cast<uintptr_t>(ptr)] = visible;
  if (!doorbells_.empty())
    if (Doorbell* d = find_doorbell(ptr, bytes); d != nullptr) {
      d->rung_ns = std::min(d->rung_ns, t);
      ++doorbell_stores_;
    }
}

void Timing::atomic(Fiber* f, Target where, const void* ptr, std::size_t bytes) {
  const double t = issue(f);
  const TimingModel& m = devices_[f->device].model;
  double done;
  if (where.kind == Target::Kind::Shared) {
    done = through_smem(f, t, bytes, 2);
  } else {
    const bool remote = where.kind == Target::Kind::Remote;
    done = move(f->device, where, t, bytes, true) + (remote ? m.remote_atomic_ns : 2 * m.global_latency_ns);
  }
  done = std::max(done, in_flight_until(ptr));
  visible_at_[reinterpret_cast<uintptr_t>(ptr)] = done;
  f->clock_ns = std::max(f->clock_ns, done);
}

void Timing::fence(Fiber* f, int scope) {
  const TimingModel& m = devices_[f->device].model;
  if (scope == 0) return cycles(f, m.op_cycles);
  wait_for_stores(f, scope == 2);
  empty_l1(sm_of(f));
  f->clock_ns += scope == 2 ? m.fence_sys_ns : m.fence_gpu_ns;
}

double Timing::bulk_g2s(Fiber* f, Target source, std::size_t bytes) {
  const double t = issue(f);
  const TimingModel& m = devices_[f->device].model;
  f->clock_ns += m.tma_issue_cycles / m.sm_clock_ghz;
  double done = std::max(sm_of(f).tma.pass(t, static_cast<double>(bytes)), move(f->device, source, t, bytes, false));
  return done + (source.kind == Target::Kind::Remote ? m.remote_load_ns : m.global_latency_ns);
}

Timing::S2G Timing::bulk_s2g(Fiber* f, Target destination, std::size_t bytes) {
  const double t = issue(f);
  const TimingModel& m = devices_[f->device].model;
  f->clock_ns += m.tma_issue_cycles / m.sm_clock_ghz;
  const double read = through_smem(f, t, bytes, 1);
  const double sent =
      std::max(sm_of(f).tma.pass(t, static_cast<double>(bytes)), move(f->device, destination, t, bytes, true));
  const double write =
      sent + (destination.kind == Target::Kind::Remote ? m.remote_store_ns : m.global_latency_ns);
  return {read, write};
}

// ---- the simulated NICs ------------------------------------------------------------------------
double Timing::nic_pass(int device, NicPipe pipe, double ready_ns, std::size_t bytes) {
  Device& d = devices_[device];
  Pipe& p = pipe == NicPipe::Tx ? d.nic_tx : pipe == NicPipe::Rx ? d.nic_rx : d.nic_pcie;
  return p.pass(ready_ns, static_cast<double>(bytes));
}

void Timing::add_doorbell(const void* ptr, std::size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  doorbells_[a] = Doorbell{.end = a + bytes};
}

void Timing::remove_doorbell(const void* ptr) { doorbells_.erase(reinterpret_cast<uintptr_t>(ptr)); }

Timing::Doorbell* Timing::find_doorbell(const void* ptr, std::size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  auto it = doorbells_.upper_bound(a + bytes - 1);
  if (it == doorbells_.begin() || std::prev(it)->second.end <= a) return nullptr;
  return &std::prev(it)->second;
}

double Timing::doorbell_rung_ns(const void* ptr) const {
  auto it = doorbells_.find(reinterpret_cast<uintptr_t>(ptr));
  return it != doorbells_.end() ? it->second.rung_ns : kNoEvent;
}

void Timing::take_doorbell(const void* ptr) {
  if (Doorbell* d = find_doorbell(ptr, 1); d != nullptr) d->rung_ns = kNoEvent;
}

}  // namespace railyard::sim::detail
