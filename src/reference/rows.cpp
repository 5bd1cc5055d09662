// Token rows: building BF16 and FP8 test rows, and copying rows between layouts.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "internal.hpp"

namespace railyard::reference {

using detail::fail;

HiddenRows bf16_rows(std::span<const bf16> values) {
  HiddenRows rows;
  rows.dtype = DType::BF16;
  rows.bytes.resize(values.size() * sizeof(bf16));
  // memcpy's pointers must be valid even for 0 bytes; an empty span's data() may be null.
  if (!values.empty()) std::memcpy(rows.bytes.data(), values.data(), rows.bytes.size());
  return rows;
}

std::vector<bf16> rows_as_bf16(const HiddenRows& rows, int64_t num_rows, int64_t hidden) {
  const auto elems = static_cast<size_t>(num_rows * hidden);
  std::vector<bf16> y(elems);
  if (rows.bytes.size() < elems * dtype_bytes(rows.dtype)) {
    fail("rows_as_bf16: rows hold ", rows.bytes.size(), " bytes; expected at least ", elems * dtype_bytes(rows.dtype),
         " (", num_rows, " rows of ", hidden, ")");
  }
  if (rows.dtype == DType::BF16) {
    if (!y.empty()) std::memcpy(y.data(), rows.bytes.data(), elems * sizeof(bf16));
    return y;
  }
  const int64_t blocks = hidden / kFp8ScaleBlockElems;
  for (int64_t r = 0; r < num_rows; ++r)
    for (int64_t h = 0; h < hidden; ++h)
      y[r * hidden + h] = float_to_bf16(e4m3_to_float(fp8_e4m3{rows.bytes[r * hidden + h]}) *
                                        rows.scales[r * blocks + h / kFp8ScaleBlockElems]);
  return y;
}

HiddenRows quantize_fp8_rows(std::span<const float> values, int hidden) {
  if (hidden <= 0 || hidden % kFp8ScaleBlockElems != 0) {
    fail("quantize_fp8_rows: hidden = ", hidden, ": expected a positive multiple of ",
         kFp8ScaleBlockElems);
  }
  if (values.size() % static_cast<size_t>(hidden) != 0) {
    fail("quantize_fp8_rows: values.size() = ", values.size(),
         ": expected a multiple of hidden = ", hidden);
  }
  HiddenRows rows;
  rows.dtype = DType::FP8_E4M3;
  rows.bytes.resize(values.size());
  rows.scales.resize(values.size() / kFp8ScaleBlockElems);
  for (size_t block = 0; block < rows.scales.size(); ++block) {
    const size_t begin = block * kFp8ScaleBlockElems;
    float amax = 0.0f;
    for (size_t i = begin; i < begin + kFp8ScaleBlockElems; ++i) {
      if (!std::isfinite(values[i])) fail("quantize_fp8_rows: values[", i, "] is not finite");
      amax = std::max(amax, std::fabs(values[i]));
    }
    // An all-zero block would give scale 0 and 0/0 codes; scale 1 codes it as zeros.
    const float scale = amax == 0.0f ? 1.0f : amax / kFp8E4m3Max;
    rows.scales[block] = scale;
    for (size_t i = begin; i < begin + kFp8ScaleBlockElems; ++i) {
      rows.bytes[i] = float_to_e4m3(values[i] / scale).bits;
    }
  }
  return rows;
}

HiddenRows quantize_fp8_rows(std::span<const bf16> values, int hidden) {
  std::vector<float> widened(values.size());
  std::transform(values.begin(), values.end(), widened.begin(), bf16_to_float);
  return quantize_fp8_rows(std::span<const float>(widened), hidden);
}

namespace detail {

int64_t row_bytes(const World& world, DType dtype) {
  return static_cast<int64_t>(world.hidden) * dtype_bytes(dtype);
}

int64_t scales_per_row(const World& world, DType dtype) {
  return dtype == DType::FP8_E4M3 ? world.hidden / kFp8ScaleBlockElems : 0;
}

void append_row(const World& world, const HiddenRows& from, int64_t row, HiddenRows& to) {
  const int64_t bytes = row_bytes(world, from.dtype);
  const auto byte_begin = from.bytes.begin() + row * bytes;
  to.bytes.insert(to.bytes.end(), byte_begin, byte_begin + bytes);
  const int64_t scales = scales_per_row(world, from.dtype);
  const auto scale_begin = from.scales.begin() + row * scales;
  to.scales.insert(to.scales.end(), scale_begin, scale_begin + scales);
}

void append_zero_row(const World& world, HiddenRows& to) {
  to.bytes.resize(to.bytes.size() + row_bytes(world, to.dtype), 0);
  to.scales.resize(to.scales.size() + scales_per_row(world, to.dtype), 0.0f);
}

}  // namespace detail
}  // namespace railyard::reference
