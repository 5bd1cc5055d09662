// railyard._bench: the C++ benchmark's workload, counted bytes and performance model
// (bench_workload.*, bench_model.*) for the Python benchmark (benchmarks/bench_ep.py),
// so that both benchmarks use one implementation of the presets, the routing (the same
// routing for the same seed), the bytes the bandwidth definitions count, the NVLink
// minimum and the model. Plain host code: no torch, no simulator, no GPU.
//
// Arrays cross as Python lists (small: per rank or per pair), except a routing's and the
// rows' contents, which cross as bytes (little-endian, C order) for torch.frombuffer.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "bench_model.hpp"
#include "bench_workload.hpp"
#include "railyard/layout/intranode_layout.cuh"

namespace py = pybind11;
using namespace railyard::bench;
using railyard::DType;
using railyard::TokenLayout;

namespace {

DType parse_dtype(const std::string& s) {
  if (s == "bf16") return DType::BF16;
  if (s == "fp8") return DType::FP8_E4M3;
  throw py::value_error("railyard._bench: dtype is '" + s + "'; expected 'bf16' or 'fp8'");
}

Op parse_op(const std::string& s) {
  if (s == "dispatch") return Op::Dispatch;
  if (s == "combine") return Op::Combine;
  throw py::value_error("railyard._bench: op is '" + s + "'; expected 'dispatch' or 'combine'");
}

template <class T>
py::bytes as_bytes(const std::vector<T>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace

PYBIND11_MODULE(_bench, m) {
  m.doc() = "railyard_bench_ep's workload, counted bytes and performance model (benchmarks/bench_*.hpp)";

  py::class_<Params>(m, "Params")
      .def(py::init<>())
      .def_readwrite("preset", &Params::preset)
      .def_readwrite("hidden", &Params::hidden)
      .def_readwrite("tokens", &Params::tokens)
      .def_readwrite("ranks", &Params::ranks)
      .def_readwrite("domains", &Params::domains)
      .def("ranks_per_domain", &Params::ranks_per_domain)
      .def_readwrite("experts_per_rank", &Params::experts_per_rank)
      .def_readwrite("topk", &Params::topk)
      .def_property(
          "dtype", [](const Params& p) { return std::string(dtype_name(p.dtype)); },
          [](Params& p, const std::string& s) { p.dtype = parse_dtype(s); })
      .def_readwrite("skew", &Params::skew)
      .def_readwrite("sms", &Params::sms)
      .def_property(
          "layouts",
          [](const Params& p) {
            std::vector<std::string> names;
            for (TokenLayout l : p.layouts) names.push_back(layout_name(l));
            return names;
          },
          [](Params& p, const std::vector<std::string>& names) {
            p.layouts.clear();
            for (const auto& n : names) {
              if (n != "received" && n != "grouped")
                throw py::value_error("railyard._bench: layout '" + n + "'; expected 'received' or 'grouped'");
              p.layouts.push_back(n == "grouped" ? TokenLayout::ExpertGrouped : TokenLayout::Received);
            }
          })
      .def_readwrite("pad_multiple", &Params::pad_multiple)
      .def_readwrite("rows_in_buffer", &Params::rows_in_buffer)
      .def_readwrite("iters", &Params::iters)
      .def_readwrite("warmup", &Params::warmup)
      .def_readwrite("seed", &Params::seed)
      .def_readwrite("sim_sms", &Params::sim_sms)
      .def_readwrite("sim_tokens", &Params::sim_tokens)
      .def_readwrite("sim_full", &Params::sim_full)
      .def_readwrite("sim_timed", &Params::sim_timed)
      .def_readwrite("sim_waits", &Params::sim_waits)
      .def_readwrite("sim_gpu", &Params::sim_gpu)
      .def_readwrite("preemption", &Params::preemption)
      .def_readwrite("host_overhead_iters", &Params::host_overhead_iters)
      .def_readwrite("model_fixed_us", &Params::model_fixed_us)
      .def_readwrite("model_token_latency_us", &Params::model_token_latency_us)
      .def("num_experts", &Params::num_experts)
      .def("dispatch_row_bytes", &Params::dispatch_row_bytes)
      .def("combine_row_bytes", &Params::combine_row_bytes);

  m.def(
      "preset",
      [](const std::string& name) {
        Params p;
        if (!apply_preset(name, &p)) throw py::value_error("railyard._bench: no preset '" + name + "'; expected seed, seed-4x8 or deepep");
        return p;
      },
      py::arg("name"), "A Params holding the preset's values (seed, seed-4x8 or deepep) and every other default.");
  m.def(
      "apply_preset", [](const std::string& name, Params& p) { return apply_preset(name, &p); }, py::arg("name"),
      py::arg("params"));

  py::class_<Routing>(m, "Routing")
      .def(py::init([](std::vector<int64_t> idx, std::vector<float> weights) {
             if (idx.size() != weights.size()) throw py::value_error("railyard._bench.Routing: idx and weights differ in length");
             return Routing{std::move(idx), std::move(weights)};
           }),
           py::arg("topk_idx"), py::arg("topk_weights"))
      .def_readonly("topk_idx", &Routing::topk_idx)
      .def_readonly("topk_weights", &Routing::topk_weights)
      .def("topk_idx_bytes", [](const Routing& r) { return as_bytes(r.topk_idx); }, "int64 [T * K], C order")
      .def("topk_weights_bytes", [](const Routing& r) { return as_bytes(r.topk_weights); }, "float32 [T * K]");
  m.def("make_routing", &make_routing, py::arg("params"), py::arg("tokens"), py::arg("seed"),
        "Every rank's routing, exactly as railyard_bench_ep makes it for this seed.");
  m.def(
      "make_rows",
      [](const Params& p, int64_t tokens, uint64_t seed) {
        std::vector<py::bytes> out;
        for (const auto& rows : make_rows(p, tokens, seed)) out.push_back(as_bytes(rows));
        return out;
      },
      py::arg("params"), py::arg("tokens"), py::arg("seed"),
      "Every rank's BF16 rows [tokens, hidden] as bytes (bf16 bit patterns), as railyard_bench_ep makes them.");

  py::class_<PairCounts>(m, "PairCounts")
      .def_readonly("num_ranks", &PairCounts::num_ranks)
      .def_readonly("tokens", &PairCounts::tokens)
      .def_readonly("entries", &PairCounts::entries)
      .def("pair_tokens", &PairCounts::pair_tokens, py::arg("s"), py::arg("d"))
      .def("pair_entries", &PairCounts::pair_entries, py::arg("s"), py::arg("d"));
  m.def(
      "count_pairs",
      [](const Params& p, const std::vector<Routing>& routing, int64_t tokens) {
        if (static_cast<int>(routing.size()) != p.ranks) throw py::value_error("railyard._bench.count_pairs: one routing per rank expected");
        for (const auto& r : routing)
          if (r.topk_idx.size() != static_cast<std::size_t>(tokens * p.topk))
            throw py::value_error("railyard._bench.count_pairs: a routing's length is not tokens x topk");
        return count_pairs(p, routing, tokens);
      },
      py::arg("params"), py::arg("routing"), py::arg("tokens"));

  py::class_<CountedBytes>(m, "CountedBytes")
      .def_readonly("algbw", &CountedBytes::algbw)
      .def_readonly("busbw", &CountedBytes::busbw)
      .def("algbw_mean", &CountedBytes::algbw_mean)
      .def("busbw_mean", &CountedBytes::busbw_mean);
  m.def(
      "counted_bytes", [](const Params& p, const PairCounts& c, const std::string& op) { return counted_bytes(p, c, parse_op(op)); },
      py::arg("params"), py::arg("pairs"), py::arg("op"));

  py::class_<PairMatrices>(m, "PairMatrices")
      .def_readonly("written", &PairMatrices::written)
      .def_readonly("read", &PairMatrices::read);
  m.def(
      "minimum_matrices",
      [](const Params& p, const PairCounts& c, const std::string& op, bool metadata, uint64_t count_row) {
        return minimum_matrices(p, c, parse_op(op), metadata, count_row);
      },
      py::arg("params"), py::arg("pairs"), py::arg("op"), py::arg("metadata"), py::arg("count_row_bytes"));
  m.def(
      "nic_minimum",
      [](const Params& p, const PairCounts& c, const std::string& op, bool metadata, int64_t tokens) {
        return nic_minimum(p, c, parse_op(op), metadata, tokens);
      },
      py::arg("params"), py::arg("pairs"), py::arg("op"), py::arg("metadata"), py::arg("tokens"),
      "[g][q]: the bytes rank g's NIC sends to rank q at least (several domains; docs/benchmarks.md).");
  m.def("count_row_bytes", &count_row_bytes, py::arg("params"),
        "Bytes of one rank's count row (the first call's metadata), from the layout.");

  py::class_<Spread>(m, "Spread")
      .def_readonly("median", &Spread::median)
      .def_readonly("min", &Spread::min)
      .def_readonly("p10", &Spread::p10)
      .def_readonly("p90", &Spread::p90)
      .def_readonly("max", &Spread::max);
  m.def("spread_of", &spread_of, py::arg("values"));
  m.def("with_commas", &with_commas, py::arg("n"));

  py::class_<GpuModel>(m, "GpuModel")
      .def_readonly("name", &GpuModel::name)
      .def_readonly("link_gbps", &GpuModel::link_gbps)
      .def_readonly("fill_sms", &GpuModel::fill_sms)
      .def_readonly("sm_count", &GpuModel::sm_count)
      .def_readwrite("fixed_us", &GpuModel::fixed_us)
      .def_readwrite("token_latency_us", &GpuModel::token_latency_us)
      .def("per_sm_gbps", &GpuModel::per_sm_gbps);
  m.def("h100_model", &h100_model);
  m.def("b200_model", &b200_model);

  py::class_<LinkBytes>(m, "LinkBytes")
      .def_readonly("out", &LinkBytes::out)
      .def_readonly("in_", &LinkBytes::in)
      .def_readonly("issued", &LinkBytes::issued);
  m.def("link_bytes_from_pairs", &link_bytes_from_pairs, py::arg("written"), py::arg("read"));

  py::class_<ModelPoint>(m, "ModelPoint")
      .def_readonly("sms", &ModelPoint::sms)
      .def_readonly("link_us", &ModelPoint::link_us)
      .def_readonly("sm_us", &ModelPoint::sm_us)
      .def_readonly("time_us", &ModelPoint::time_us)
      .def_readonly("algbw_gbps", &ModelPoint::algbw_gbps)
      .def_readonly("busbw_gbps", &ModelPoint::busbw_gbps)
      .def_property_readonly("bound", [](const ModelPoint& p) { return std::string(p.bound); });
  m.def("model_point", &model_point, py::arg("gpu"), py::arg("bytes"), py::arg("sms"), py::arg("algbw_bytes"),
        py::arg("busbw_bytes"), py::arg("tokens") = 0);
  m.def("sms_to_fill", &sms_to_fill, py::arg("gpu"), py::arg("bytes"), py::arg("tokens") = 0);

  m.attr("SIM_TIMED_MAX_SMS") = kSimTimedMaxSms;
  m.def("sim_block_limit", &sim_block_limit, py::arg("ranks"),
        "The most blocks per kernel the simulator can run on `ranks` ranks at once (vm.max_map_count).");
  m.def("simulated_kind", &simulated_kind, py::arg("gpu"));
  m.def(
      "sim_bound",
      [](double time_us, const std::vector<std::vector<std::pair<std::string, double>>>& busy) {
        const SimBound b = sim_bound(time_us, busy);
        return py::make_tuple(b.bound, b.busiest, b.busiest_fraction);
      },
      py::arg("time_us"), py::arg("busy"));

  py::dict defs;
  defs["algbw"] = kDefAlgbw;
  defs["busbw"] = kDefBusbw;
  defs["time"] = kDefTime;
  defs["model"] = "docs/performance-model.md";
  m.attr("definitions") = defs;
}
