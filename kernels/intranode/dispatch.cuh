// Railyard intra-node dispatch: every rank pushes its tokens over NVLink into the
// staging rows of the ranks that host their experts, and copies the rows it received
// out of its own staging into the caller's output. See docs/design-intranode.md.
//
// One block is one channel; it never waits on another block of its rank. Five warps:
//   SendLoad     (G2S)  TMA-loads this block's token rows, piece by piece, into the
//                       send FIFO;
//   SendStore    (S2G)  TMA-stores each piece into the staging row of every
//                       destination of the token (ascending rank, over the peer
//                       mapping) and writes the row header's entries and FP8
//                       scales; keeps several rows in flight and publishes `seq`
//                       (fence.acq_rel.sys, then relaxed stores) for batches of
//                       tokens whose rows have landed;
//   CopyOutLoad  (G2S)  for each received row of this block's chunks, waits for its
//                       header `seq` (acquire, bounded), TMA-loads it into the
//                       copy-out FIFO;
//   CopyOutStore (S2G)  TMA-stores it to the caller's output (its received row, or
//                       each of its permuted positions); zeroes padding rows;
//   RowFields           each source's rows in its token order, the sources' rows
//                       interleaved over the lanes (a share of them per block): waits
//                       for each row's header `seq` (acquire, bounded) and writes the
//                       row's probs, routing map, source, scales and the handle's
//                       expert side.
// Only each role's elected lane touches the FIFOs and the bulk copies (bulk groups
// belong to the issuing thread); the other lanes of SendStore write the small
// per-token fields in parallel.
//
// Across NVLink domains (the Remote parameter: kernels/hierarchical/dispatch.cuh) the
// same kernel sends only to the ranks of its own domain (DomainParams::nvlink_*), a
// sixth warp puts this rank's rows for the other domains over RDMA, and two Forward
// warps forward the wire rows its rail peers put into its receive areas, each as the
// source would have sent it, beside this rank's own tokens: SendStore's code, each on
// a FIFO of its own that it fills itself (no load warp). NoRemote: one domain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/common/warp_reduce.cuh"
#include "kernels/intranode/dispatch.hpp"
#include "kernels/intranode/domain_checks.hpp"
#include "kernels/intranode/protocol.cuh"
#include "railyard/arch/bulk_copy.cuh"
#include "railyard/arch/fault.cuh"
#include "railyard/arch/memory.cuh"
#include "railyard/arch/smem.cuh"
#include "railyard/arch/thread.cuh"
#include "railyard/common/dtypes.cuh"
#include "railyard/common/macros.cuh"
#include "railyard/common/status.hpp"
#include "railyard/layout/intranode_layout.cuh"
#include "railyard/pipeline/pipeline.cuh"
#include "railyard/pipeline/wait.cuh"
#include "railyard/transport/nvlink.cuh"

namespace railyard::kernels::intranode {

// The one-domain dispatch: nothing crosses a NIC, no rows are forwarded.
struct NoRemote {
  static constexpr const char* kName = "IntranodeDispatch";
  static constexpr bool kForwards = false;
  static constexpr uint32_t kWarps = 0;
  struct Params {};
  template <uint32_t SlotBytes>
  struct Storage {};
};

template <uint32_t SlotBytes = kDispatchSlotBytes, int Stages = kDispatchStages, class Remote = NoRemote>
struct Dispatch {
  static_assert(Stages >= 1);
  static_assert(SlotBytes > 0 && SlotBytes % arch::kBulkCopyAlign == 0,
                "a slot holds whole 16-byte bulk-copy units");

  static constexpr uint32_t kSlotBytes = SlotBytes;
  static constexpr int kStages = Stages;
  static constexpr const char* kName = Remote::kName;  // what the simulator's and launch errors call it

  enum class WarpRole : uint32_t {
    SendLoad = 0,
    SendStore = 1,
    CopyOutLoad = 2,
    CopyOutStore = 3,
    RowFields = 4,
    RdmaSend = 5,  // Remote::kWarps == 1 only
    Forward = 6,   // Remote::kForwards only: kForwarders warps from here
  };
  // Send sides, each with its FIFO, ring and bulk groups: side 0 SendLoad -> SendStore
  // for this rank's tokens; across domains side 1 + f for Forward warp f, which loads
  // its own FIFO. Forwarding starts when the first chunk lands and runs beside the own
  // tokens; two warps, because one warp's work per row (routing, pieces, header,
  // publication: about 1.2 us in the timed simulation) is slower than the NIC brings
  // the rows in.
  static constexpr int kForwarders = Remote::kForwards ? 2 : 0;
  static constexpr int kSendSides = 1 + kForwarders;
  static constexpr uint32_t kNumWarps = 5 + Remote::kWarps + kForwarders;
  static constexpr uint32_t kMaxThreadsPerBlock = kNumWarps * arch::kWarpSize;
  static constexpr uint32_t kMinBlocksPerSm = 1;

  using Pipeline = pipeline::Pipeline<Stages>;
  using PipelineState = typename Pipeline::State;
  // The zero slot is written 16 bytes a store (st.shared.v4), the bulk-copy unit.
  struct alignas(16) ZeroVector {
    uint32_t word[4];
  };
  static constexpr int kMaxRanks = layout::kMaxRanksPerDomain;
  static constexpr int kMaskWords = (kMaxRanks + 31) / 32;  // a bit per destination
  // The S2G roles keep rows in flight instead of waiting for each: a FIFO slot goes
  // back to its producer once the stores of kReadLag later slots have been issued and
  // its own have read it (pipeline::BulkConsumer). SendStore publishes a token's header
  // once at most kWriteLag bulk groups (pieces) issued after its own are still in
  // flight (bulk_wait_group), kPublishBatch landed tokens at a time (one
  // fence.acq_rel.sys per destination lane for the batch), and at once when
  // kPendingTokens - 1 earlier tokens await it (the ring holds them and the current one).
  static constexpr int kReadLag = 1;
  static constexpr int kWriteLag = 4;
  static constexpr int kPublishBatch = 4;
  static constexpr int kPendingTokens = 16;
  static_assert(kPublishBatch < kPendingTokens);
  using BulkConsumer = pipeline::BulkConsumer<Stages, kReadLag>;

  // One send side: its load warp (or its store warp's leader) -> its store warp.
  struct SendSide {
    alignas(128) uint8_t slots[Stages][SlotBytes];
    typename Pipeline::SharedStorage pipe;
    // The store warp's tokens whose headers are not yet published, a ring written by
    // its lanes: each token's row at each destination (-1: no header there), and the
    // bulk groups its leader had committed once the token's pieces were issued.
    arch::SharedVar<int32_t> pos[kPendingTokens][kMaxRanks];
    arch::SharedVar<uint32_t> groups[kPendingTokens];
    // Which destinations copy the current token's row out (else only the header
    // travels), a bit each (bit i of word w: dest_begin + 32 w + i), how many of the
    // token's experts each hosts, and how many pending tokens the leader found landed.
    arch::SharedVar<uint32_t> bytes[kMaskWords];
    arch::SharedVar<int16_t> entries[kMaxRanks];
    arch::SharedVar<int32_t> publish_count;
  };
  struct SharedStorage {
    SendSide send[kSendSides];
    alignas(128) uint8_t copy_slots[Stages][SlotBytes];  // CopyOutLoad -> CopyOutStore
    alignas(128) uint8_t zero_slot[SlotBytes];           // source of the padding rows
    typename Pipeline::SharedStorage copy_pipe;
    arch::SharedVar<int32_t> recv_bound[kMaxRanks];  // every rank's max_recv_rows, -1: none
    arch::SharedVar<int32_t> first_row[kMaxRanks + 1];  // RowFields: each source's first received row
    typename Remote::template Storage<SlotBytes> remote;
  };
  static_assert(sizeof(SharedStorage) <= arch::kMaxDynamicSmemBytes,
                "Dispatch FIFOs exceed the 227 KiB shared-memory budget");

  using Arguments = DispatchArguments;

  struct Params {
    DomainParams domain;
    layout::HandleView handle;
    const uint8_t* hidden;
    const float* scales;
    uint8_t* out_hidden;
    float* out_scales;
    float* out_probs;
    int64_t* out_recv_row;
    uint8_t* out_routing_map;
    int32_t* out_src_rank;
    int32_t* out_src_token;
    int num_tokens;
    int chunk_rows;
    DispatchOutput output;
    typename Remote::Params remote;
  };

  static constexpr std::size_t shared_memory_bytes() { return sizeof(SharedStorage); }

  static Status can_implement(const Arguments& args) {
    const layout::IntranodeShape& s = args.domain.shape;
    const layout::IntranodeLayout layout(s);
    const auto bad = [](const std::string& what) { return Status::invalid_argument("Dispatch: " + what); };
    if (Status st = check_domain(args.domain, "dispatch"); !st.ok()) return st;
    if (args.num_tokens < 0 || args.num_tokens > s.max_tokens)
      return bad("num_tokens " + std::to_string(args.num_tokens) + ": expected 0..shape.max_tokens = " +
                 std::to_string(s.max_tokens));
    if (args.num_tokens > 0 && (args.hidden == nullptr || aligned(args.hidden, arch::kBulkCopyAlign) == false))
      return bad("hidden: expected a 16-byte aligned pointer");
    const bool fp8 = s.dispatch_dtype == DType::FP8_E4M3;
    if (fp8 && args.num_tokens > 0 && (args.scales == nullptr || !aligned(args.scales, 4)))
      return bad("scales: expected a 4-byte aligned pointer for FP8");
    if (args.handle == nullptr || !aligned(args.handle, 16)) return bad("handle: expected a 16-byte aligned pointer");
    if (args.recv_capacity < 0 || args.recv_capacity > layout.stage_capacity_rows())
      return bad("recv_capacity " + std::to_string(args.recv_capacity) + ": expected 0..ranks_per_domain*max_tokens");
    if (args.output == DispatchOutput::ExpertGrouped && args.out_hidden == nullptr)
      return bad("out_hidden: expected a 16-byte aligned pointer (only the Received layout may leave its rows in "
                 "the staging rows with null)");
    if (!aligned(args.out_hidden, arch::kBulkCopyAlign)) return bad("out_hidden: expected a 16-byte aligned pointer");
    if (fp8 && (args.out_scales == nullptr || !aligned(args.out_scales, 4)))
      return bad("out_scales: expected a 4-byte aligned pointer for FP8");
    if (!aligned(args.out_probs, 4) || !aligned(args.out_recv_row, 8) || !aligned(args.out_src_rank, 4) ||
        !aligned(args.out_src_token, 4))
      return bad("out_probs, out_recv_row, out_src_rank, out_src_token: misaligned for their element type");
    if (args.output != DispatchOutput::Received && args.output != DispatchOutput::ExpertGrouped)
      return bad("output: expected Received or ExpertGrouped");
    if (args.output == DispatchOutput::Received && args.out_recv_row != nullptr)
      return bad("out_recv_row: only the ExpertGrouped layout has it; expected null");
    if (args.num_blocks < 1) return bad("num_blocks " + std::to_string(args.num_blocks) + ": expected >= 1");
    if (args.chunk_rows < 1) return bad("chunk_rows " + std::to_string(args.chunk_rows) + ": expected >= 1");
    return Status::success();
  }

  static Params to_params(const Arguments& args) {
    const layout::IntranodeLayout layout(args.domain.shape);
    Params p{};
    p.domain = args.domain;
    p.handle = layout::HandleView::carve(layout, args.handle, args.recv_capacity);
    p.hidden = static_cast<const uint8_t*>(args.hidden);
    p.scales = args.scales;
    p.out_hidden = static_cast<uint8_t*>(args.out_hidden);
    p.out_scales = args.out_scales;
    p.out_probs = args.out_probs;
    p.out_recv_row = args.out_recv_row;
    p.out_routing_map = args.out_routing_map;
    p.out_src_rank = args.out_src_rank;
    p.out_src_token = args.out_src_token;
    p.num_tokens = args.num_tokens;
    p.chunk_rows = args.chunk_rows;
    p.output = args.output;
    return p;
  }

  RAILYARD_DEVICE void operator()(const Params& params, SharedStorage& storage) const {
    const uint64_t seq = op_begin(params.domain);
    const uint32_t thread = arch::linear_thread_idx();
    if (thread == 0) {
      for (SendSide& side : storage.send) Pipeline::init(side.pipe, /*producer_arrivals=*/1, /*consumer_arrivals=*/1);
      Pipeline::init(storage.copy_pipe, /*producer_arrivals=*/1, /*consumer_arrivals=*/1);
      if constexpr (Remote::kWarps > 0) Remote::init(storage.remote);
      arch::fence_mbarrier_init_release_cluster();  // the TMA completes on the barriers
    }
    const Context ctx(params);
    for (int d = static_cast<int>(thread); d < ctx.ranks_per_domain; d += static_cast<int>(kMaxThreadsPerBlock)) {
      storage.recv_bound[d].store(
          arch::ld_global(ctx.count_row(params, d) + static_cast<int>(layout::CountRow::MaxRecvRows)));
    }
    if (ctx.grouped) {
      // Generic-proxy writes that TMA (the async proxy) reads later: the fence is the
      // hardware's requirement, the block barrier below orders the other threads.
      auto* vectors = reinterpret_cast<ZeroVector*>(storage.zero_slot);
      for (uint32_t i = thread; i < SlotBytes / sizeof(ZeroVector); i += kMaxThreadsPerBlock) {
        arch::st_shared(&vectors[i], ZeroVector{});
      }
      arch::fence_proxy_async_shared_cta();
    }
    // Its __syncthreads: barrier inits, bounds and the zero slot are visible to
    // every warp, and every peer has finished its previous operation (so its copy-out
    // of our earlier rows is done and its staging may be overwritten).
    const layout::OpDescriptor op{static_cast<uint32_t>(pipeline::OpKind::Dispatch), ctx.grouped, /*probs=*/0,
                                  arch::ld_global(params.handle.made_by_op)};
    entry_barrier(params.domain, seq, op);

    const auto role = static_cast<WarpRole>(arch::warp_idx());
    switch (role) {
      case WarpRole::SendLoad: send_load(params, ctx, storage); break;
      case WarpRole::SendStore: send_store(params, ctx, storage, 0, seq); break;
      case WarpRole::CopyOutLoad: copy_out_load(params, ctx, storage, seq); break;
      case WarpRole::CopyOutStore: copy_out_store(params, ctx, storage); break;
      case WarpRole::RowFields: row_fields(params, ctx, storage, seq); break;
      case WarpRole::RdmaSend:
        if constexpr (Remote::kWarps > 0) Remote::send(params.remote, storage.remote);
        break;
      default:  // Forward + f: send side 1 + f
        if constexpr (kForwarders > 0)
          send_store(params, ctx, storage, 1 + static_cast<int>(role) - static_cast<int>(WarpRole::Forward), seq);
        break;
    }
    op_end(params.domain, seq);
  }

 private:
  static bool aligned(const void* ptr, std::size_t alignment) {
    return reinterpret_cast<uintptr_t>(ptr) % alignment == 0;
  }
  RAILYARD_DEVICE static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
  RAILYARD_DEVICE static uint32_t piece_bytes(uint32_t row_bytes, uint32_t offset) {
    return row_bytes - offset < SlotBytes ? row_bytes - offset : SlotBytes;
  }

  // What every warp derives from the params and the handle at the start.
  struct Context {
    layout::IntranodeLayout layout;
    uint32_t row_bytes;
    int num_scales;  // fp32 scales a row (FP8), else 0
    int ranks_per_domain, num_local_experts, max_topk, max_entries;
    int dest_begin, dest_end;  // the ranks this one sends to: its NVLink domain's
    bool grouped;  // ExpertGrouped output
    bool rows_stay;  // Received output with no out_hidden: the rows stay in staging
    int64_t copy_rows;      // received rows whose header this rank waits for
    int64_t recv_keep;      // received rows below max_recv_rows (received-row outputs)
    int64_t permuted_keep;  // permuted rows below max_permuted_rows
    int64_t handle_rows;    // received rows the handle's expert side describes

    RAILYARD_DEVICE explicit Context(const Params& p)
        : layout(p.domain.shape),
          row_bytes(static_cast<uint32_t>(layout.dispatch_row_bytes())),
          num_scales(layout.num_scales()),
          ranks_per_domain(p.domain.shape.ranks_per_domain),
          num_local_experts(p.domain.shape.num_local_experts),
          max_topk(p.domain.shape.max_topk),
          max_entries(layout.max_entries()),
          dest_begin(p.domain.nvlink_begin()),
          dest_end(p.domain.nvlink_end()),
          grouped(p.output == DispatchOutput::ExpertGrouped),
          rows_stay(!grouped && p.out_hidden == nullptr) {
      const int32_t* mine = count_row(p, p.domain.rank);
      const int64_t num_recv = arch::ld_global(p.handle.totals + static_cast<int>(layout::Total::NumRecv));
      const int64_t num_permuted = arch::ld_global(p.handle.totals + static_cast<int>(layout::Total::NumPermuted));
      const int32_t recv_bound = arch::ld_global(mine + static_cast<int>(layout::CountRow::MaxRecvRows));
      const int32_t permuted_bound = arch::ld_global(mine + static_cast<int>(layout::CountRow::MaxPermutedRows));
      recv_keep = recv_bound < 0 ? num_recv : min_i64(num_recv, recv_bound);
      permuted_keep = permuted_bound < 0 ? num_permuted : min_i64(num_permuted, permuted_bound);
      // A permuted row may come from any received row, so the grouped layout needs
      // every received row; the received layout only those below its bound (sources
      // send nothing past it).
      copy_rows = grouped ? num_recv : recv_keep;
      handle_rows = min_i64(recv_keep, p.handle.recv_capacity);
    }
    RAILYARD_DEVICE const int32_t* count_row(const Params& p, int rank) const {
      return p.handle.count_matrix + static_cast<int64_t>(rank) * layout.count_row_ints();
    }
  };

  // What a lane reads of a token once, for the routing functions below: its first
  // destination's received-row position (recv_pos[t][dest_begin + lane]) and its first
  // slot (slot_expert and slot_pos [t][lane], packed), -1 past the end, with that
  // slot's destination rank and prob. Destinations and slots beyond 32 are read again
  // where used (rounds of 32). One load each per lane, issued together, instead of
  // each function re-reading them one after another; the destination is divided out
  // once per lane, not in the loops over the token's slots. A forwarded token (Remote)
  // is read from its wire row instead of the handle: the same fields, as its source
  // packed them.
  struct TokenView {
    int64_t t;             // this rank's token, or the forwarded row's source token
    const uint8_t* wire;   // the forwarded wire row, null for this rank's own token
    int64_t forwarded;     // its row of HandleView::forward_pos (source domain x M + packed row)
    int32_t src_rank;      // the token's rank (in the group)
    int32_t pos;           // recv_pos[t][dest_begin + lane]
    uint64_t slot;         // slot_expert[t][lane] | slot_pos[t][lane] << 32
    int32_t dest;          // the rank of slot `lane`'s expert, -1 for none
    float prob;            // slot_prob[t][lane], 0 past max_topk
  };
  RAILYARD_DEVICE static uint64_t load_slot(const Params& p, const Context& c, const TokenView& v, int k) {
    if (k >= c.max_topk) return ~uint64_t{0};  // expert -1, slot_pos -1
    const int32_t* expert = p.handle.slot_expert + v.t * c.max_topk + k;
    const int32_t* slot_pos = p.handle.slot_pos + v.t * c.max_topk + k;
    if constexpr (Remote::kForwards) {
      if (v.wire != nullptr) {
        expert = &(Remote::slots(p.remote, v.wire) + k)->expert;
        slot_pos = &(Remote::slots(p.remote, v.wire) + k)->permuted_pos;
      }
    }
    const auto e = static_cast<uint32_t>(arch::ld_global(expert));
    const auto q = static_cast<uint32_t>(arch::ld_global(slot_pos));
    return uint64_t{e} | uint64_t{q} << 32;
  }
  // -1 for a rank outside this one's NVLink domain: the token reaches it through its
  // rail peer in that domain, not from here.
  RAILYARD_DEVICE static int32_t load_pos(const Params& p, const Context& c, const TokenView& v, int d) {
    if (d < c.dest_begin || d >= c.dest_end) return -1;
    if constexpr (Remote::kForwards) {
      if (v.wire != nullptr) return arch::ld_global(Remote::recv_pos(p.remote, v.wire) + (d - c.dest_begin));
    }
    return arch::ld_global(p.handle.recv_pos + v.t * c.ranks_per_domain + d);
  }
  RAILYARD_DEVICE static float load_prob(const Params& p, const Context& c, const TokenView& v, int k) {
    if (k >= c.max_topk) return 0.0f;
    if constexpr (Remote::kForwards) {
      if (v.wire != nullptr) return arch::ld_global(&(Remote::slots(p.remote, v.wire) + k)->prob);
    }
    return arch::ld_global(p.handle.slot_prob + v.t * c.max_topk + k);
  }
  // The token's row bytes and FP8 scales.
  RAILYARD_DEVICE static const uint8_t* row_of(const Params& p, const Context& c, const TokenView& v) {
    if constexpr (Remote::kForwards) {
      if (v.wire != nullptr) return Remote::payload(p.remote, v.wire);
    }
    return p.hidden + v.t * c.row_bytes;
  }
  RAILYARD_DEVICE static const float* scales_of(const Params& p, const Context& c, const TokenView& v) {
    if constexpr (Remote::kForwards) {
      if (v.wire != nullptr) return Remote::scales(p.remote, v.wire);
    }
    return p.scales + v.t * c.num_scales;
  }
  RAILYARD_DEVICE static int32_t dest_of(const Context& c, uint64_t slot) {
    const int32_t e = expert_of(slot);
    return e >= 0 ? e / c.num_local_experts : -1;
  }
  RAILYARD_DEVICE static bool sends_to(const Context& c, int32_t dest) { return dest >= c.dest_begin && dest < c.dest_end; }
  // Token t of this rank (wire null), or the forwarded wire row `wire`, row `forwarded`
  // of the handle's forward_pos.
  RAILYARD_DEVICE static TokenView view_token(const Params& p, const Context& c, int64_t t, const uint8_t* wire,
                                              int64_t forwarded = -1) {
    const int lane = static_cast<int>(arch::lane_idx());
    TokenView v{t, wire, forwarded, p.domain.rank, -1, 0, -1, 0.0f};
    if constexpr (Remote::kForwards) {
      if (wire != nullptr) {
        v.t = arch::ld_global(&Remote::header(p.remote, wire)->src_token);
        v.src_rank = arch::ld_global(&Remote::header(p.remote, wire)->src_rank);
      }
    }
    v.slot = load_slot(p, c, v, lane);
    v.pos = load_pos(p, c, v, c.dest_begin + lane);
    v.dest = dest_of(c, v.slot);
    v.prob = load_prob(p, c, v, lane);
    return v;
  }
  // Calls fn(view) for the tokens of send side `side`, each token's view loaded before
  // fn runs on the one before it: a role spends one token's work, not its own, waiting
  // for the next token's loads. Side 0: this block's tokens in order. Side 1 + f
  // (across domains): the wire rows of the received chunks dealt to this block's
  // Forward warp f, each chunk once its signal says it landed. Warp-collective.
  template <class Fn>
  RAILYARD_DEVICE static void for_each_token_view(const Params& p, const Context& c, int side, Fn&& fn) {
    if (side == 0) {
      BlockChunks tokens(p.num_tokens, p.chunk_rows);
      TokenView next = tokens.valid() ? view_token(p, c, tokens.item, nullptr) : TokenView{};
      while (tokens.valid()) {
        const TokenView current = next;
        tokens.advance();
        if (tokens.valid()) next = view_token(p, c, tokens.item, nullptr);
        fn(current);
      }
      return;
    }
    if constexpr (Remote::kForwards) {
      Remote::for_each_chunk(p.remote, side - 1, kForwarders,
                             [&](const uint8_t* rows, int n, int64_t stride, int64_t forwarded) {
                               TokenView ahead = view_token(p, c, 0, rows, forwarded);
                               for (int i = 0; i < n; ++i) {
                                 const TokenView current = ahead;
                                 if (i + 1 < n) ahead = view_token(p, c, 0, rows + (i + 1) * stride, forwarded + i + 1);
                                 fn(current);
                               }
                             });
    }
  }
  RAILYARD_DEVICE static int32_t expert_of(uint64_t slot) { return static_cast<int32_t>(static_cast<uint32_t>(slot)); }
  RAILYARD_DEVICE static int32_t slot_pos_of(uint64_t slot) {
    return static_cast<int32_t>(static_cast<uint32_t>(slot >> 32));
  }

  // Whether token t's row goes into the send FIFO: some destination copies it out.
  // SendLoad and SendStore both decide with this one function, so they agree on
  // which tokens occupy FIFO slots. Warp-collective: a lane per destination (or per
  // slot), then __any_sync.
  RAILYARD_DEVICE static bool token_sends_row(const Params& p, const Context& c, const SharedStorage& s,
                                              const TokenView& v) {
    const int lane = static_cast<int>(arch::lane_idx());
    bool sends = false;
    if (c.grouped) {
      // A kept permuted position (slot_pos >= 0) at a rank this one sends to is a row
      // that rank copies out.
      for (int base = 0; base < c.max_topk; base += static_cast<int>(arch::kWarpSize)) {
        const uint64_t slot = base == 0 ? v.slot : load_slot(p, c, v, base + lane);
        sends |= slot_pos_of(slot) >= 0 && sends_to(c, base == 0 ? v.dest : dest_of(c, slot));
      }
    } else {
      for (int d = c.dest_begin + lane; d < c.dest_end; d += static_cast<int>(arch::kWarpSize)) {
        const int32_t pos = d == c.dest_begin + lane ? v.pos : load_pos(p, c, v, d);
        const int32_t bound = s.recv_bound[d].load();
        sends |= pos >= 0 && (bound < 0 || pos < bound);
      }
    }
    return __any_sync(arch::kFullWarpMask, sends);
  }

  // Calls fn(k, slot, dest) on every lane for every top-k slot k of the token, in slot
  // order, with dest the rank of its expert (-1: none): a lane per slot holds them,
  // shuffles hand them to the others (32 slots a round). Warp-collective.
  template <class Fn>
  RAILYARD_DEVICE static void for_each_slot(const Params& p, const Context& c, const TokenView& v, Fn&& fn) {
    const int K = c.max_topk;
    for (int base = 0; base < K; base += static_cast<int>(arch::kWarpSize)) {
      const uint64_t mine = base == 0 ? v.slot : load_slot(p, c, v, base + static_cast<int>(arch::lane_idx()));
      const int32_t dest = base == 0 ? v.dest : dest_of(c, mine);
      const int n = K - base < static_cast<int>(arch::kWarpSize) ? K - base : static_cast<int>(arch::kWarpSize);
      for (int j = 0; j < n; ++j)
        fn(base + j, __shfl_sync(arch::kFullWarpMask, mine, j), __shfl_sync(arch::kFullWarpMask, dest, j));
    }
  }

  // ---- send side ----------------------------------------------------------------------------

  RAILYARD_DEVICE static void send_load(const Params& p, const Context& c, SharedStorage& s) {
    const bool leader = arch::elect_one_sync();
    SendSide& out = s.send[0];
    Pipeline pipe(out.pipe, p.domain.wait());  // used by the leader only
    PipelineState state;
    for_each_token_view(p, c, 0, [&](const TokenView& view) {
      if (!token_sends_row(p, c, s, view) || !leader) return;
      const uint8_t* src = row_of(p, c, view);
      for (uint32_t offset = 0; offset < c.row_bytes; offset += SlotBytes) {
        const uint32_t bytes = piece_bytes(c.row_bytes, offset);
        pipe.producer_acquire(state, bytes);
        arch::bulk_copy_g2s(out.slots[state.index], src + offset, bytes, pipe.full_barrier(state));
        ++state;
      }
    });
  }

  // SendStore's leader (and each Forward warp's): issues each piece to every
  // destination that copies the row out, and finds the tokens whose rows have landed.
  // A Forward warp's leader also fills its FIFO: load() starts a row's pieces, as many
  // as free slots allow, and each piece() loads more as slots come back, so a load
  // never waits for a slot only this thread would free.
  struct SendIssuer {
    BulkConsumer fifo;
    Pipeline loads;          // the FIFO's producer side (Forward warps)
    PipelineState loaded;    // the next slot to load
    uint32_t pieces_loaded = 0;
    const uint8_t* src = nullptr;
    uint32_t src_bytes = 0, src_offset = 0;  // the row being loaded, and how much of it is

    RAILYARD_DEVICE SendIssuer(SendSide& s, const pipeline::WaitPolicy& wait)
        : fifo(s.pipe, wait), loads(s.pipe, wait) {}

    RAILYARD_DEVICE void load(SendSide& s, const uint8_t* row, uint32_t row_bytes) {
      src = row;
      src_bytes = row_bytes;
      src_offset = 0;
      load_more(s);
    }
    RAILYARD_DEVICE void load_more(SendSide& s) {
      // Slots held: loaded and not stored from (pieces_loaded - committed), and at most
      // kReadLag stored from and not given back. So the slot producer_acquire waits for
      // is one this thread gave back after its stores read it (bulk_wait_group_read):
      // the wait never blocks (deleting it changes nothing); it arms the full barrier.
      for (; src_offset < src_bytes && pieces_loaded - fifo.committed < static_cast<uint32_t>(Stages - kReadLag);
           ++pieces_loaded) {
        const uint32_t bytes = piece_bytes(src_bytes, src_offset);
        loads.producer_acquire(loaded, bytes);
        arch::bulk_copy_g2s(s.slots[loaded.index], src + src_offset, bytes, loads.full_barrier(loaded));
        ++loaded;
        src_offset += bytes;
      }
    }

    RAILYARD_DEVICE void piece(const Params& p, const Context& c, SendSide& s, int ring, uint32_t offset) {
      const uint32_t bytes = piece_bytes(c.row_bytes, offset);
      const uint32_t slot = fifo.wait();
      for_each_byte_dest(c, s, [&](int d) {
        uint8_t* row = c.layout.stage_row(p.domain.peers.base(d), s.pos[ring][d].load());
        transport::nvlink::put_bulk(row + offset, s.slots[slot], bytes);
      });
      fifo.commit();
      load_more(s);
    }

    // How many of the pending tokens [published, issued) to publish now: those whose
    // groups have completed, kPublishBatch or more at a time; with `all`, every one
    // (after waiting for every group). A completed wait is followed by an implicit
    // generic-async proxy fence (PTX, "Async proxy"), so the lanes' release after the
    // warp barrier that follows publishes the rows.
    RAILYARD_DEVICE int landed(const SendSide& s, int64_t published, int64_t issued, bool all) {
      const uint32_t committed = fifo.committed;
      uint32_t done;
      if (all) {
        arch::bulk_wait_group<0>();
        done = committed;
        fifo.give_back(committed);
      } else {
        arch::bulk_wait_group<kWriteLag>();
        done = committed > kWriteLag ? committed - kWriteLag : 0;
      }
      int64_t n = published;
      while (n < issued && s.groups[n % kPendingTokens].load() <= done) ++n;
      return all || n - published >= kPublishBatch ? static_cast<int>(n - published) : 0;
    }
  };

  RAILYARD_DEVICE static void send_store(const Params& p, const Context& c, SharedStorage& storage, int side,
                                         uint64_t seq) {
    const bool leader = arch::elect_one_sync();
    SendSide& s = storage.send[side];
    SendIssuer issuer(s, p.domain.wait());  // used by the leader only
    int64_t issued = 0, published = 0;      // this side's tokens so far
    for_each_token_view(p, c, side, [&](const TokenView& view) {
      const int ring = static_cast<int>(issued % kPendingTokens);
      const bool sends = token_sends_row(p, c, storage, view);
      // A Forward warp's row loads while the warp routes it.
      if (side > 0 && leader && sends) issuer.load(s, row_of(p, c, view), c.row_bytes);
      route_token(p, c, storage, s, view, ring);
      // The row, piece by piece, to every destination that copies it out, each once
      // however many of its experts the token chose.
      if (leader) {
        if (sends) {
          for (uint32_t offset = 0; offset < c.row_bytes; offset += SlotBytes) issuer.piece(p, c, s, ring, offset);
        }
        s.groups[ring].store(issuer.fifo.committed);
      }
      // Publish the earlier tokens whose rows have landed (all of them when the ring
      // would be full at the next token), then write this token's header: a lane's
      // fence then waits for headers it wrote an iteration ago, not for this one's.
      if (leader)
        s.publish_count.store(issuer.landed(s, published, issued, issued - published == kPendingTokens - 1));
      __syncwarp();  // every lane's earlier header writes and the leader's completed waits are behind
      published += publish(p, c, s, seq, published);
      // The leader writes publish_count again only after the next token's route_token
      // barrier, which every lane reaches after reading it here.
      write_header(p, c, s, view, ring);
      ++issued;
    });
    __syncwarp();  // every lane has read the last publish_count
    if (leader) s.publish_count.store(issuer.landed(s, published, issued, /*all=*/true));
    __syncwarp();
    publish(p, c, s, seq, published);
  }

  // SendStore step 1, every lane: where token t goes, into ring entry `ring`. A
  // destination gets the header when it waits for it (every row in the grouped layout,
  // rows below its bound otherwise) and the row bytes when it copies them out. Ends
  // with a warp barrier: the leader reads every destination's entry.
  RAILYARD_DEVICE static void route_token(const Params& p, const Context& c, const SharedStorage& storage, SendSide& s,
                                          const TokenView& v, int ring) {
    __syncwarp();  // every lane has read the previous token's entries (write_header)
    // A lane per destination d of this rank's domain, 32 a round (every lane takes
    // every round: the slots come by shuffles).
    for (int base = c.dest_begin; base < c.dest_end; base += static_cast<int>(arch::kWarpSize)) {
      const int d = base + static_cast<int>(arch::lane_idx());
      const int32_t pos = base == c.dest_begin ? v.pos : load_pos(p, c, v, d);
      const int32_t bound = d < c.dest_end ? storage.recv_bound[d].load() : -1;
      int entries = 0;      // the token's experts on d
      bool kept = false;    // one of them has a kept permuted position (grouped)
      for_each_slot(p, c, v, [&](int, uint64_t slot, int32_t dest) {
        if (dest == d) {
          ++entries;
          kept |= slot_pos_of(slot) >= 0;
        }
      });
      if constexpr (Remote::kForwards) {
        // What the combine's partial of a forwarded row sums: its staged rows below
        // their ranks' bounds (in either layout).
        if (v.forwarded >= 0 && d < c.dest_end) {
          const int span = c.dest_end - c.dest_begin;
          arch::st_global(p.handle.forward_pos + v.forwarded * span + (d - c.dest_begin),
                          pos >= 0 && (bound < 0 || pos < bound) ? pos : -1);
        }
      }
      const bool header = pos >= 0 && (c.grouped || bound < 0 || pos < bound);
      const bool bytes = header && (!c.grouped || kept);
      const uint32_t mask = __ballot_sync(arch::kFullWarpMask, d < c.dest_end && bytes);
      if (d >= c.dest_end) continue;
      s.pos[ring][d].store(header ? pos : -1);
      s.entries[d].store(static_cast<int16_t>(entries));
      if (d == base) s.bytes[(base - c.dest_begin) / 32].store(mask);
    }
    __syncwarp();
  }

  // Calls fn(d) for every destination d the current token's row bytes go to, in
  // ascending order (route_token's bits).
  template <class Fn>
  RAILYARD_DEVICE static void for_each_byte_dest(const Context& c, const SendSide& s, Fn&& fn) {
    for (int base = c.dest_begin; base < c.dest_end; base += static_cast<int>(arch::kWarpSize)) {
      for (uint32_t mask = s.bytes[(base - c.dest_begin) / 32].load(); mask != 0; mask &= mask - 1)
        fn(base + __ffs(static_cast<int>(mask)) - 1);
    }
  }

  // SendStore step 3, every lane: token t's header fields and entries, and its FP8
  // scales, at every destination. Entries are in ascending local expert order, the
  // order combine sums in. `seq` is not written here: publish() does, once the row
  // has landed.
  RAILYARD_DEVICE static void write_header(const Params& p, const Context& c, const SendSide& s, const TokenView& v,
                                           int ring) {
    const int lane = static_cast<int>(arch::lane_idx());
    const int K = c.max_topk, El = c.num_local_experts;
    for (int d = c.dest_begin + lane; d < c.dest_end; d += static_cast<int>(arch::kWarpSize)) {
      const int32_t pos = s.pos[ring][d].load();
      if (pos < 0) continue;
      layout::RowHeader* header = c.layout.header(p.domain.peers.base(d), pos);
      transport::nvlink::put(&header->src_token, static_cast<int32_t>(v.t));
      transport::nvlink::put(&header->num_entries, s.entries[d].load());
      transport::nvlink::put(&header->src_rank, static_cast<int16_t>(v.src_rank));
    }
    // A lane per slot k, 32 a round (every lane takes every round: the other slots
    // come by shuffles).
    for (int base = 0; base < K; base += static_cast<int>(arch::kWarpSize)) {
      const int k = base + lane;
      const uint64_t slot = base == 0 ? v.slot : load_slot(p, c, v, k);
      const int32_t e = expert_of(slot), slot_pos = slot_pos_of(slot);
      const int32_t d = base == 0 ? v.dest : dest_of(c, slot);
      int32_t index = 0;  // this entry's place among the token's experts on d
      for_each_slot(p, c, v, [&](int, uint64_t other, int32_t other_dest) {
        index += (other_dest == d && expert_of(other) < e) ? 1 : 0;
      });
      if (e < 0 || !sends_to(c, d)) continue;
      const int32_t pos = s.pos[ring][d].load();
      if (pos < 0) continue;
      layout::HeaderEntry* entry = c.layout.header_entries(p.domain.peers.base(d), pos) + index;
      transport::nvlink::put(&entry->local_expert, static_cast<int32_t>(e - d * El));
      transport::nvlink::put(&entry->prob, base == 0 ? v.prob : load_prob(p, c, v, k));
      transport::nvlink::put(&entry->permuted_pos, slot_pos);
    }
    for (int i = lane; i < c.num_scales; i += static_cast<int>(arch::kWarpSize)) {
      const float scale = arch::ld_global(scales_of(p, c, v) + i);
      for_each_byte_dest(c, s, [&](int d) {
        transport::nvlink::put(c.layout.stage_scales(p.domain.peers.base(d), s.pos[ring][d].load()) + i, scale);
      });
    }
  }

  // SendStore step 4, every lane, after the warp barrier behind the leader's landed():
  // `seq` of the publish_count tokens from `published` on, at destination dest_begin +
  // lane (+32, ...), the ones route_token gave the lane. One fence.acq_rel.sys per lane and batch, then relaxed stores: the release
  // pattern, which covers every lane's header writes (the warp barrier) and the
  // leader's completed bulk stores. Each lane reads and writes only its own
  // destinations' ring entries, so the next token's route_token needs no barrier.
  RAILYARD_DEVICE static int publish(const Params& p, const Context& c, const SendSide& s, uint64_t seq,
                                     int64_t published) {
    const int count = s.publish_count.load();
    for (int d = c.dest_begin + static_cast<int>(arch::lane_idx()); d < c.dest_end;
         d += static_cast<int>(arch::kWarpSize)) {
      bool fenced = false;
      for (int i = 0; i < count; ++i) {
        const int32_t pos = s.pos[(published + i) % kPendingTokens][d].load();
        if (pos < 0) continue;
        if (!fenced) arch::fence_acq_rel_sys();
        fenced = true;
        transport::nvlink::signal_relaxed(&c.layout.header(p.domain.peers.base(d), pos)->seq, seq);
      }
    }
    return count;
  }

  // ---- copy-out side ---------------------------------------------------------------------------

  // Whether received row r's bytes go anywhere: in the received layout unless they stay
  // in staging; in the grouped layout when one of its permuted positions is kept.
  RAILYARD_DEVICE static bool row_is_copied(const Context& c, uint8_t* self, int64_t r) {
    if (!c.grouped) return !c.rows_stay;
    const int32_t num_entries = arch::ld_global(&c.layout.header(self, r)->num_entries);
    const layout::HeaderEntry* entries = c.layout.header_entries(self, r);
    for (int e = 0; e < num_entries; ++e) {
      if (arch::ld_global(&entries[e].permuted_pos) >= 0) return true;
    }
    return false;
  }

  RAILYARD_DEVICE static void copy_out_load(const Params& p, const Context& c, SharedStorage& s, uint64_t seq) {
    // Rows that stay are not copied; RowFields waits for every header.
    if (c.rows_stay || !arch::elect_one_sync()) return;
    uint8_t* self = p.domain.self();
    Pipeline pipe(s.copy_pipe, p.domain.wait());
    PipelineState state;
    for_each_in_block_chunks(c.copy_rows, p.chunk_rows, [&](int64_t r) {
      const uint64_t* row_seq = &c.layout.header(self, r)->seq;
      pipeline::wait_at_least_acquire(row_seq, seq,
                                      {"dispatch: row header seq of received row", r, static_cast<int64_t>(seq)},
                                      p.domain.wait());
      // The row was written by TMA and is read by TMA; the acquire above is generic.
      arch::fence_proxy_async_global();
      if (!row_is_copied(c, self, r)) {
        // One empty slot still tells CopyOutStore that the header is in.
        pipe.producer_acquire(state);
        pipe.producer_commit(state);
        ++state;
        return;
      }
      const uint8_t* src = c.layout.stage_row(self, r);
      for (uint32_t offset = 0; offset < c.row_bytes; offset += SlotBytes) {
        const uint32_t bytes = piece_bytes(c.row_bytes, offset);
        pipe.producer_acquire(state, bytes);
        arch::bulk_copy_g2s(s.copy_slots[state.index], src + offset, bytes, pipe.full_barrier(state));
        ++state;
      }
    });
  }

  RAILYARD_DEVICE static void copy_out_store(const Params& p, const Context& c, SharedStorage& s) {
    if (c.rows_stay) return;  // nothing to copy, no padding (received layout)
    const bool leader = arch::elect_one_sync();
    if (leader) {
      uint8_t* self = p.domain.self();
      BulkConsumer fifo(s.copy_pipe, p.domain.wait());
      for_each_in_block_chunks(c.copy_rows, p.chunk_rows, [&](int64_t r) {
        // The wait on the row's first slot orders its header, which CopyOutLoad
        // acquired before filling the slot.
        uint32_t slot = fifo.wait();
        if (!row_is_copied(c, self, r)) return fifo.commit();  // its one empty slot
        const int32_t num_entries = c.grouped ? arch::ld_global(&c.layout.header(self, r)->num_entries) : 0;
        const layout::HeaderEntry* entries = c.layout.header_entries(self, r);
        // The row bytes, piece by piece, to its received row or to each kept permuted row.
        for (uint32_t offset = 0; offset < c.row_bytes; offset += SlotBytes) {
          const uint32_t bytes = piece_bytes(c.row_bytes, offset);
          if (offset > 0) slot = fifo.wait();
          if (!c.grouped) {
            arch::bulk_copy_s2g(p.out_hidden + r * c.row_bytes + offset, s.copy_slots[slot], bytes);
          }
          for (int e = 0; e < num_entries; ++e) {
            const int32_t pos = arch::ld_global(&entries[e].permuted_pos);
            if (pos < 0 || pos >= c.permuted_keep) continue;
            arch::bulk_copy_s2g(p.out_hidden + static_cast<int64_t>(pos) * c.row_bytes + offset, s.copy_slots[slot],
                                bytes);
          }
          fifo.commit();
        }
      });
    }
    // The padding rows touch nothing the loop above did (the zero slot, other rows).
    if (c.grouped) zero_padding_rows(p, c, s, leader, static_cast<int>(arch::lane_idx()));
    // The slots must be read before the block retires (the last one is never given
    // back: CopyOutLoad has nothing left to put in it). The writes (this rank's
    // outputs) need no wait: rows sent to peers were waited for before their headers'
    // release, and the kernel's completion orders the rest before later work.
    if (leader) arch::bulk_wait_group_read<0>();
  }

  // RowFields: the rows from each source in the order they land. Source s's rows are
  // received rows [first_s, first_s + n_s) in its token order, and land in about that
  // order (its SendStore's, or its rail peer's forwarding, chunk by chunk). The block
  // takes rows k = blockIdx.x + m gridDim.x of every source, m = 0, 1, ..., in the order
  // (m, s), dealt to the lanes round robin; a lane waits for each row's header and
  // writes the row's small fields. So the lanes take the sources' rows in about the
  // order they land, not behind a row that lands after the ones following it (taken in
  // position order, a lane waited for a source's last rows, forwarded at the end of a
  // dispatch across domains, before any row of the next source).
  RAILYARD_DEVICE static void row_fields(const Params& p, const Context& c, SharedStorage& s, uint64_t seq) {
    const int lane = static_cast<int>(arch::lane_idx()), G = c.ranks_per_domain, W = arch::kWarpSize;
    // first_row[src] = first_src, 32 sources a round (an inclusive scan of their counts);
    // first_row[G]: every received row.
    int32_t before = 0, most = 0;
    for (int round = 0; round < G; round += W) {
      const int src = round + lane;
      const int32_t n = src < G ? arch::ld_global(c.count_row(p, src) + layout::count_to_rank(p.domain.rank)) : 0;
      int32_t upto = n;
      for (int o = 1; o < W; o *= 2) {
        const int32_t theirs = __shfl_up_sync(arch::kFullWarpMask, upto, o);
        if (lane >= o) upto += theirs;
      }
      if (src < G) s.first_row[src].store(before + upto - n);
      before += __shfl_sync(arch::kFullWarpMask, upto, W - 1);
      most = n > most ? n : most;
    }
    most = warp_max(most);
    if (lane == 0) s.first_row[G].store(before);
    __syncwarp();  // every lane's first_row stores before any lane reads them
    for (int64_t i = lane;; i += W) {
      const int64_t k = blockIdx.x + int64_t{gridDim.x} * (i / G);
      if (k >= most) break;
      const int src = static_cast<int>(i % G);
      const int32_t first = s.first_row[src].load(), n = s.first_row[src + 1].load() - first;
      if (k < n && first + k < c.copy_rows) row_fields_of(p, c, seq, first + k);
    }
  }

  RAILYARD_DEVICE static void row_fields_of(const Params& p, const Context& c, uint64_t seq, int64_t r) {
    const int El = c.num_local_experts;
    const int ns = c.num_scales;
    uint8_t* self = p.domain.self();
    const layout::RowHeader* row_header = c.layout.header(self, r);
    pipeline::wait_at_least_acquire(&row_header->seq, seq,
                                    {"dispatch: row header seq of received row", r, static_cast<int64_t>(seq)},
                                    p.domain.wait());
    const layout::RowHeader header = arch::ld_global(row_header);
    const layout::HeaderEntry* entries = c.layout.header_entries(self, r);
    const float* src_scales = c.layout.stage_scales(self, r);

    // Per received row (below max_recv_rows): source, routing map, received probs and
    // scales.
    if (r < c.recv_keep) {
      if (p.out_src_rank != nullptr) arch::st_global(p.out_src_rank + r, static_cast<int32_t>(header.src_rank));
      if (p.out_src_token != nullptr) arch::st_global(p.out_src_token + r, header.src_token);
      const bool received_probs = !c.grouped && p.out_probs != nullptr;
      // Zeros for every local expert, then the chosen ones (the same thread's later
      // store to the same address wins).
      for (int j = 0; j < El; ++j) {
        if (p.out_routing_map != nullptr) arch::st_global(p.out_routing_map + r * El + j, uint8_t{0});
        if (received_probs) arch::st_global(p.out_probs + r * El + j, 0.0f);
      }
      for (int e = 0; e < header.num_entries; ++e) {
        const int32_t j = arch::ld_global(&entries[e].local_expert);
        if (j < 0 || j >= El) continue;
        if (p.out_routing_map != nullptr) arch::st_global(p.out_routing_map + r * El + j, uint8_t{1});
        if (received_probs) arch::st_global(p.out_probs + r * El + j, arch::ld_global(&entries[e].prob));
      }
      if (!c.grouped) {
        for (int i = 0; i < ns; ++i) arch::st_global(p.out_scales + r * ns + i, arch::ld_global(src_scales + i));
      }
    }
    // The handle's expert side (rows it describes).
    if (r < c.handle_rows) {
      arch::st_global(p.handle.recv_src + 2 * r, static_cast<int32_t>(header.src_rank));
      arch::st_global(p.handle.recv_src + 2 * r + 1, header.src_token);
      arch::st_global(p.handle.recv_num_entries + r, static_cast<int32_t>(header.num_entries));
      for (int e = 0; e < header.num_entries; ++e) {
        const layout::RecvEntry entry{arch::ld_global(&entries[e].local_expert),
                                      arch::ld_global(&entries[e].permuted_pos)};
        arch::st_global(p.handle.recv_entries + r * c.max_entries + e, entry);
      }
    }
    // Per kept permuted row: prob, received row, scales.
    if (c.grouped) {
      for (int e = 0; e < header.num_entries; ++e) {
        const int32_t pos = arch::ld_global(&entries[e].permuted_pos);
        if (pos < 0 || pos >= c.permuted_keep) continue;
        if (p.out_probs != nullptr) arch::st_global(p.out_probs + pos, arch::ld_global(&entries[e].prob));
        if (p.out_recv_row != nullptr) arch::st_global(p.out_recv_row + pos, r);
        for (int i = 0; i < ns; ++i) {
          arch::st_global(p.out_scales + static_cast<int64_t>(pos) * ns + i, arch::ld_global(src_scales + i));
        }
      }
    }
  }

  // Padding rows of the grouped layout: [start_j + unpadded_j, start_j + padded_j) for
  // each local expert j, below max_permuted_rows. Padding row q (counted over all
  // experts) belongs to block q % gridDim.x.
  RAILYARD_DEVICE static void zero_padding_rows(const Params& p, const Context& c, SharedStorage& s, bool leader,
                                                int lane) {
    const int El = c.num_local_experts;
    const int64_t* padded = p.handle.totals + static_cast<int>(layout::Total::TokensPerExpert);
    const int64_t* unpadded = padded + El;
    int64_t start = 0, q = 0;
    for (int j = 0; j < El && start < c.permuted_keep; ++j) {
      const int64_t rows = arch::ld_global(padded + j);
      const int64_t end = min_i64(start + rows, c.permuted_keep);
      for (int64_t row = start + arch::ld_global(unpadded + j); row < end; ++row, ++q) {
        if (q % gridDim.x != blockIdx.x) continue;
        if (leader) {
          for (uint32_t offset = 0; offset < c.row_bytes; offset += SlotBytes) {
            arch::bulk_copy_s2g(p.out_hidden + row * c.row_bytes + offset, s.zero_slot,
                                piece_bytes(c.row_bytes, offset));
          }
          arch::bulk_commit_group();  // the zero slot never changes: nothing to wait for here
          if (p.out_probs != nullptr) arch::st_global(p.out_probs + row, 0.0f);
          if (p.out_recv_row != nullptr) arch::st_global(p.out_recv_row + row, int64_t{-1});
        }
        for (int i = lane; i < c.num_scales; i += static_cast<int>(arch::kWarpSize)) {
          arch::st_global(p.out_scales + row * c.num_scales + i, 0.0f);
        }
      }
      start += rows;
    }
  }
};

}  // namespace railyard::kernels::intranode
