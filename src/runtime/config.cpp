// Railyard runtime: BufferConfig validation and cross-rank agreement.
#include "railyard/runtime/config.hpp"

#include <cstring>
#include <map>
#include <sstream>

#include "railyard/runtime/bootstrap.hpp"

namespace railyard::runtime {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::BF16: return "BF16";
    case DType::FP8_E4M3: return "FP8_E4M3";
    case DType::FP32: return "FP32";
  }
  return "unknown";
}

std::vector<ConfigField> config_fields(const BufferConfig& c) {
  return {
      {"hidden", c.hidden},
      {"max_tokens_per_rank", c.max_tokens_per_rank},
      {"num_ranks", c.num_ranks},
      {"num_experts", c.num_experts},
      {"experts_per_rank", c.experts_per_rank},
      {"ranks_per_domain", c.ranks_per_domain},
      {"dispatch_dtype", static_cast<int64_t>(c.dispatch_dtype)},
      {"combine_dtype", static_cast<int64_t>(c.combine_dtype)},
      {"max_top_k", c.max_top_k},
      {"layout_version", c.layout_version},
  };
}

namespace {

bool is_dtype_field(const char* name) {
  return std::strcmp(name, "dispatch_dtype") == 0 || std::strcmp(name, "combine_dtype") == 0;
}

std::string format_value(const char* field, int64_t value) {
  return is_dtype_field(field) ? dtype_name(static_cast<DType>(value)) : std::to_string(value);
}

// Elements per row that make `dtype` rows whole multiples of kRowAlignBytes.
int64_t row_elem_multiple(DType dtype) { return kRowAlignBytes / dtype_bytes(dtype); }

}  // namespace

Status BufferConfig::validate() const {
  std::vector<std::string> problems;
  auto bad = [&](const std::string& text) { problems.push_back(text); };

  if (hidden <= 0) bad("hidden = " + std::to_string(hidden) + "; expected > 0");
  if (max_tokens_per_rank <= 0)
    bad("max_tokens_per_rank = " + std::to_string(max_tokens_per_rank) + "; expected > 0");
  if (num_ranks <= 0) bad("num_ranks = " + std::to_string(num_ranks) + "; expected > 0");
  if (num_experts <= 0) bad("num_experts = " + std::to_string(num_experts) + "; expected > 0");
  if (ranks_per_domain <= 0) bad("ranks_per_domain = " + std::to_string(ranks_per_domain) + "; expected > 0");

  if (dispatch_dtype != DType::BF16 && dispatch_dtype != DType::FP8_E4M3)
    bad(std::string("dispatch_dtype = ") + dtype_name(dispatch_dtype) + "; expected BF16 or FP8_E4M3");
  if (combine_dtype != DType::BF16)
    bad(std::string("combine_dtype = ") + dtype_name(combine_dtype) + "; expected BF16");

  if (hidden > 0) {
    for (DType dtype : {dispatch_dtype, combine_dtype}) {
      const int64_t multiple = row_elem_multiple(dtype);
      if (hidden % multiple != 0)
        bad("hidden = " + std::to_string(hidden) + ": a " + dtype_name(dtype) + " row is " +
            std::to_string(hidden * dtype_bytes(dtype)) + " bytes, not a multiple of " +
            std::to_string(kRowAlignBytes) + "; expected hidden a multiple of " + std::to_string(multiple));
    }
    if (dispatch_dtype == DType::FP8_E4M3 && hidden % kFp8ScaleBlockElems != 0)
      bad("hidden = " + std::to_string(hidden) + " with FP8_E4M3 dispatch: one scale covers " +
          std::to_string(kFp8ScaleBlockElems) + " elements; expected hidden a multiple of " +
          std::to_string(kFp8ScaleBlockElems));
  }
  if (num_ranks > 0 && num_experts > 0) {
    if (num_experts % num_ranks != 0)
      bad("num_experts = " + std::to_string(num_experts) + " is not divisible by num_ranks = " +
          std::to_string(num_ranks) + "; expected a multiple of " + std::to_string(num_ranks));
    else if (experts_per_rank != num_experts / num_ranks)
      bad("experts_per_rank = " + std::to_string(experts_per_rank) + "; expected num_experts / num_ranks = " +
          std::to_string(num_experts / num_ranks));
  }
  if (num_ranks > 0 && ranks_per_domain > 0 && num_ranks % ranks_per_domain != 0)
    bad("num_ranks = " + std::to_string(num_ranks) + " is not a multiple of ranks_per_domain = " +
        std::to_string(ranks_per_domain) + "; expected NVLink domains of equal size");
  if (max_top_k <= 0 || (num_experts > 0 && max_top_k > num_experts))
    bad("max_top_k = " + std::to_string(max_top_k) + "; expected 1.." +
        (num_experts > 0 ? std::to_string(num_experts) + " (num_experts)" : std::string("num_experts")));
  if (layout_version != kBufferLayoutVersion)
    bad("layout_version = " + std::to_string(layout_version) + "; expected " + std::to_string(kBufferLayoutVersion) +
        " (this build's buffer layout)");

  if (problems.empty()) return Status::success();
  std::string message = "railyard BufferConfig: ";
  for (std::size_t i = 0; i < problems.size(); ++i) message += (i ? "; " : "") + problems[i];
  return Status::invalid_argument(message);
}

void BufferConfig::check_agreement(Bootstrap& bootstrap) const {
  const std::vector<ConfigField> mine = config_fields(*this);
  std::vector<int64_t> values;
  values.reserve(mine.size());
  for (const ConfigField& f : mine) values.push_back(f.value);
  const std::vector<std::byte> bytes = bootstrap.allgather(std::as_bytes(std::span<const int64_t>(values)));

  const int n = bootstrap.size();
  const std::size_t num_fields = values.size();
  auto value_of = [&](int rank, std::size_t field) {
    int64_t v;
    std::memcpy(&v, bytes.data() + (static_cast<std::size_t>(rank) * num_fields + field) * sizeof(int64_t), sizeof(v));
    return v;
  };
  std::vector<std::string> mismatches;
  for (std::size_t f = 0; f < num_fields; ++f) {
    std::map<int64_t, std::vector<int>> ranks_by_value;
    for (int r = 0; r < n; ++r) ranks_by_value[value_of(r, f)].push_back(r);
    if (ranks_by_value.size() == 1) continue;
    std::ostringstream os;
    os << mine[f].name << " differs:";
    for (const auto& [value, ranks] : ranks_by_value)
      os << ' ' << format_value(mine[f].name, value) << " on rank" << (ranks.size() > 1 ? "s " : " ")
         << format_ranks(ranks) << ';';
    mismatches.push_back(os.str());
  }
  if (!mismatches.empty()) {
    std::string message = "railyard BufferConfig: ranks disagree: ";
    for (std::size_t i = 0; i < mismatches.size(); ++i) message += (i ? " " : "") + mismatches[i];
    message += " (seen by rank " + std::to_string(bootstrap.rank()) + ")";
    throw ConfigMismatchError(message);
  }
  if (num_ranks != n)
    throw std::invalid_argument("railyard BufferConfig: num_ranks = " + std::to_string(num_ranks) +
                                " but the bootstrap group has " + std::to_string(n) + " ranks");
  if (const Status status = validate(); !status.ok()) throw std::invalid_argument(status.message());
}

}  // namespace railyard::runtime
