// Railyard simulator internals: a map from ranges of integer keys to values, stored as
// disjoint segments. Not a public header.
//
// The weak-memory mode keeps a record per 4-byte word of global memory; a 16 KiB row
// landed by one bulk copy is 4096 words with one record, so it is stored as one
// segment, and a later access of part of it splits the segment. Every operation
// behaves as if each key in its range were updated on its own (tests/sim/
// range_map_test.cpp checks that against a map per key).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <utility>

namespace railyard::sim::detail {

template <class V>
class RangeMap {
 public:
  // fn(first, last, value) for each stored segment that overlaps [first, last), in
  // ascending order, clipped to [first, last).
  template <class Fn>
  void for_each(uintptr_t first, uintptr_t last, Fn&& fn) const {
    if (first >= last) return;
    auto it = segments_.upper_bound(first);
    if (it != segments_.begin() && std::prev(it)->second.end > first) --it;
    for (; it != segments_.end() && it->first < last; ++it)
      fn(std::max(it->first, first), std::min(it->second.end, last), it->second.value);
  }

  // Every key of [first, last) maps to `value`.
  void assign(uintptr_t first, uintptr_t last, const V& value) {
    if (first >= last) return;
    erase(first, last);
    segments_.emplace(first, Segment{last, value});
  }

  // No key of [first, last) maps to anything.
  void erase(uintptr_t first, uintptr_t last) {
    if (first >= last) return;
    split(first);
    split(last);
    segments_.erase(segments_.lower_bound(first), segments_.lower_bound(last));
  }

  // fn(value&) for every key of [first, last), a key with no value getting V{} first:
  // segments are split at the edges and gaps filled, then fn runs once per segment.
  template <class Fn>
  void update(uintptr_t first, uintptr_t last, Fn&& fn) {
    if (first >= last) return;
    split(first);
    split(last);
    uintptr_t at = first;
    auto it = segments_.lower_bound(first);
    while (at < last) {
      if (it == segments_.end() || it->first > at) {  // a gap [at, next start or last)
        const uintptr_t gap_end = it == segments_.end() ? last : std::min(it->first, last);
        it = segments_.emplace_hint(it, at, Segment{gap_end, V{}});
      }
      fn(it->second.value);
      at = it->second.end;
      ++it;
    }
  }

  void clear() { segments_.clear(); }
  std::size_t segments() const { return segments_.size(); }

 private:
  struct Segment {
    uintptr_t end = 0;
    V value{};
  };

  // The segment holding `at` strictly inside becomes two: [start, at) and [at, end).
  void split(uintptr_t at) {
    auto it = segments_.upper_bound(at);
    if (it == segments_.begin()) return;
    --it;
    if (it->first == at || it->second.end <= at) return;
    const Segment tail{it->second.end, it->second.value};
    it->second.end = at;
    segments_.emplace_hint(std::next(it), at, tail);
  }

  std::map<uintptr_t, Segment> segments_;  // by first key; disjoint
};

}  // namespace railyard::sim::detail
