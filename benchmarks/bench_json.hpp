// railyard_bench_ep: a minimal JSON writer (objects, arrays, strings, numbers,
// booleans), enough for the results file. Keys are written in call order.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace railyard::bench {

class Json {
 public:
  Json& begin_object(const char* key = nullptr) { return open(key, '{'); }
  Json& end_object() { return close('}'); }
  Json& begin_array(const char* key = nullptr) { return open(key, '['); }
  Json& end_array() { return close(']'); }
  Json& str(const char* key, const std::string& v) { return raw(key, quote(v)); }
  Json& num(const char* key, double v) {
    if (!std::isfinite(v)) return raw(key, "null");
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    return raw(key, buf);
  }
  Json& integer(const char* key, int64_t v) { return raw(key, std::to_string(v)); }
  Json& uinteger(const char* key, uint64_t v) { return raw(key, std::to_string(v)); }
  Json& boolean(const char* key, bool v) { return raw(key, v ? "true" : "false"); }
  Json& uint_array(const char* key, const std::vector<uint64_t>& v) {
    begin_array(key);
    for (uint64_t x : v) uinteger(nullptr, x);
    return end_array();
  }
  const std::string& text() const { return out_; }

 private:
  static std::string quote(const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') q += '\\', q += c;
      else if (c == '\n') q += "\\n";
      else if (static_cast<unsigned char>(c) < 0x20) q += ' ';
      else q += c;
    }
    return q + "\"";
  }
  void separator(const char* key) {
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
      out_ += '\n' + std::string(2 * first_.size(), ' ');
    }
    if (key) out_ += quote(key) + ": ";
  }
  Json& raw(const char* key, const std::string& v) {
    separator(key);
    out_ += v;
    return *this;
  }
  Json& open(const char* key, char c) {
    separator(key);
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  Json& close(char c) {
    first_.pop_back();
    out_ += '\n' + std::string(2 * first_.size(), ' ') + c;
    return *this;
  }
  std::string out_;
  std::vector<bool> first_;
};

}  // namespace railyard::bench
