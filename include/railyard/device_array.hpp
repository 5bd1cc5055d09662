// Railyard public API: a 2-D row-major array in device memory, as Buffer returns its
// outputs. Host only.
//
// Either owned (allocated from the caller's runtime::Allocator and returned to it on
// destruction, so Railyard never keeps memory the caller cannot see) or borrowed (the
// caller's own memory, passed in; never freed here).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "railyard/runtime/allocator.hpp"

namespace railyard {

template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;

  // rows x cols elements from `allocator`, uninitialised. At least 16 bytes are
  // allocated, so a 0-row array still has the non-null, 16-byte aligned pointer the
  // kernels check for.
  static DeviceArray allocate(runtime::Allocator& allocator, int64_t rows, int64_t cols) {
    if (rows < 0 || cols < 0)
      throw std::invalid_argument("railyard DeviceArray: shape [" + std::to_string(rows) + ", " +
                                  std::to_string(cols) + "]; expected non-negative");
    DeviceArray a;
    const std::size_t bytes = static_cast<std::size_t>(rows * cols) * sizeof(T);
    a.storage_ = runtime::DeviceAllocation(allocator, std::max<std::size_t>(bytes, kMinBytes));
    a.data_ = static_cast<T*>(a.storage_.get());
    a.rows_ = rows;
    a.cols_ = cols;
    return a;
  }
  static DeviceArray borrow(T* data, int64_t rows, int64_t cols) {
    DeviceArray a;
    a.data_ = data;
    a.rows_ = rows;
    a.cols_ = cols;
    return a;
  }

  T* data() const { return data_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t size() const { return rows_ * cols_; }
  std::size_t bytes() const { return static_cast<std::size_t>(size()) * sizeof(T); }
  bool owned() const { return storage_.get() != nullptr; }
  bool empty() const { return data_ == nullptr; }

 private:
  static constexpr std::size_t kMinBytes = 16;
  runtime::DeviceAllocation storage_;
  T* data_ = nullptr;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
};

}  // namespace railyard
