// Railyard runtime: the generic bootstrap logic (size agreement), the in-process
// group and the callback bootstrap. No simulator and no CUDA here.
#include "railyard/runtime/bootstrap.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>

namespace railyard::runtime {

std::string format_ranks(const std::vector<int>& ranks) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  std::ostringstream os;
  for (std::size_t i = 0; i < sorted.size();) {
    std::size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (i > 0) os << ',';
    os << sorted[i];
    if (j > i) os << '-' << sorted[j];
    i = j + 1;
  }
  return os.str();
}

std::vector<RankFailure> gather_failures(Bootstrap& bootstrap, int32_t code, const std::string& message) {
  // A long message (a simulator report, say) is cut: every rank receives every failed
  // rank's message, padded to the longest.
  constexpr std::size_t kMaxMessageBytes = 2048;
  struct OutcomeWire {
    int32_t code = 0;  // 0: success
    uint32_t message_bytes = 0;
  };
  std::string mine = code != 0 ? message.substr(0, kMaxMessageBytes) : std::string();
  if (code != 0 && mine.empty()) mine = "unknown error";
  const std::vector<OutcomeWire> outcomes =
      allgather_value(bootstrap, OutcomeWire{code, static_cast<uint32_t>(mine.size())});

  uint32_t longest = 0;
  bool any_failed = false;
  for (const OutcomeWire& o : outcomes) {
    any_failed |= o.code != 0;
    longest = std::max(longest, o.message_bytes);
  }
  if (!any_failed) return {};
  // Every rank saw the same outcomes, so every rank takes this second round.
  std::vector<std::byte> padded(longest);
  std::memcpy(padded.data(), mine.data(), mine.size());
  const std::vector<std::byte> all = bootstrap.allgather(padded);
  std::vector<RankFailure> failures;
  for (int r = 0; r < bootstrap.size(); ++r) {
    const OutcomeWire& o = outcomes[static_cast<std::size_t>(r)];
    if (o.code == 0) continue;
    const auto* text = reinterpret_cast<const char*>(all.data()) + static_cast<std::size_t>(r) * longest;
    failures.push_back({r, o.code, std::string(text, o.message_bytes)});
  }
  return failures;
}

void Bootstrap::barrier_by_allgather() {
  const std::byte token{1};
  std::vector<std::byte> all(static_cast<std::size_t>(size()));
  allgather_same_size(std::span<const std::byte>(&token, 1), all);
}

std::vector<std::byte> Bootstrap::allgather(std::span<const std::byte> mine) {
  const int n = size();
  // Round 1: the byte counts, a fixed 8 bytes per rank, so it cannot itself mismatch.
  const uint64_t my_bytes = mine.size();
  std::vector<uint64_t> counts(static_cast<std::size_t>(n));
  allgather_same_size(std::as_bytes(std::span<const uint64_t, 1>(&my_bytes, 1)),
                      std::as_writable_bytes(std::span<uint64_t>(counts)));
  // Every rank sees the same counts, so every rank takes the same branch here.
  if (std::any_of(counts.begin(), counts.end(), [&](uint64_t c) { return c != counts[0]; })) {
    std::map<uint64_t, std::vector<int>> ranks_by_count;
    for (int r = 0; r < n; ++r) ranks_by_count[counts[static_cast<std::size_t>(r)]].push_back(r);
    std::ostringstream os;
    os << "railyard bootstrap: allgather byte counts differ between ranks (every rank must pass the same number "
          "of bytes):";
    for (const auto& [count, ranks] : ranks_by_count)
      os << ' ' << count << " bytes on rank" << (ranks.size() > 1 ? "s " : " ") << format_ranks(ranks) << ';';
    os << " seen by rank " << rank();
    throw BootstrapError(os.str());
  }
  std::vector<std::byte> all(mine.size() * static_cast<std::size_t>(n));
  allgather_same_size(mine, all);
  return all;
}

// ---- in-process ---------------------------------------------------------------------

class InProcessBootstrap final : public Bootstrap {
 public:
  InProcessBootstrap(std::shared_ptr<InProcessGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->num_ranks(); }
  void barrier() override { group_->exchange(rank_, {}, "barrier"); }

 protected:
  void allgather_same_size(std::span<const std::byte> mine, std::span<std::byte> all) override {
    const auto parts = group_->exchange(rank_, mine, "allgather");
    for (std::size_t r = 0; r < parts.size(); ++r) {
      if (parts[r].size() != mine.size())  // Bootstrap::allgather rules this out
        throw BootstrapError("railyard in-process bootstrap: rank " + std::to_string(r) + " deposited " +
                             std::to_string(parts[r].size()) + " bytes, rank " + std::to_string(rank_) +
                             " expected " + std::to_string(mine.size()));
      if (!mine.empty()) std::memcpy(all.data() + r * mine.size(), parts[r].data(), mine.size());
    }
  }

 private:
  std::shared_ptr<InProcessGroup> group_;
  int rank_;
};

namespace {
class ConditionVariableWaiting final : public InProcessGroup::Waiting {
 public:
  bool wait_until(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point deadline,
                  const std::function<bool()>& ready) override {
    return cv_.wait_until(lock, deadline, ready);
  }
  void notify_all() override { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};
}  // namespace

std::shared_ptr<InProcessGroup> InProcessGroup::create(Options options) {
  if (options.num_ranks < 1)
    throw std::invalid_argument("railyard InProcessGroup: num_ranks is " + std::to_string(options.num_ranks) +
                                "; expected >= 1");
  if (!options.waiting) options.waiting = std::make_unique<ConditionVariableWaiting>();
  return std::shared_ptr<InProcessGroup>(new InProcessGroup(std::move(options)));
}

InProcessGroup::InProcessGroup(Options options)
    : options_(std::move(options)),
      slots_(static_cast<std::size_t>(options_.num_ranks)),
      arrived_(static_cast<std::size_t>(options_.num_ranks), false) {}

std::unique_ptr<Bootstrap> InProcessGroup::bootstrap(int rank) {
  if (rank < 0 || rank >= options_.num_ranks)
    throw std::invalid_argument("railyard InProcessGroup: rank " + std::to_string(rank) + " is outside 0.." +
                                std::to_string(options_.num_ranks - 1));
  return std::make_unique<InProcessBootstrap>(shared_from_this(), rank);
}

std::string InProcessGroup::missing_ranks() const {
  std::vector<int> missing;
  for (int r = 0; r < options_.num_ranks; ++r)
    if (!arrived_[static_cast<std::size_t>(r)]) missing.push_back(r);
  return format_ranks(missing);
}

void InProcessGroup::wait_until(int rank, const std::function<bool()>& ready, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  std::unique_lock lock(mutex_);
  const bool timed_out = !options_.waiting->wait_until(lock, deadline, [&] { return ready() || !broken_.empty(); });
  if (!broken_.empty()) throw BootstrapError(broken_);
  if (timed_out && !ready()) {
    broken_ = "railyard in-process bootstrap: rank " + std::to_string(rank) + " waited " +
              std::to_string(options_.timeout.count()) + " ms in " + what + " round " + std::to_string(round_) +
              " for rank(s) " + missing_ranks() + ", which never arrived; the group is unusable";
    options_.waiting->notify_all();
    throw BootstrapError(broken_);
  }
}

std::vector<std::vector<std::byte>> InProcessGroup::exchange(int rank, std::span<const std::byte> mine,
                                                             const char* what) {
  // A rank may come back for the next round while others still copy out this one.
  wait_until(rank, [&] { return !round_complete_; }, what);
  {
    std::lock_guard lock(mutex_);
    slots_[static_cast<std::size_t>(rank)].assign(mine.begin(), mine.end());
    arrived_[static_cast<std::size_t>(rank)] = true;
    if (++num_arrived_ == options_.num_ranks) {
      round_complete_ = true;
      options_.waiting->notify_all();
    }
  }
  wait_until(rank, [&] { return round_complete_; }, what);
  std::lock_guard lock(mutex_);
  std::vector<std::vector<std::byte>> all = slots_;
  if (++num_departed_ == options_.num_ranks) {
    num_arrived_ = 0;
    num_departed_ = 0;
    round_complete_ = false;
    std::fill(arrived_.begin(), arrived_.end(), false);
    ++round_;
    options_.waiting->notify_all();
  }
  return all;
}

void InProcessGroup::abort(int rank, const std::string& why, const std::string& who) {
  std::lock_guard lock(mutex_);
  if (broken_.empty()) broken_ = who + " rank " + std::to_string(rank) + " failed: " + why;
  options_.waiting->notify_all();
}

// ---- callback -----------------------------------------------------------------------

CallbackBootstrap::CallbackBootstrap(Options options) : options_(std::move(options)) {
  if (options_.size < 1 || options_.rank < 0 || options_.rank >= options_.size)
    throw std::invalid_argument("railyard CallbackBootstrap: rank " + std::to_string(options_.rank) + " of size " +
                                std::to_string(options_.size) + "; expected 0 <= rank < size");
  if (!options_.callbacks.allgather)
    throw std::invalid_argument("railyard CallbackBootstrap: the allgather callback is empty");
  if (!options_.callbacks.barrier)
    throw std::invalid_argument("railyard CallbackBootstrap: the barrier callback is empty");
}

void CallbackBootstrap::barrier() { options_.callbacks.barrier(); }

void CallbackBootstrap::allgather_same_size(std::span<const std::byte> mine, std::span<std::byte> all) {
  options_.callbacks.allgather(mine, all);
}

}  // namespace railyard::runtime
