// Railyard: the mlx5 NIC model. It executes exactly the bytes the device code wrote:
// on a doorbell it parses every new WQE of the send queue with transport/mlx5/wire.cuh's
// parser, checks keys and bounds, moves RDMA WRITEs in MTU-sized pieces (in order per
// QP, interleaved across QPs by a seeded choice) and 8-byte atomics into the connected
// peer's registered memory, and writes CQEs (owner bit, wqe_counter, QPN, syndrome)
// into the CQ ring.
//
// It touches the world only through a NicWorld: every read and write of memory, its
// faults, the weak memory mode's checks and the timed mode's clock. Two worlds run it:
//   sim::Nic (nic.hpp)              the simulator's agent: simulated GPU memory, the
//                                   engine's weak memory mode and timed mode;
//   emulator::NicEmulator           a CPU thread beside a real GPU: queues in mapped
//   (src/emulator)                  pinned host memory, payload in GPU memory.
// docs/simulator.md, "The simulated NIC", says what is modelled and what is not.
//
// In the timed mode its work takes simulated time by a TimingModel (the nic_*
// constants): a doorbell is seen nic_doorbell_ns after its store, each packet passes
// this NIC's TX pipe (and PCIe read pipe for a payload in memory) and the peer's RX
// pipe and lands after the latencies, an atomic executes nic_atomic_ns after it
// arrives, and a CQE is written once the ACK is back. Bytes appear in memory at those
// times: the model is a source of timed events (next_event_ns).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <source_location>
#include <string>
#include <vector>

#include "railyard/sim/sim.hpp"
#include "railyard/transport/mlx5/queue_pair.hpp"
#include "railyard/transport/mlx5/wire.cuh"

namespace railyard::sim {

struct NicConfig {
  uint64_t seed = 1;
  uint32_t mtu_bytes = 4096;  // what every reference configures (rdma-design.md §6)
  // The NIC's 8-byte atomic mode: false adds in the host's (little-endian) order,
  // true treats the target as big-endian (rdma-design.md §2.8).
  bool atomics_big_endian = false;
  // Seeded delays: the probability that a step with work pending moves nothing (the
  // link or the NIC's pipeline is busy), so that kernels see completions late and
  // QPs fall behind one another. Untimed mode only (the timed mode's delays are its
  // model's).
  double stall_probability = 0.0;
  // Relaxed-ordering placement (memory registered with IBV_ACCESS_RELAXED_ORDERING,
  // as IBGDA transports register it): the RDMA WRITEs of a QP before its next atomic
  // are placed in any interleaving of their MTU-sized pieces, and the pieces of one
  // WRITE in any order, so a later byte may land before an earlier one. An atomic still
  // waits for every earlier WRITE of its QP, and completions stay in order (a CQE
  // covers its WQE and every earlier one).
  bool relaxed_ordering = false;
  // Fault injection: from this doorbell on (counted per QP, from 0) the NIC sees the
  // doorbell record as it was at the previous doorbell, as if the record's store
  // reached it late: the NIC refuses the doorbell ("record behind the doorbell").
  uint64_t late_doorbell_record_from = UINT64_MAX;
  // What the runtime reports of this NIC (runtime::rdma::NicAttributes::gpu_initiated):
  // false models a NIC the GPU cannot drive itself (EFA, another vendor's RoCE NIC), for
  // which Transport::Auto picks GIN. The model executes the same either way (the
  // simulator's GIN stand-in posts through it).
  bool gpu_initiated = true;
  // Fault injection: after this many packets the link goes down. The request in hand
  // fails with syndrome 0x15 (transport retries exceeded, as when the retry budget
  // runs out on a real link) and, the QP being in error, every later one is flushed.
  uint64_t link_down_after_packets = UINT64_MAX;
};

// A queue pair's queues in its device's memory, as the NIC created them; the host
// copies these into transport::mlx5::QueuePair.
struct NicQueues {
  uint32_t qpn = 0;
  uint8_t* sq = nullptr;
  uint32_t log2_sq_wqebbs = 0;
  uint32_t* dbr = nullptr;  // two BE32 words
  uint64_t* uar = nullptr;  // the doorbell, registered with sim::register_doorbell
  transport::mlx5::Cqe* cq = nullptr;
  uint32_t log2_ncqe = 0;
  uint32_t* cq_dbr = nullptr;
};

// What the model asks of the world it runs in. Memory is named by the addresses the
// queues and registrations hold (the GPU's view; the host reaches it through the world).
class NicWorld {
 public:
  virtual ~NicWorld() = default;
  // Copies `bytes` the NIC reads (a WQE, a record, a payload, an atomic's target).
  virtual void read(void* to, const void* from, std::size_t bytes) = 0;
  // Places `bytes` in memory. Plain: payload. Release: a strong write that publishes
  // everything the NIC placed before it (an atomic, a CQE's owner word); `what` and
  // `loc` (the model's line) name it for reports.
  virtual void write(void* to, const void* from, std::size_t bytes, AgentOrder order, const char* what,
                     std::source_location loc = std::source_location::current()) = 0;
  // The NIC refuses to go on (a doorbell rung before its WQE was written, ...): the
  // report says which NIC, which QP and why. The QP is dead from here on.
  virtual void fault(const std::string& report) = 0;
  // Weak memory mode: what the last store to the doorbell `uar` released, and whether
  // bytes the NIC reads were covered by it (false: the world has reported the race).
  virtual uint64_t doorbell_release(const void* /*uar*/) { return 0; }
  virtual bool read_released(const void* /*ptr*/, std::size_t /*bytes*/, uint64_t /*released*/,
                             const char* /*what*/, std::source_location /*loc*/ = std::source_location::current()) {
    return true;
  }
  // Payload and atomic bytes placed at the peer's device (traffic accounting).
  virtual void count_bytes(int /*peer_device*/, std::size_t /*bytes*/) {}
  // Timed mode only (sim.hpp's doorbell_rung_ns, take_doorbell and nic_pass).
  virtual double doorbell_rung_ns(const void* uar);
  virtual void take_doorbell(const void* uar);
  virtual double pass(int device, NicPipe pipe, double ready_ns, std::size_t bytes);
};

class NicModel {
 public:
  // `device`: the device whose NIC this is (for reports and traffic); `name` names it
  // in reports ("simulated NIC of device 0"). Timed: by `model`'s constants.
  NicModel(NicWorld& world, int device, std::string name, NicConfig config, bool timed = false,
           TimingModel model = {});
  NicModel(const NicModel&) = delete;
  NicModel& operator=(const NicModel&) = delete;

  int device() const { return device_; }

  // Fault injection between operations (with no request in flight): the link goes
  // down after `more` packets from now, as NicConfig::link_down_after_packets.
  void link_down_after(uint64_t more) { config_.link_down_after_packets = packets_ + more; }

  // Registers [base, base + bytes) for local and remote access; returns its key (lkey
  // and rkey alike). The caller has checked that the memory is the device's.
  uint32_t register_memory(void* base, std::size_t bytes);
  // Ends a registration: later requests naming the key fail their key check.
  void deregister_memory(uint32_t key);

  // Takes a queue pair whose queues the caller laid out in this device's memory (as
  // CREATE_QP over DEVX user memory does) and returns it with its QPN: from here on the
  // NIC reads the send queue and doorbell record, takes doorbells at `uar` and writes
  // CQEs. It initialises nothing: the CQEs must already read as not written.
  NicQueues adopt_qp(NicQueues queues);
  std::size_t num_qps() const { return qps_.size(); }
  // Throws std::invalid_argument, naming `call`, for queue sizes the NIC does not take.
  static void check_queue_sizes(const char* call, uint32_t log2_sq_wqebbs, uint32_t log2_ncqe);
  // Every CQE of a ring as not written (op_own kCqeInitialOpOwn), as DOCA's
  // mlx5_init_cqes leaves a new CQ; host memory only.
  static void init_cqes(transport::mlx5::Cqe* cq, uint32_t log2_ncqe);

  // Connects this NIC's QP `qpn` to QP `peer_qpn` of `peer` (RC: each QP reaches one
  // peer). One end at a time, as each rank moves its own QP to RTR with its peer's
  // endpoint: the peer's end is connected by the peer.
  void connect(uint32_t qpn, NicModel& peer, uint32_t peer_qpn);

  // One step of work (doorbells, then one packet): false when there was none. In the
  // timed mode, the event next_event_ns() names (kNoEvent: none).
  bool step();
  double next_event_ns() const;
  std::string describe() const;

 private:
  struct Region {
    uintptr_t base = 0;
    std::size_t bytes = 0;
  };
  struct Request {
    transport::mlx5::ParsedWqe wqe;
    uint32_t index = 0;  // the WQE's WQEBB index, never wrapped
    std::vector<uint8_t> bytes;  // the WQE as fetched (inline payloads)
    uint32_t done_bytes = 0;  // placed
    // Relaxed ordering: the MTU-sized pieces not placed yet (their indices), in the
    // order they are drawn from; empty until the first piece.
    std::vector<uint32_t> unplaced;
    bool checked = false;     // its first-packet checks passed
    uint64_t released = 0;    // what its doorbell released (weak mode: sim::doorbell_release)
    double ready_ns = 0;      // timed mode: fetched, its first packet may leave
    double acked_ns = 0;      // timed mode: the ACK of its last packet is back
  };
  enum class QpState { ReadyToSend, Error };
  struct Qp {
    NicQueues queues;
    NicModel* peer = nullptr;
    uint32_t peer_qpn = 0;
    QpState state = QpState::ReadyToSend;
    uint64_t last_doorbell = 0;
    uint64_t doorbells = 0;
    uint32_t previous_record = 0;  // the send record at the last doorbell (BE32 as read)
    uint32_t fetched = 0;  // the next WQE's index (WQEBBs fetched)
    uint32_t completed = 0;
    uint32_t cqes_written = 0;
    std::deque<Request> pending;
    std::string last_error;
    bool dead = false;  // the device faulted on this QP's behalf: nothing more runs
    double landed_ns = 0;  // timed mode: its last packet lands (packets land in order)
    double cqe_ns = 0;     // timed mode: its last CQE is written (CQEs are written in order)
  };

  static std::string hex(uint64_t v);  // "0x..." for reports
  Qp& qp(uint32_t qpn);
  bool take_doorbell(Qp& q);
  bool fetch_wqes(Qp& q, uint32_t last_idx, uint64_t released);
  bool reads_released(Qp& q, const void* ptr, std::size_t bytes, uint64_t released, const char* what);
  std::vector<uint8_t> gather_wqe(const Qp& q, uint32_t index) const;
  bool step_timed();
  Qp* next_to_send(double now);
  // Timed mode: a packet of `bytes` for q's peer leaves now (`read`: its payload is
  // read from GPU memory over PCIe first); when it lands there.
  double transmit(Qp& q, std::size_t bytes, bool read);
  // Runs `event` at `ns` in the timed mode, at once otherwise.
  void at(double ns, std::function<void()> event);
  void execute_packet(Qp& q);
  bool start(Qp& q, Request& r);
  Request& pick(Qp& q);
  void retire_placed_writes(Qp& q);
  void execute_write(Qp& q, Request& r);
  void execute_atomic(Qp& q, Request& r);
  uint64_t apply_atomic(const transport::mlx5::ParsedWqe& w);  // at the responder: the old value's bytes
  transport::mlx5::Syndrome check_access(const Qp& q, const Request& r, uint64_t length) const;
  void complete(Qp& q, const Request& r, transport::mlx5::Syndrome syndrome, bool error);
  void write_cqe(Qp& q, const transport::mlx5::CqeFields& fields);
  void fail(Qp& q, const std::string& what);
  bool connected_back(const Qp& q) const;
  bool in_region(const NicModel& nic, uint32_t key, uint64_t addr, uint64_t length) const;

  NicWorld& world_;
  int device_;
  std::string name_;  // "simulated NIC of device d", for reports
  NicConfig config_;
  std::mt19937_64 rng_;
  std::map<uint32_t, Region> regions_;  // by key
  std::map<uint32_t, Qp> qps_;          // by QPN
  uint32_t next_key_ = 0x100;
  uint64_t packets_ = 0;  // packets executed, for link_down_after_packets
  // ---- timed mode ----
  bool timed_;
  TimingModel model_;
  double now_ns_ = 0;        // the event being run
  double next_send_ns_ = 0;  // the TX and PCIe read pipes take the next packet
  uint32_t last_sent_qpn_ = 0;  // QPs send in turn, from the one after it
  // Pending events (packets landing, atomics, CQEs) by (time, order of scheduling).
  std::map<std::pair<double, uint64_t>, std::function<void()>> events_;
  uint64_t events_scheduled_ = 0;
};

}  // namespace railyard::sim
