// The simulator's range map (src/sim/range_map.hpp), against the plain model it stands
// for: a std::map with one entry per key, updated key by key.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "src/sim/range_map.hpp"

namespace railyard {
namespace {

using sim::detail::RangeMap;

// Every key of [0, limit) the range map holds, with its value, key by key.
std::map<uintptr_t, int> expand(const RangeMap<int>& m, uintptr_t limit) {
  std::map<uintptr_t, int> keys;
  uintptr_t previous_end = 0;
  m.for_each(0, limit, [&](uintptr_t first, uintptr_t last, int v) {
    EXPECT_LT(first, last);
    EXPECT_LE(previous_end, first) << "segments overlap or are out of order";
    previous_end = last;
    for (uintptr_t k = first; k < last; ++k) keys[k] = v;
  });
  return keys;
}

TEST(SimRangeMap, AgreesWithAMapPerKeyUnderRandomOperations) {
  constexpr uintptr_t kKeys = 200;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    RangeMap<int> m;
    std::map<uintptr_t, int> model;
    std::uniform_int_distribution<uintptr_t> key(0, kKeys);
    for (int step = 0; step < 400; ++step) {
      uintptr_t first = key(rng), last = key(rng);
      if (first > last) std::swap(first, last);
      const int value = static_cast<int>(rng() % 1000) + 1;
      switch (rng() % 3) {
        case 0:
          m.assign(first, last, value);
          for (uintptr_t k = first; k < last; ++k) model[k] = value;
          break;
        case 1:
          m.erase(first, last);
          for (uintptr_t k = first; k < last; ++k) model.erase(k);
          break;
        default:
          m.update(first, last, [&](int& v) { v = v * 3 + value; });
          for (uintptr_t k = first; k < last; ++k) model[k] = model[k] * 3 + value;  // absent: 0
      }
      ASSERT_EQ(expand(m, kKeys + 1), model) << "seed " << seed << " step " << step;
    }
  }
}

TEST(SimRangeMap, ForEachClipsToTheQueriedRange) {
  RangeMap<int> m;
  m.assign(10, 20, 1);
  m.assign(30, 40, 2);
  std::vector<std::vector<uintptr_t>> seen;
  m.for_each(15, 35, [&](uintptr_t first, uintptr_t last, int v) {
    seen.push_back({first, last, static_cast<uintptr_t>(v)});
  });
  EXPECT_EQ(seen, (std::vector<std::vector<uintptr_t>>{{15, 20, 1}, {30, 35, 2}}));
}

TEST(SimRangeMap, ARowWrittenWholeIsOneSegmentUntilPartlyOverwritten) {
  RangeMap<int> m;
  m.assign(0, 4096, 7);  // a 16 KiB row of 4-byte words
  EXPECT_EQ(m.segments(), 1u);
  m.update(0, 4096, [](int& v) { v += 1; });  // read whole: still one record
  EXPECT_EQ(m.segments(), 1u);
  m.assign(100, 104, 9);  // a header word inside it
  EXPECT_EQ(m.segments(), 3u);
  m.erase(0, 4096);
  EXPECT_EQ(m.segments(), 0u);
}

}  // namespace
}  // namespace railyard
