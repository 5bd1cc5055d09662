// Railyard intra-node combine kernel (NVLink path): every home token gets the fp32
// sum, in a fixed order, of the expert outputs computed for it on every rank.
// See docs/design-intranode.md ("Combine") and docs/semantics.md sections 7-8.
//
// One launch per rank; every block is an independent channel and runs two kinds of
// jobs through ONE pipeline of three roles (192 threads):
//
//   Load (warp 0)      Reduce (warps 1-4)               Store (warp 5)
//   TMA G2S of source  fp32 sums of a piece's sources   TMA S2G of the BF16 piece
//   pieces -> FIFO --> (fixed order) -> BF16 piece ---> to its destination
//
//   stage job (received row r of this rank; local): sources are the caller's expert
//     output rows of r (one in the received layout, one per surviving local expert
//     in the permuted layout), summed in local-expert order and rounded once (the
//     unpermute); destination: this rank's own staging row r. Once it has landed,
//     its header's `seq` is released (batched; all of them at the stage jobs' end),
//     so home ranks may pull it. Rows with nothing to send (dropped by a bound) get
//     `num_entries` 0 and `seq` at once, without passing through the FIFO.
//   gather job (home token t of this rank; NVLink pull): sources are the staged rows
//     of t on every rank d that holds one, in ascending d, read over the peer mapping
//     once their header `seq` is released; the sum is rounded to BF16 per NVLink
//     domain, then the domain partials are summed and rounded (semantics.md 7);
//     destination: the caller's out[t]. A token with no source gets zeros.
//
// A block runs (and publishes) all its stage jobs before its gather jobs. Stage jobs
// never wait on another rank, so every row a gather job waits for is staged by a
// block that cannot be blocked by it: no deadlock, no cross-block communication.
// (Across domains the partial jobs come between the stage jobs of rows from other
// domains and those of the block's own domain; they wait only for the former.)
//
// Rows travel in pieces of SlotBytes; reduction warps split a piece by 16-byte
// vectors, so each reduction lane keeps only 2 x 8 x ceil(SlotBytes / 2 KiB) fp32
// accumulators (128 for 16 KiB slots), and arrives on the FIFO barriers itself (no
// warp converges per piece). The fixed order (entries ascending, ranks ascending)
// makes the result bitwise independent of the interleaving.
//
// Across NVLink domains (the Remote parameter: kernels/hierarchical/combine.cuh) a
// rank pulls over NVLink only from its own domain; between its stage and gather jobs
// it runs partial jobs: for each token its rail peers forwarded to this domain at
// dispatch, the fp32 sum of the domain's staged rows, rounded to BF16 (the domain's
// partial), into the send ring, which a seventh warp puts to the token's home rank a
// chunk at a time; a gather job adds those partials, in ascending domain order, to
// its own domain's. NoRemoteCombine: one domain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/intranode/combine.hpp"
#include "kernels/intranode/domain_checks.hpp"
#include "kernels/intranode/protocol.cuh"
#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/convert.cuh"
#include "railyard/arch/fault.cuh"
#include "railyard/arch/mbarrier.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/common/dtypes.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/common/status.hpp"
#include "railyard/layout/intranode_layout.cuh"
#include "railyard/pipeline/pipeline.cuh"
#include "railyard/pipeline/wait.cuh"

namespace railyard::kernels::intranode {

// The one-domain combine: no partials cross a NIC.
struct NoRemoteCombine {
  static constexpr const char* kName = "intranode::Combine";
  static constexpr bool kPartials = false;
  static constexpr uint32_t kWarps = 0;
  struct Params {};
  struct Storage {};
  struct RingUse {};
  struct Gather {
    RAILYARD_HOST_DEVICE Gather(const Params&, const layout::HandleView&, Storage&) {}
  };
};

template <uint32_t SlotBytes, int Stages, class Remote = NoRemoteCombine>
struct Combine {
  static_assert(Stages >= 1);
  static_assert(SlotBytes > 0 && SlotBytes % arch::kBulkCopyAlign == 0,
                "a slot holds whole 16-byte bulk-copy units");

  static constexpr uint32_t kSlotBytes = SlotBytes;
  static constexpr int kStages = Stages;
  static constexpr const char* kName = Remote::kName;  // what the simulator's and launch errors call it

  enum class WarpRole : uint32_t { Load, Reduce, Store, RdmaSend };
  static constexpr uint32_t kNumReduceWarps = 4;
  static constexpr uint32_t kNumWarps = 1 + kNumReduceWarps + 1 + Remote::kWarps;
  static constexpr uint32_t kMaxThreadsPerBlock = kNumWarps * arch::kWarpSize;
  static constexpr uint32_t kMinBlocksPerSm = 1;
  static constexpr uint32_t kNumReduceThreads = kNumReduceWarps * arch::kWarpSize;

  // A piece is split into 16-byte vectors of 8 BF16; reduction thread i owns vectors
  // i, i + kNumReduceThreads, ... of every piece.
  static constexpr uint32_t kVectorBytes = 16;
  static constexpr uint32_t kElemsPerVector = kVectorBytes / 2;
  static constexpr uint32_t kVectorsPerLane =
      (SlotBytes / kVectorBytes + kNumReduceThreads - 1) / kNumReduceThreads;
  static constexpr uint32_t kAccumulators = kVectorsPerLane * kElemsPerVector;

  // Two slots suffice between reducers and the store warp: a reduced piece is ready
  // only every (sources of the token) load slots.
  static constexpr int kStoreStages = 2;
  // The store lane gives a slot back once the next slot's store is issued and its own
  // has read it; it publishes a staged row once at most kWriteLag stores issued after
  // the row's last are still in flight, kPublishBatch rows at a time (one
  // fence.acq_rel.sys for the batch), at once when kPendingRows await it, and every
  // one at the end of the stage jobs (kFlush), before gather jobs may wait for them.
  static constexpr int kStoreReadLag = 1;
  static constexpr int kWriteLag = 4;
  static constexpr int kPublishBatch = 4;
  static constexpr int kPendingRows = 16;
  static_assert(kPublishBatch < kPendingRows);
  // Jobs (gather or partial) per batch whose sources' headers the Load warp waits for
  // together (collect_sources; fewer where their sources would pass kMaxSources): a
  // batch's first job waits for all of them.
  static constexpr int kHeaderBatch = 16;
  // Across domains: a gather batch goes before partial round j once every partial it
  // adds was put in a round up to j - 1 - kGatherLag (run_jobs), so that it seldom
  // waits for one still on the wire.
  static constexpr int64_t kGatherLag = 2;
  // Sources of one job: local experts of a received row, or ranks of a home token.
  static constexpr int kMaxSources =
      layout::kMaxLocalExperts > layout::kMaxRanksPerDomain ? layout::kMaxLocalExperts
                                                            : layout::kMaxRanksPerDomain;

  using LoadPipeline = pipeline::Pipeline<Stages>;
  using StorePipeline = pipeline::Pipeline<kStoreStages>;
  using StoreConsumer = pipeline::BulkConsumer<kStoreStages, kStoreReadLag>;

  // What a FIFO slot holds, for the roles downstream (written before the slot's
  // producer arrival, read after the consumer's wait).
  enum TagFlag : uint32_t {
    kFirst = 1u << 0,         // zero the accumulators first: a new piece starts
    kData = 1u << 1,          // the slot holds `bytes` of BF16 to add (else it adds nothing)
    kDomainEnd = 1u << 2,     // after adding: total += bf16(partial), partial = 0
    kLast = 1u << 3,          // after adding: the piece is complete, emit it
    kDomainRounded = 1u << 4, // the piece's result is `total` (gather), else `partial` (stage)
    kDone = 1u << 5,          // no more jobs: pass it on and stop
    kFlush = 1u << 6,         // stage jobs are over (across domains: those of rows from
                              // other domains, then the rest): pass it on; the store
                              // lane publishes every staged row so far
    kChunkEnd = 1u << 7,      // (Remote) the piece ends a send-ring chunk: hand it to the RDMA warp
  };
  struct SlotTag {
    uint8_t* dst;         // where the reduced piece goes
    int64_t publish_row;  // >= 0: after storing, release the header seq of own staged row
    uint32_t bytes;       // bytes of the piece
    uint32_t flags;
  };

  // Jobs' sources in summation order: the row, its rank, and (collect_sources) the
  // job of the batch it belongs to.
  struct Sources {
    arch::SharedVar<const uint8_t*> row[kMaxSources];
    arch::SharedVar<int16_t> rank[kMaxSources];
    arch::SharedVar<int16_t> job[kMaxSources];
  };

  struct SharedStorage {
    // 128: bulk copies need 16; 128 keeps every slot on its own lines.
    alignas(128) uint8_t load_slots[Stages][SlotBytes];
    alignas(128) uint8_t store_slots[kStoreStages][SlotBytes];
    arch::SharedVar<SlotTag> load_tags[Stages];
    arch::SharedVar<SlotTag> store_tags[kStoreStages];
    // Two sets of jobs' sources (Load warp only): a stage job's in set 0 from 0; a
    // gather or partial batch's as collect_sources places them, in the set its
    // Overlapped step picks (lane 0 pushes one batch while the others collect the next).
    Sources sources[2];
    // collect_sources': the (job, rank) pairs handed to the lanes that wait for their
    // headers.
    arch::SharedVar<int32_t> pair[arch::kWarpSize];
    arch::SharedVar<int32_t> pair_pos[arch::kWarpSize];
    // Staged rows whose bulk stores are issued and whose seq is not yet released, a
    // ring (store lane only): the row, and the bulk groups committed with its store.
    arch::SharedVar<int64_t> staged_row[kPendingRows];
    arch::SharedVar<uint32_t> staged_groups[kPendingRows];
    typename LoadPipeline::SharedStorage load_pipe;
    typename StorePipeline::SharedStorage store_pipe;
    typename Remote::Storage remote;
  };
  static_assert(sizeof(SharedStorage) <= arch::kMaxDynamicSmemBytes,
                "Combine FIFOs exceed the 227 KiB shared-memory budget");

  using Arguments = CombineArguments;

  struct Params {
    DomainParams domain;
    layout::HandleView handle;
    int num_tokens;
    int ranks_per_partial;  // resolved: 1..R, divides R
    int chunk_rows;
    bool permuted_input;
    bool input_in_staging;  // Received input that is this rank's staging rows: nothing to stage
    const uint8_t* input;
    int64_t num_input_rows;
    const float* input_probs;  // null: no probs combine
    float* combined_probs;
    uint8_t* out;
    typename Remote::Params remote;
  };

  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }

  // Checks everything the kernel relies on; errors name the argument and what was
  // expected. The device-dependent checks (blocks, shared memory) are the launcher's.
  static Status can_implement(const Arguments& a) {
    const layout::IntranodeShape& s = a.domain.shape;
    const std::string who = "intranode combine: ";
    const auto range = check_range;
    if (Status st = check_domain(a.domain, "combine"); !st.ok()) return st;
    const layout::IntranodeLayout lay(s);
    if (a.handle == nullptr) return Status::invalid_argument(who + "handle is null");
    if (a.recv_capacity < 0 || a.recv_capacity > lay.stage_capacity_rows())
      return Status::invalid_argument(who + "recv_capacity is " + std::to_string(a.recv_capacity) + "; expected " +
                                      range(0, lay.stage_capacity_rows()) + " (shape.ranks_per_domain x max_tokens)");
    if (a.num_tokens < 0 || a.num_tokens > s.max_tokens)
      return Status::invalid_argument(who + "num_tokens is " + std::to_string(a.num_tokens) + "; expected " +
                                      range(0, s.max_tokens) + " (shape.max_tokens)");
    if (a.num_input_rows < 0)
      return Status::invalid_argument(who + "num_input_rows is " + std::to_string(a.num_input_rows) +
                                      "; expected >= 0");
    if (a.num_input_rows > 0 && a.input == nullptr)
      return Status::invalid_argument(who + "input is null but num_input_rows is " +
                                      std::to_string(a.num_input_rows));
    if (a.num_tokens > 0 && a.out == nullptr) return Status::invalid_argument(who + "out is null");
    if (reinterpret_cast<uintptr_t>(a.input) % arch::kBulkCopyAlign != 0 ||
        reinterpret_cast<uintptr_t>(a.out) % arch::kBulkCopyAlign != 0)
      return Status::invalid_argument(who + "input and out must be 16-byte aligned (TMA)");
    if ((a.input_probs == nullptr) != (a.combined_probs == nullptr))
      return Status::invalid_argument(who + "input_probs and combined_probs go together; one of them is null");
    if (reinterpret_cast<uintptr_t>(a.input_probs) % alignof(float) != 0 ||
        reinterpret_cast<uintptr_t>(a.combined_probs) % alignof(float) != 0)
      return Status::invalid_argument(who + "input_probs and combined_probs must be 4-byte aligned");
    if (a.ranks_per_partial < 0 || (a.ranks_per_partial > 0 && s.ranks_per_domain % a.ranks_per_partial != 0))
      return Status::invalid_argument(who + "ranks_per_partial is " + std::to_string(a.ranks_per_partial) +
                                      "; expected 0 (all ranks) or a divisor of shape.ranks_per_domain " +
                                      std::to_string(s.ranks_per_domain));
    if (a.chunk_rows < 1)
      return Status::invalid_argument(who + "chunk_rows is " + std::to_string(a.chunk_rows) + "; expected >= 1");
    return Status::success();
  }

  static Params to_params(const Arguments& a) {
    Params p{};
    p.domain = a.domain;
    // The handle is const to the caller; the kernel only reads it.
    p.handle = layout::HandleView::carve(layout::IntranodeLayout(a.domain.shape), const_cast<uint8_t*>(a.handle),
                                         a.recv_capacity);
    p.num_tokens = a.num_tokens;
    p.ranks_per_partial = a.ranks_per_partial > 0 ? a.ranks_per_partial : a.domain.shape.ranks_per_domain;
    p.chunk_rows = a.chunk_rows;
    p.permuted_input = a.input_layout == CombineInputLayout::Permuted;
    p.input = static_cast<const uint8_t*>(a.input);
    const layout::IntranodeLayout lay(a.domain.shape);
    p.input_in_staging = !p.permuted_input && p.input != nullptr && p.input == lay.stage_row(a.domain.self(), 0) &&
                         lay.stage_row_bytes() == lay.combine_row_bytes();
    p.num_input_rows = a.num_input_rows;
    p.input_probs = a.input_probs;
    p.combined_probs = a.combined_probs;
    p.out = static_cast<uint8_t*>(a.out);
    return p;
  }

  RAILYARD_DEVICE void operator()(const Params& p, SharedStorage& storage) const {
    const DomainParams& dom = p.domain;
    if (arch::linear_thread_idx() == 0) {
      // One elected producer lane loads and one stores; every reduction thread arrives.
      LoadPipeline::init(storage.load_pipe, /*producer_arrivals=*/1, /*consumer_arrivals=*/kNumReduceThreads);
      StorePipeline::init(storage.store_pipe, /*producer_arrivals=*/kNumReduceThreads, /*consumer_arrivals=*/1);
      if constexpr (Remote::kPartials) Remote::init(storage.remote);
      arch::fence_mbarrier_init_release_cluster();  // the TMA completes on the load barriers
    }
    const uint64_t seq = op_begin(dom);
    const layout::OpDescriptor op{static_cast<uint32_t>(pipeline::OpKind::Combine), p.permuted_input,
                                  p.input_probs != nullptr, arch::ld_global(p.handle.made_by_op)};
    entry_barrier(dom, seq, op);  // its __syncthreads: the pipelines are initialised

    LoadPipeline load_pipe(storage.load_pipe, dom.wait());
    StorePipeline store_pipe(storage.store_pipe, dom.wait());
    const WarpRole role = role_of_warp(arch::warp_idx());
    if (role == WarpRole::Load) {
      run_load(p, storage, load_pipe, seq);
    } else if (role == WarpRole::Reduce) {
      run_reduce(storage, load_pipe, store_pipe);
    } else if (role == WarpRole::Store) {
      run_store(p, storage, seq);
    } else {
      if constexpr (Remote::kPartials) Remote::send(p.remote, p.handle, storage.remote);
    }
    op_end(dom, seq, [&] {
      if constexpr (Remote::kPartials) Remote::finish(p.remote, p.handle);
    });
  }

 private:
  RAILYARD_DEVICE static WarpRole role_of_warp(uint32_t warp) {
    return warp == 0                  ? WarpRole::Load
           : warp <= kNumReduceWarps  ? WarpRole::Reduce
           : warp == kNumReduceWarps + 1 ? WarpRole::Store
                                      : WarpRole::RdmaSend;
  }
  RAILYARD_DEVICE static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
  RAILYARD_DEVICE static uint32_t piece_bytes(uint32_t row_bytes, uint32_t offset) {
    return row_bytes - offset < SlotBytes ? row_bytes - offset : SlotBytes;
  }

  // ---- Load ------------------------------------------------------------------------------

  // One slot: wait until it is empty, tag it, arrive on its full barrier announcing
  // the bulk copy's bytes, issue the copy (none for a slot without data). The tag is
  // written before the arrival, which releases it: a slot without data completes its
  // phase at that arrival. (Hence not producer_acquire(state, tx), which arrives first.)
  RAILYARD_DEVICE static void push_slot(SharedStorage& storage, LoadPipeline& pipe,
                                        typename LoadPipeline::State& state, const SlotTag& tag,
                                        const uint8_t* src) {
    pipe.producer_acquire(state);
    storage.load_tags[state.index].store(tag);
    uint64_t* full = pipe.full_barrier(state);
    arch::mbarrier_arrive_expect_tx(full, src != nullptr ? tag.bytes : 0u);
    if (src != nullptr) arch::bulk_copy_g2s(storage.load_slots[state.index], src, tag.bytes, full);
    ++state;
  }

  // Lane 0: every piece of a job, and for each piece every source in order. `end`:
  // flags the store lane sees on the job's last piece (kChunkEnd: Remote's partial job
  // that ends a chunk).
  RAILYARD_DEVICE static void push_job(const Params& p, SharedStorage& storage, LoadPipeline& pipe,
                                       typename LoadPipeline::State& state, const Sources& sources, int first,
                                       int num_sources, uint8_t* dst, int64_t publish_row, bool gather,
                                       uint32_t end = 0) {
    const uint32_t row_bytes = static_cast<uint32_t>(layout::IntranodeLayout(p.domain.shape).combine_row_bytes());
    for (uint32_t offset = 0; offset < row_bytes; offset += SlotBytes) {
      const uint32_t bytes = piece_bytes(row_bytes, offset);
      const bool last_piece = offset + bytes == row_bytes;
      uint32_t job_flags = gather ? static_cast<uint32_t>(kDomainRounded) : 0u;
      if (last_piece) job_flags |= end;
      if (num_sources == 0) {  // a token routed nowhere (or only to dropped rows): zeros
        push_slot(storage, pipe, state,
                  SlotTag{dst + offset, -1, bytes, job_flags | kFirst | kDomainEnd | kLast}, nullptr);
        continue;
      }
      for (int i = 0; i < num_sources; ++i) {
        const bool last = i + 1 == num_sources;
        uint32_t flags = job_flags | kData;
        if (i == 0) flags |= kFirst;
        if (last) flags |= kLast;
        if (gather && (last || sources.rank[first + i + 1].load() / p.ranks_per_partial !=
                                   sources.rank[first + i].load() / p.ranks_per_partial)) {
          flags |= kDomainEnd;
        }
        const SlotTag tag{dst + offset, last && last_piece ? publish_row : -1, bytes, flags};
        push_slot(storage, pipe, state, tag, sources.row[first + i].load() + offset);
      }
    }
  }

  // The Load warp's lanes that collect a batch's sources (collect_sources) while lane 0
  // pushes the jobs of the batch before (Overlapped).
  static constexpr uint32_t kCollectMask = arch::kFullWarpMask & ~1u;
  static constexpr int kCollectLanes = static_cast<int>(arch::kWarpSize) - 1;

  // Lanes 1..31 (kCollectMask), collectively: the sources of a batch of n jobs, each
  // with `span` candidate pairs (job i, j), into `out`. pos_of(i, j), on any of these
  // lanes, gives a pair's position, -1 for none; the pairs with one are handed, in pair
  // order, to the next free lanes and waited for 31 at a time (their round trips
  // overlap), row_of(i, j, pos) on the pair's lane returning the row, or null for a
  // row with nothing for the job. Job i's rows go to out.row (their ranks, rank_base +
  // j, to out.rank) in pair order from i x gap + (rows of the jobs before it) on: `gap`
  // free places after each job's rows. out.job gets the job of each row, without gaps.
  // Returns the rows found. The lanes pass a barrier of theirs before the first row_of
  // call and the first write to `out`: what they did before the call (zeroing probs
  // that row_of writes) is ordered before them.
  template <class PosOf, class RowOf>
  RAILYARD_DEVICE static int collect_sources(SharedStorage& storage, Sources& out, int n, int span, int gap,
                                             int rank_base, PosOf&& pos_of, RowOf&& row_of) {
    const auto me = static_cast<int>(arch::lane_idx()) - 1;  // 0..kCollectLanes-1
    const uint32_t lower = ((1u << arch::lane_idx()) - 1u) & kCollectMask;
    int pending = 0, held = 0;  // lanes holding a pair (lane me: pair[me]), rows placed
    const auto wait_pending = [&] {
      const int q = me < pending ? storage.pair[me].load() : -1;
      const int i = q / span, j = q % span;
      const uint8_t* row = q >= 0 ? row_of(i, j, storage.pair_pos[me].load()) : nullptr;
      const uint32_t holders = __ballot_sync(kCollectMask, row != nullptr);
      if (row != nullptr) {
        const int k = held + __popc(holders & lower);
        out.row[k + i * gap].store(row);
        out.rank[k + i * gap].store(static_cast<int16_t>(rank_base + j));
        out.job[k].store(static_cast<int16_t>(i));
      }
      held += __popc(holders);
      pending = 0;
      __syncwarp(kCollectMask);  // every lane has read its pair before the next hand-out
    };
    for (int base = 0; base < n * span; base += kCollectLanes) {
      const int q = base + me;
      const int32_t pos = q < n * span ? pos_of(q / span, q % span) : -1;
      const uint32_t found = __ballot_sync(kCollectMask, pos >= 0);
      if (pending + __popc(found) > kCollectLanes) wait_pending();
      if (pos >= 0) {
        const int to = pending + __popc(found & lower);
        storage.pair[to].store(q);
        storage.pair_pos[to].store(pos);
      }
      pending += __popc(found);
      __syncwarp(kCollectMask);  // the hand-out, before the lanes read it
    }
    wait_pending();
    return held;
  }
  // Lane 0, after collect_sources: calls fn(i, first, count) for each job of the batch,
  // in order, with its rows' place in `sources` and their number.
  template <class Fn>
  RAILYARD_DEVICE static void for_each_collected(const Sources& sources, int n, int held, int gap, Fn&& fn) {
    for (int i = 0, k = 0; i < n; ++i) {
      const int start = k;
      while (k < held && sources.job[k].load() == i) ++k;
      fn(i, start + i * gap, k - start);
    }
  }

  // The Load warp, collectively: batches of gather or partial jobs, each step(b)
  // collecting batch b's sources on lanes 1..31 (`collect(b, sources)`, returning the
  // rows found) while lane 0 pushes the batch before (`push(b, sources, held)`), from
  // the other of the two source sets, so that a batch's header round trips overlap the
  // bulk loads of the one before; finish() pushes the last. Each step ends with a warp
  // barrier: the collectors' acquires of a batch's headers, and their writes to its
  // sources, are ordered before lane 0 reads them and bulk-loads the rows; lane 0's
  // reads of a set before the collectors write it again, two steps later. The
  // collectors may start while lane 0 pushes a stage job (from set 0), so the first
  // batch goes to set 1.
  template <class Batch, class Collect, class Push>
  class Overlapped {
   public:
    RAILYARD_DEVICE Overlapped(SharedStorage& storage, Collect& collect, Push& push)
        : storage_(storage), collect_(collect), push_(push) {}
    RAILYARD_DEVICE void step(const Batch& b) {
      int held = 0;
      if (arch::lane_idx() == 0) {
        if (has_pending_) push_(pending_, storage_.sources[1 - next_], pending_held_);
      } else {
        held = collect_(b, storage_.sources[next_]);
      }
      __syncwarp();
      pending_held_ = __shfl_sync(arch::kFullWarpMask, held, 1);
      pending_ = b;
      has_pending_ = true;
      next_ = 1 - next_;
    }
    // Lane 0 pushes the last batch; the other lanes go on (nothing of the Load warp's
    // that follows reads or writes the sets).
    RAILYARD_DEVICE void finish() {
      if (arch::lane_idx() == 0 && has_pending_) push_(pending_, storage_.sources[1 - next_], pending_held_);
      has_pending_ = false;
    }

   private:
    SharedStorage& storage_;
    Collect& collect_;
    Push& push_;
    Batch pending_{};
    int pending_held_ = 0;
    bool has_pending_ = false;
    // The set the next batch is collected into: set 1 first, as lane 0 may still be
    // pushing a stage job from set 0 when the first batch is collected.
    int next_ = 1;
  };

  // A lane, for collect_sources' row_of: waits for rank d's staged row `pos` (its
  // header's seq, over the peer mapping), copies its header entries' probs to
  // probs[local_expert] unless probs is null, and returns the row, or null when it has
  // nothing for the job (num_entries 0).
  RAILYARD_DEVICE static const uint8_t* staged_source(const DomainParams& dom, const layout::IntranodeLayout& lay,
                                                      int d, int32_t pos, uint64_t seq, float* probs) {
    uint8_t* peer = dom.peers.base(d);
    const layout::RowHeader* header = lay.header(peer, pos);
    pipeline::wait_at_least_acquire(&header->seq, seq,
                                    {"combine: staged row header seq of peer rank (index) at row (value)", d, pos},
                                    dom.wait());
    const int32_t num_entries = arch::ld_global(&header->num_entries);
    if (probs != nullptr) {
      const layout::HeaderEntry* entries = lay.header_entries(peer, pos);
      for (int k = 0; k < num_entries; ++k)
        arch::st_global(probs + arch::ld_global(&entries[k].local_expert), arch::ld_global(&entries[k].prob));
    }
    return num_entries > 0 ? lay.stage_row(peer, pos) : nullptr;
  }

  RAILYARD_DEVICE static void run_load(const Params& p, SharedStorage& storage, LoadPipeline& pipe,
                                       uint64_t seq) {
    const DomainParams& dom = p.domain;
    const layout::IntranodeLayout lay(dom.shape);
    const layout::HandleView& h = p.handle;
    const int El = dom.shape.num_local_experts;
    const int Kl = lay.max_entries();
    const int64_t row_bytes = lay.combine_row_bytes();
    const uint32_t lane = arch::lane_idx();
    const uint32_t lower_lanes = (1u << lane) - 1u;
    const bool with_probs = p.input_probs != nullptr;
    typename LoadPipeline::State state;  // used by lane 0 only

    // ---- stage jobs: this rank's received rows ----------------------------------------
    const int64_t num_recv = arch::ld_global(&h.totals[static_cast<int>(layout::Total::NumRecv)]);
    if (num_recv < 0 || num_recv > lay.stage_capacity_rows()) {
      arch::trap_with("combine: handle says rank %lld received %lld rows; staging holds %lld", dom.rank, num_recv,
                      lay.stage_capacity_rows());
    }
    // Rows the handle describes: those its dispatch kept (below this rank's bound on
    // received rows, as exchanged in the count matrix) and that fit its capacity.
    int64_t described = min_i64(num_recv, h.recv_capacity);
    const int32_t recv_bound = arch::ld_global(
        &h.count_matrix[int64_t{dom.rank} * lay.count_row_ints() + static_cast<int>(layout::CountRow::MaxRecvRows)]);
    if (recv_bound >= 0) described = min_i64(described, recv_bound);
    // Received layout: a row exists as input iff the caller passes it.
    const int64_t rows_with_input = p.permuted_input ? described : min_i64(described, p.num_input_rows);

    // Row r's entries whose input exists, in handle order (local expert ascending, the
    // unpermute's summation order), described in its header for the probs combine, and
    // (permuted layout) their input rows as the stage job's sources in set 0. Returns
    // how many. Warp-collective, lane-uniform r and n.
    const bool describe = p.permuted_input || with_probs;
    const auto describe_row = [&](int64_t r, int n) {
      layout::HeaderEntry* entries = lay.header_entries(dom.self(), r);
      int kept = 0;
      for (int base = 0; base < n; base += 32) {
        const int i = base + static_cast<int>(lane);
        layout::RecvEntry entry{-1, -1};
        bool keep = false;
        if (i < n) {
          entry = arch::ld_global(&h.recv_entries[r * Kl + i]);
          keep = !p.permuted_input || (entry.permuted_pos >= 0 && entry.permuted_pos < p.num_input_rows);
        }
        const uint32_t keepers = __ballot_sync(arch::kFullWarpMask, keep);
        if (keep) {
          const int idx = kept + __popc(keepers & lower_lanes);
          if (p.permuted_input) storage.sources[0].row[idx].store(p.input + int64_t{entry.permuted_pos} * row_bytes);
          float prob = 0.0f;
          if (with_probs) {
            prob = arch::ld_global(p.permuted_input ? &p.input_probs[entry.permuted_pos]
                                                    : &p.input_probs[r * El + entry.local_expert]);
          }
          arch::st_global(&entries[idx].local_expert, entry.local_expert);
          arch::st_global(&entries[idx].prob, prob);
          arch::st_global(&entries[idx].permuted_pos, entry.permuted_pos);
        }
        kept += __popc(keepers);
      }
      return kept;
    };
    // Lane 0: the stage job of row r, whose input rows are its sources (set 0).
    const auto push_stage_job = [&](int64_t r, int num_sources) {
      if (!p.permuted_input) storage.sources[0].row[0].store(p.input + r * row_bytes);
      push_job(p, storage, pipe, state, storage.sources[0], 0, num_sources, lay.stage_row(dom.self(), r), r,
               /*gather=*/false);
    };
    // The stage jobs of the warp's rows: lane k's row `mine` (-1: none) with n entries.
    // The received layout without probs keeps every entry and no rank reads the
    // entries: the count goes in the row's header, written by the lane that then
    // releases it (lane k) or pushes it (lane 0), so nothing orders one lane's header
    // before another's release. Otherwise the warp describes one row at a time.
    // num_entries 0 tells home ranks the row has nothing for them (semantics.md 6:
    // dropped rows contribute nothing). A row with a source that is not already where
    // staging puts it goes through the pipeline (lane 0), and the store warp releases it
    // once its bulk stores completed; lane k releases its row otherwise (stage_rows):
    // returns whether it has one to release.
    const auto stage = [&](int64_t mine, int n) {
      uint32_t pushed = 0;
      if (!describe) {
        pushed = __ballot_sync(arch::kFullWarpMask, n > 0 && !p.input_in_staging);
        if (mine >= 0 && !(pushed >> lane & 1u))
          arch::st_global(&lay.header(dom.self(), mine)->num_entries, static_cast<int16_t>(n));
        for (uint32_t rest = pushed; rest != 0; rest &= rest - 1) {
          const int k = __ffs(static_cast<int>(rest)) - 1;
          const int entries = __shfl_sync(arch::kFullWarpMask, n, k);
          const int64_t r = __shfl_sync(arch::kFullWarpMask, mine, k);
          if (lane == 0) {
            arch::st_global(&lay.header(dom.self(), r)->num_entries, static_cast<int16_t>(entries));
            push_stage_job(r, 1);
          }
        }
      } else {
        // Lane 0 writes each header; the warp barrier after it orders it before every
        // lane's release (stage_rows) and hands the sources back.
        for (int k = 0; k < static_cast<int>(arch::kWarpSize); ++k) {
          const int64_t r = __shfl_sync(arch::kFullWarpMask, mine, k);
          if (r < 0) continue;
          const int kept = describe_row(r, __shfl_sync(arch::kFullWarpMask, n, k));
          const int num_sources = p.permuted_input ? kept : (kept > 0 ? 1 : 0);
          const bool push = num_sources > 0 && !p.input_in_staging;
          __syncwarp();  // sources and header entries are written
          if (lane == 0) {
            arch::st_global(&lay.header(dom.self(), r)->num_entries, static_cast<int16_t>(kept));
            if (push) push_stage_job(r, num_sources);
          }
          pushed |= static_cast<uint32_t>(push) << k;
          __syncwarp();  // lane 0 is done with the row's sources, and its header is written
        }
      }
      return mine >= 0 && !(pushed >> lane & 1u);
    };
    // Lane k's four entry counts of rows base, ..., base + 3 of [a, b) (0 past
    // rows_with_input), in one 16-byte load where all four have input.
    const bool counts_aligned = reinterpret_cast<uintptr_t>(h.recv_num_entries) % 16 == 0;
    const auto entry_counts = [&](int64_t base, int64_t a, int64_t b, int32_t (&n)[4]) {
      if (counts_aligned && base >= a && base + 3 < b && base + 3 < rows_with_input) {
        const uint4 v = arch::ld_global(reinterpret_cast<const uint4*>(h.recv_num_entries + base));
        n[0] = static_cast<int32_t>(v.x), n[1] = static_cast<int32_t>(v.y);
        n[2] = static_cast<int32_t>(v.z), n[3] = static_cast<int32_t>(v.w);
        return;
      }
      for (int e = 0; e < 4; ++e) {
        const int64_t r = base + e;
        n[e] = r >= a && r < b && r < rows_with_input ? arch::ld_global(&h.recv_num_entries[r]) : 0;
      }
    };
    // Each lane releases its rows of up to 32 batches with one fence.acq_rel.sys: every
    // row is published before any job, so nothing waits for one sooner.
    //
    // Rows [a, b) where a block has fewer than 128 of them: the blocks' chunks of at
    // most 32 rows (BatchCursor, so that few rows still spread over every block), lane k
    // taking row k of each.
    const auto stage_narrow = [&](int64_t a, int64_t b) {
      BatchCursor cursor(b - a, p.chunk_rows, arch::kWarpSize);
      int64_t first = 0;
      int n = 0;
      for (bool more = true; more;) {
        BatchCursor group = cursor;
        uint32_t releases = 0;  // bit i: this lane releases its row of the group's batch i
        int batches = 0;
        for (; batches < 32 && (more = cursor.next(first, n)); ++batches) {
          const int64_t mine = static_cast<int>(lane) < n ? a + first + lane : -1;
          const int count = mine >= 0 && mine < rows_with_input ? arch::ld_global(&h.recv_num_entries[mine]) : 0;
          releases |= static_cast<uint32_t>(stage(mine, count)) << batches;
        }
        if (releases == 0) continue;
        arch::fence_acq_rel_sys();
        for (int i = 0; i < batches; ++i)
          if (group.next(first, n) && (releases >> i & 1u))
            arch::st_relaxed_sys(&lay.header(dom.self(), a + first + lane)->seq, seq);
      }
    };
    // Otherwise chunks of 128 rows aligned on row 0, dealt to the blocks round robin:
    // lane k takes rows 4k, ..., 4k + 3 of a chunk, their entry counts in one load
    // (entry_counts), and the chunk's j-th batch is every lane's row 4k + j.
    constexpr int64_t kWideChunk = 4 * arch::kWarpSize;
    const auto stage_wide = [&](int64_t a, int64_t b) {
      const int64_t end = (b + kWideChunk - 1) / kWideChunk;
      for (int64_t c = a / kWideChunk + blockIdx.x; c < end;) {
        const int64_t group = c;
        uint32_t releases = 0;  // bit 4i + j: this lane releases row 4k + j of the group's chunk i
        int chunks = 0;
        for (; chunks < 8 && c < end; ++chunks, c += gridDim.x) {
          const int64_t base = c * kWideChunk + 4 * lane;
          int32_t n[4];
          entry_counts(base, a, b, n);
          for (int j = 0; j < 4; ++j) {
            const int64_t r = base + j;
            releases |= static_cast<uint32_t>(stage(r >= a && r < b ? r : -1, n[j])) << (4 * chunks + j);
          }
        }
        if (releases == 0) continue;
        arch::fence_acq_rel_sys();
        for (int i = 0; i < chunks; ++i)
          for (int j = 0; j < 4; ++j)
            if (releases >> (4 * i + j) & 1u)
              arch::st_relaxed_sys(
                  &lay.header(dom.self(), (group + i * gridDim.x) * kWideChunk + 4 * lane + j)->seq, seq);
      }
    };
    const auto stage_rows = [&](int64_t a, int64_t b) {
      if (b - a >= kWideChunk * gridDim.x) return stage_wide(a, b);
      if (b > a) stage_narrow(a, b);
    };

    // Received rows are in source rank order; [own_begin, own_end) came from this
    // NVLink domain's ranks. Across domains the others (tokens rail peers forwarded
    // here, the partials' sources) are staged first, then this domain's; every row is
    // staged before any job, at every rank, so that no job waits for a row a rank
    // stages after a job of its own (run_jobs).
    int64_t own_begin = 0, own_end = num_recv;
    if constexpr (Remote::kPartials) {
      int64_t before = 0, own = 0;
      for (int s = 0; s < dom.nvlink_end(); ++s) {
        const int32_t n = arch::ld_global(&h.count_matrix[int64_t{s} * lay.count_row_ints() + layout::count_to_rank(dom.rank)]);
        (s < dom.nvlink_begin() ? before : own) += n;
      }
      own_begin = min_i64(before, num_recv);
      own_end = min_i64(own_begin + own, num_recv);
    }
    stage_rows(0, own_begin);
    stage_rows(own_end, num_recv);
    stage_rows(own_begin, own_end);

    // Every staged row is published (by the store lane, or here) before any job waits
    // for one.
    if (lane == 0) push_slot(storage, pipe, state, SlotTag{nullptr, -1, 0, kFlush}, nullptr);
    run_jobs(p, storage, pipe, state, seq);
    if (lane == 0) push_slot(storage, pipe, state, SlotTag{nullptr, -1, 0, kDone}, nullptr);
  }

  // ---- gather and partial jobs -----------------------------------------------------

  // A batch of jobs: gather jobs for tokens [t0, t0 + n), or (Remote) partial jobs for
  // rows [i0, i0 + n) of a send-ring chunk of `rows` at `dst` (staged positions from
  // `positions`, its ring place `use`).
  struct Job {
    bool gather;
    int n;
    int64_t t0;
    uint8_t* dst;
    const int32_t* positions;
    int i0, rows;
    typename Remote::RingUse use;
  };

  // Warp-collective: the gather jobs (this rank's tokens, pulled from every rank that
  // holds them) and, across domains, the partial jobs (one per row this block sends to
  // another domain: Remote::for_each_partial_chunk, the tokens rail peers forwarded
  // here at dispatch), in batches through Overlapped: lanes 1..31 wait for the headers
  // of a batch's (job, rank) pairs that have a staged row, a lane each, so that their
  // NVLink round trips overlap (collect_sources; most pairs have none: a token chose
  // few of the domain's ranks), while lane 0 pushes the batch before.
  //
  // A gather job's sources are this domain's rows of the token and, across domains,
  // the other domains' partials, which it waits for; a partial job's the staged rows of
  // this domain's ranks, summed in fp32 and rounded once to BF16, into its send-ring
  // row; with the probs combine, their header entries' probs after it. Before a
  // chunk's first batch its ring slot must be free (the put of the lane's chunk S / L
  // before it completed): the collectors write the probs, and every store into the
  // slot follows its jobs.
  //
  // Across domains the gathers go between the partial rounds (Remote: round j, the j-th
  // chunk of each of the block's lanes): before round j, the gather batches whose
  // partials were all put in rounds up to j - 1 - kGatherLag (Remote::last_round), the
  // rest after the last round. No deadlock: a block at round j waits only for partials
  // of earlier rounds, which every block makes before waiting for any of round j or
  // later, and for rows every rank staged before its first job. Gathers do not all wait
  // for the end of the block's partials, which the NIC paces.
  RAILYARD_DEVICE static void run_jobs(const Params& p, SharedStorage& storage, LoadPipeline& pipe,
                                       typename LoadPipeline::State& state, uint64_t seq) {
    const layout::HandleView& h = p.handle;
    const int span = p.domain.nvlink_end() - p.domain.nvlink_begin();
    typename Remote::Gather remote(p.remote, p.handle, storage.remote);  // lane 0's
    int gap = 0;  // across domains each token keeps a place for each other domain's partial
    if constexpr (Remote::kPartials) gap = remote.num_domains() - 1;
    const auto collect = [&](const Job& b, Sources& out) { return collect_batch(p, storage, b, out, gap, seq); };
    const auto push = [&](const Job& b, Sources& sources, int held) {
      push_batch(p, storage, pipe, state, remote, b, sources, held, gap);
    };
    Overlapped<Job, decltype(collect), decltype(push)> jobs(storage, collect, push);

    const int batch = kMaxSources / (span + gap) < kHeaderBatch ? kMaxSources / (span + gap) : kHeaderBatch;
    BatchCursor tokens(p.num_tokens, p.chunk_rows, batch);
    Job gather{true};
    bool more = tokens.next(gather.t0, gather.n);
    if constexpr (Remote::kPartials) {
      bool known = false;  // whether `last` is the next gather batch's last round
      int64_t last = 0;
      const auto gathers_before = [&](int64_t round) {
        for (; more; more = tokens.next(gather.t0, gather.n), known = false) {
          if (!known) last = Remote::last_round(p.remote, h, gather.t0, gather.n);
          known = true;
          if (last > round - 1 - kGatherLag) return;
          jobs.step(gather);
        }
      };
      const int rows_batch = kMaxSources / span < kHeaderBatch ? kMaxSources / span : kHeaderBatch;
      int64_t round = -1;
      Remote::for_each_partial_chunk(p.remote, h, [&](uint8_t* dst, const int32_t* positions, int rows,
                                                      typename Remote::RingUse use, int64_t j) {
        if (j != round) gathers_before(round = j);
        for (int i0 = 0; i0 < rows; i0 += rows_batch)
          jobs.step(Job{false, rows - i0 < rows_batch ? rows - i0 : rows_batch, 0, dst, positions, i0, rows, use});
      });
    }
    for (; more; more = tokens.next(gather.t0, gather.n)) jobs.step(gather);
    jobs.finish();
  }

  // Lanes 1..31 (Overlapped's collect): batch b's sources into `out` (run_jobs).
  RAILYARD_DEVICE static int collect_batch(const Params& p, SharedStorage& storage, const Job& b, Sources& out,
                                           int gap, uint64_t seq) {
    const DomainParams& dom = p.domain;
    const layout::IntranodeLayout lay(dom.shape);
    const layout::HandleView& h = p.handle;
    const int lane = static_cast<int>(arch::lane_idx());
    const int R = dom.shape.ranks_per_domain, El = dom.shape.num_local_experts, E = R * El;
    const int first = dom.nvlink_begin(), span = dom.nvlink_end() - first;
    const bool with_probs = p.input_probs != nullptr;
    if constexpr (Remote::kPartials) {
      if (!b.gather) {
        const int64_t stride = Remote::partial_row_bytes(p.remote);
        if (b.i0 == 0) {
          if (lane == 1) Remote::ring_acquire(storage.remote, p.remote, b.use);
          __syncwarp(kCollectMask);  // the slot is free before any lane writes probs into it
        }
        if (with_probs) {
          // Zeros, then (row_of, after collect_sources' first barrier) the kept
          // entries' probs.
          for (int k = lane - 1; k < b.n * span * El; k += kCollectLanes)
            arch::st_global(Remote::probs_of(p.remote, b.dst + (b.i0 + k / (span * El)) * stride) + k % (span * El),
                            0.0f);
        }
        const auto pos_of = [&](int i, int j) { return arch::ld_global(b.positions + int64_t{b.i0 + i} * span + j); };
        const auto row_of = [&](int i, int j, int32_t pos) {
          return staged_source(dom, lay, first + j, pos, seq,
                               with_probs ? Remote::probs_of(p.remote, b.dst + (b.i0 + i) * stride) + j * El
                                          : nullptr);
        };
        return collect_sources(storage, out, b.n, span, /*gap=*/0, first, pos_of, row_of);
      }
    }
    // Zeros, then (row_of, after collect_sources' first barrier) the chosen experts'
    // probs.
    if (with_probs) {
      for (int64_t e = lane - 1; e < int64_t{b.n} * E; e += kCollectLanes)
        arch::st_global(&p.combined_probs[b.t0 * E + e], 0.0f);
    }
    // Across domains, only this rank's domain is pulled over NVLink: the others'
    // rows arrive as their domains' partials (added by push).
    const auto pos_of = [&](int i, int j) {
      const int d = first + j;
      const int32_t pos = arch::ld_global(&h.recv_pos[(b.t0 + i) * R + d]);
      // A row at or past d's bound on received rows was never dispatched: its pair
      // is skipped without touching d.
      const int32_t bound =
          pos < 0 ? -1
                  : arch::ld_global(&h.count_matrix[int64_t{d} * lay.count_row_ints() +
                                                    static_cast<int>(layout::CountRow::MaxRecvRows)]);
      return pos >= 0 && (bound < 0 || pos < bound) ? pos : -1;
    };
    const auto row_of = [&](int i, int j, int32_t pos) {
      const int d = first + j;
      return staged_source(dom, lay, d, pos, seq,
                           with_probs ? &p.combined_probs[(b.t0 + i) * E + int64_t{d} * El] : nullptr);
    };
    return collect_sources(storage, out, b.n, span, gap, first, pos_of, row_of);
  }

  // Lane 0 (Overlapped's push), after the step's warp barrier (the collectors acquired
  // the headers): batch b's jobs from `sources` (run_jobs). Its proxy fence orders what
  // it learned (generic proxy) before its TMA reads (async proxy) of the rows those
  // headers published.
  RAILYARD_DEVICE static void push_batch(const Params& p, SharedStorage& storage, LoadPipeline& pipe,
                                         typename LoadPipeline::State& state, typename Remote::Gather& remote,
                                         const Job& b, Sources& sources, int held, int gap) {
    arch::fence_proxy_async_global();
    if constexpr (Remote::kPartials) {
      if (!b.gather) {
        const int64_t stride = Remote::partial_row_bytes(p.remote);
        for_each_collected(sources, b.n, held, /*gap=*/0, [&](int i, int start, int num_sources) {
          push_job(p, storage, pipe, state, sources, start, num_sources, b.dst + (b.i0 + i) * stride, -1,
                   /*gather=*/false, b.i0 + i == b.rows - 1 ? static_cast<uint32_t>(kChunkEnd) : 0u);
        });
        return;
      }
    }
    const int64_t row_bytes = layout::IntranodeLayout(p.domain.shape).combine_row_bytes();
    for_each_collected(sources, b.n, held, gap, [&](int i, int start, int num_sources) {
      if constexpr (Remote::kPartials) {
        // The other domains' partials, in domain order around this domain's rows;
        // their signal waits are acquires, fenced again for the TMA loads.
        num_sources = add_partials(p, sources, remote, b.t0 + i, start, num_sources);
        arch::fence_proxy_async_global();
      }
      push_job(p, storage, pipe, state, sources, start, num_sources, p.out + (b.t0 + i) * row_bytes, -1,
               /*gather=*/true);
    });
  }

  // Lane 0: token t's partials from the other domains (Remote::Gather::row: null where
  // the token sent nothing there) put around this domain's `own` sources at `first`,
  // in ascending domain order; with the probs combine, their probs into
  // combined_probs. Returns the token's sources.
  RAILYARD_DEVICE static int add_partials(const Params& p, Sources& sources, typename Remote::Gather& remote,
                                          int64_t t, int first, int own) {
    const int D = remote.num_domains(), mine = remote.own_domain();
    int before = 0;
    for (int n = 0; n < mine; ++n) before += remote.row(t, n) != nullptr ? 1 : 0;
    for (int k = own - 1; k >= 0; --k) {
      sources.row[first + before + k].store(sources.row[first + k].load());
      sources.rank[first + before + k].store(sources.rank[first + k].load());
    }
    int idx = 0;
    for (int n = 0; n < D; ++n) {
      if (n == mine) {
        idx += own;
        continue;
      }
      const uint8_t* row = remote.row(t, n);
      if (row == nullptr) continue;
      if (p.combined_probs != nullptr) {
        const int span = p.domain.nvlink_end() - p.domain.nvlink_begin(), El = p.domain.shape.num_local_experts;
        const int64_t E = int64_t{p.domain.shape.ranks_per_domain} * El;
        const float* probs = Remote::probs_of(p.remote, row);
        for (int k = 0; k < span * El; ++k)
          arch::st_global(&p.combined_probs[t * E + int64_t{remote.rank_in(n)} * El + k], arch::ld_global(probs + k));
      }
      sources.row[first + idx].store(row);
      sources.rank[first + idx].store(static_cast<int16_t>(remote.rank_in(n)));
      ++idx;
    }
    return idx;
  }

  // ---- Reduce ------------------------------------------------------------------------------

  struct alignas(16) Bf16x8 {
    uint32_t word[4];  // element 2k in the low half of word k, 2k + 1 in the high half
  };

  RAILYARD_DEVICE static void run_reduce(SharedStorage& storage, LoadPipeline& load_pipe,
                                         StorePipeline& store_pipe) {
    const uint32_t thread = arch::linear_thread_idx() - arch::kWarpSize;  // 0..kNumReduceThreads-1
    const bool leader = thread == 0;  // writes the store tags
    float partial[kAccumulators] = {};
    float total[kAccumulators] = {};
    typename LoadPipeline::State load_state;
    typename StorePipeline::State store_state;
    for (;;) {
      load_pipe.consumer_wait(load_state);
      const SlotTag tag = storage.load_tags[load_state.index].load();
      if (tag.flags & (kDone | kFlush)) {
        // Nothing to reduce: passed on to the store lane.
        store_pipe.producer_acquire(store_state);
        if (leader) storage.store_tags[store_state.index].store(tag);
        store_pipe.producer_commit(store_state);
        if (tag.flags & kDone) return;  // the load lane fills no slot after this one: not released
        ++store_state;
        load_pipe.consumer_release(load_state);
        ++load_state;
        continue;
      }
      if (tag.flags & kFirst) {
        RAILYARD_UNROLL
        for (uint32_t k = 0; k < kAccumulators; ++k) partial[k] = total[k] = 0.0f;
      }
      // Every loop over the accumulators is unrolled, and a lane past the piece's end
      // skips its vector instead of leaving the loop: both arrays stay in registers.
      if (tag.flags & kData) {
        const uint8_t* slot = storage.load_slots[load_state.index];
        RAILYARD_UNROLL
        for (uint32_t v = 0; v < kVectorsPerLane; ++v) {
          const uint32_t vector = thread + v * kNumReduceThreads;
          if (vector * kVectorBytes >= tag.bytes) continue;
          const Bf16x8 x = arch::ld_shared(reinterpret_cast<const Bf16x8*>(slot + vector * kVectorBytes));
          RAILYARD_UNROLL
          for (uint32_t w = 0; w < 4; ++w) {
            partial[v * kElemsPerVector + 2 * w] += bf16_to_float(bf16{static_cast<uint16_t>(x.word[w])});
            partial[v * kElemsPerVector + 2 * w + 1] += bf16_to_float(bf16{static_cast<uint16_t>(x.word[w] >> 16)});
          }
        }
        // The Load lane refills this slot with a TMA load (async proxy) once it is
        // released; the mbarrier orders only the generic proxy, so this thread's
        // generic reads must be fenced against that later async write (DeepEP #621).
        arch::fence_proxy_async_shared_cta();
      }
      // The slot's bytes are in registers now: hand it back before anything else.
      load_pipe.consumer_release(load_state);
      ++load_state;
      if (tag.flags & kDomainEnd) {
        // BF16 on the wire between NVLink domains (semantics.md 7): every domain's
        // partial is rounded, the home domain's too.
        RAILYARD_UNROLL
        for (uint32_t k = 0; k < kAccumulators; ++k) {
          total[k] += arch::round_to_bf16(partial[k]);
          partial[k] = 0.0f;
        }
      }
      if (!(tag.flags & kLast)) continue;

      store_pipe.producer_acquire(store_state);
      uint8_t* out_slot = storage.store_slots[store_state.index];
      const bool rounded = (tag.flags & kDomainRounded) != 0;
      RAILYARD_UNROLL
      for (uint32_t v = 0; v < kVectorsPerLane; ++v) {
        const uint32_t vector = thread + v * kNumReduceThreads;
        if (vector * kVectorBytes >= tag.bytes) continue;
        Bf16x8 y;
        RAILYARD_UNROLL
        for (uint32_t w = 0; w < 4; ++w) {
          const uint32_t k = v * kElemsPerVector + 2 * w;
          // A select per element, not a pointer to one array: a pointer would force
          // both arrays out of registers into local memory.
          y.word[w] = arch::bf16x2_rn(rounded ? total[k] : partial[k], rounded ? total[k + 1] : partial[k + 1]);
        }
        arch::st_shared(reinterpret_cast<Bf16x8*>(out_slot + vector * kVectorBytes), y);
      }
      if (leader) storage.store_tags[store_state.index].store(tag);
      // Generic-proxy writes to shared memory, read next by the async proxy (TMA store).
      arch::fence_proxy_async_shared_cta();
      store_pipe.producer_commit(store_state);
      ++store_state;
    }
  }

  // ---- Store -------------------------------------------------------------------------------

  RAILYARD_DEVICE static void run_store(const Params& p, SharedStorage& storage, uint64_t seq) {
    // Bulk groups belong to the issuing thread: one lane commits and waits for all.
    if (arch::lane_idx() != 0) return;
    const layout::IntranodeLayout lay(p.domain.shape);
    StoreConsumer fifo(storage.store_pipe, p.domain.wait());
    int64_t staged = 0, published = 0;  // staged rows whose store is issued, and released
    for (;;) {
      const uint32_t slot = fifo.wait();
      const SlotTag tag = storage.store_tags[slot].load();
      if (tag.flags & (kDone | kFlush)) {
        published += publish_staged(p, lay, storage, seq, fifo.committed, published, staged, /*all=*/true);
        fifo.commit();  // nothing to store: an empty group, so that slots go back in order
        if (tag.flags & kDone) break;
        continue;
      }
      arch::bulk_copy_s2g(tag.dst, storage.store_slots[slot], tag.bytes);
      fifo.commit();
      if constexpr (Remote::kPartials) {
        if (tag.flags & kChunkEnd) {
          // The chunk's rows have landed (and, the wait completed, are visible to the
          // generic proxy); the barrier arrival releases them to the RDMA warp, whose
          // release before the doorbell then covers them.
          arch::bulk_wait_group<0>();
          Remote::ring_commit(storage.remote, p.remote, tag.dst);
        }
      }
      if (tag.publish_row >= 0) {
        storage.staged_row[staged % kPendingRows].store(tag.publish_row);
        storage.staged_groups[staged % kPendingRows].store(fifo.committed);
        ++staged;
        published += publish_staged(p, lay, storage, seq, fifo.committed, published, staged,
                                    staged - published == kPendingRows);
      }
    }
    // No wait here: the done slot's empty group was committed after every store, and
    // its commit waited until all groups but that one had read their slots. The
    // stores' writes (this rank's combined rows) need none: every staged row was waited
    // for before its release, and the kernel's completion orders the rest before later
    // work.
  }

  // Releases `seq` of the staged rows [published, staged) whose stores have completed,
  // kPublishBatch or more at a time; with `all`, of every one (after waiting for every
  // store). A completed wait is followed by an implicit generic-async proxy fence (PTX,
  // "Async proxy"); the fence.acq_rel.sys then makes the relaxed stores of seq the
  // release of the rows and of the header entries the Load warp wrote (home ranks
  // acquire seq before reading anything else of the row). Returns the rows released.
  RAILYARD_DEVICE static int64_t publish_staged(const Params& p, const layout::IntranodeLayout& lay,
                                                const SharedStorage& storage, uint64_t seq, uint32_t committed,
                                                int64_t published, int64_t staged, bool all) {
    if (published == staged) return 0;
    uint32_t done = committed;
    if (all) {
      arch::bulk_wait_group<0>();
    } else {
      arch::bulk_wait_group<kWriteLag>();
      done = committed > kWriteLag ? committed - kWriteLag : 0;
    }
    int64_t n = published;
    while (n < staged && storage.staged_groups[n % kPendingRows].load() <= done) ++n;
    if (n == published || (!all && n - published < kPublishBatch)) return 0;
    arch::fence_acq_rel_sys();
    for (int64_t i = published; i < n; ++i) {
      arch::st_relaxed_sys(&lay.header(p.domain.self(), storage.staged_row[i % kPendingRows].load())->seq, seq);
    }
    return n - published;
  }
};

}  // namespace railyard::kernels::intranode
