// Railyard simulator: one mutant of the kernels' ordering (mutation.hpp).
#include "mutation.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>
#include <tuple>

#include "engine.hpp"

namespace railyard::sim::detail::mutation {
namespace {

constexpr const char* kKindNames[] = {"release",        "acquire",       "fence",    "proxy_fence", "bulk_wait",
                                      "bulk_wait_read", "mbarrier_wait", "bar_sync", "syncwarp"};

struct Mutant {
  std::string file;
  unsigned line = 0;
  SiteKind kind = SiteKind::Release;
};

// RAILYARD_SIM_MUTANT, parsed; a malformed value ends the process with the reason
// (a mutation run must not silently test the unmutated kernels).
bool parse_mutant(const char* spec, Mutant& mutant) {
  if (!spec || !*spec) return false;
  const std::string s = spec;
  const auto kind_colon = s.rfind(':');
  const auto line_colon = kind_colon == std::string::npos || kind_colon == 0 ? std::string::npos
                                                                              : s.rfind(':', kind_colon - 1);
  bool ok = line_colon != std::string::npos && line_colon > 0;
  if (ok) {
    mutant.file = s.substr(0, line_colon);
    char* end = nullptr;
    const unsigned long line = std::strtoul(s.c_str() + line_colon + 1, &end, 10);
    mutant.line = static_cast<unsigned>(line);
    ok = end == s.c_str() + kind_colon && line > 0;
    const std::string kind = s.substr(kind_colon + 1);
    bool known = false;
    for (std::size_t k = 0; k < std::size(kKindNames); ++k)
      if (kind == kKindNames[k]) mutant.kind = static_cast<SiteKind>(k), known = true;
    ok = ok && known;
  }
  if (!ok) {
    std::fprintf(stderr,
                 "railyard simulator: RAILYARD_SIM_MUTANT is '%s'; expected <file>:<line>:<kind> with kind one of "
                 "release, acquire, fence, proxy_fence, bulk_wait, bulk_wait_read, mbarrier_wait, bar_sync, syncwarp\n",
                 spec);
    std::exit(2);
  }
  return true;
}

struct State {
  bool has_mutant = false;
  Mutant mutant;
  const char* sites_path = nullptr;
  // Sites seen, by the address of their file name (stable per translation unit):
  // the hooks run on the engine thread only.
  std::set<std::tuple<const char*, unsigned, SiteKind>> seen;

  State() {
    has_mutant = parse_mutant(std::getenv("RAILYARD_SIM_MUTANT"), mutant);
    const char* path = std::getenv("RAILYARD_SIM_SITES");
    if (path && *path) sites_path = path;
  }
  ~State() {
    if (!sites_path || seen.empty()) return;
    std::set<std::string> lines;
    for (const auto& [file, line, kind] : seen)
      lines.insert(project_file(file) + ":" + std::to_string(line) + ":" + kKindNames[static_cast<int>(kind)]);
    if (std::FILE* f = std::fopen(sites_path, "a")) {
      for (const std::string& l : lines) std::fprintf(f, "%s\n", l.c_str());
      std::fclose(f);
    }
  }
};

State& state() {
  static State s;
  return s;
}
const bool g_active = state().has_mutant || state().sites_path != nullptr;

}  // namespace

const char* kind_name(SiteKind kind) { return kKindNames[static_cast<int>(kind)]; }

bool mutated(SiteKind kind, const std::source_location& loc) {
  if (!g_active) return false;
  State& s = state();
  if (s.sites_path) s.seen.emplace(loc.file_name(), loc.line(), kind);
  return s.has_mutant && s.mutant.kind == kind && s.mutant.line == loc.line() &&
         project_file(loc.file_name()) == s.mutant.file;
}

}  // namespace railyard::sim::detail::mutation
