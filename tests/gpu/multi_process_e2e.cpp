// multi_process_e2e: R ranks on ONE device through the public C++ API, every output
// compared bit for bit with railyard::reference (e2e/e2e_check.hpp). Plain C++, no
// GoogleTest, built in both flavours:
//   multi_process_e2e_cuda  R processes on GPU 0 (scripts/gpu-smoke.sh runs it)
//   multi_process_e2e_sim   R threads on one simulated GPU (ctest, label sim)
//
//   multi_process_e2e_cuda --ranks 4 --calls 1000 --long-calls 5000
//
// Exit code 0: every case passed; 1: a mismatch or an error; 77: no device (skipped).
// --bootstrap-selftest checks the process bootstrap alone (no device, either flavour).
// --inject-mismatch flips one bit of one expected output: the check must report it.
// --timeout-s: the longest a rank waits for the others in a bootstrap round; a case's
// calls all lie between two rounds (Buffer creation and the results' allgather).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>

#include "e2e/e2e_check.hpp"
#include "e2e/e2e_ranks.hpp"
#include "e2e/process_group.hpp"

namespace {

using railyard::e2e::Options;

struct Cli {
  Options options;
  int timeout_s = 600;
  bool bootstrap_selftest = false;
};

void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--ranks R] [--calls N] [--long-calls N] [--hidden H] [--tokens T]\n"
               "          [--many-sources-hidden H] [--sms S] [--seed S] [--cases bf16,fp8,many_sources,long_run,wrap_2_31]\n"
               "          [--timeout-s S] [--bootstrap-selftest] [--inject-mismatch]\n",
               argv0);
}

// Parses the command line; exits with 2 and the usage on a bad one.
Cli parse(int argc, char** argv) {
  Cli cli;
  Options& o = cli.options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bootstrap-selftest" || a == "--inject-mismatch") {
      (a == "--inject-mismatch" ? o.inject_mismatch : cli.bootstrap_selftest) = true;
      continue;
    }
    if (i + 1 >= argc) usage(argv[0]), std::exit(2);
    const std::string v = argv[++i];
    if (a == "--ranks") o.ranks = std::stoi(v);
    else if (a == "--calls") o.calls = std::stoi(v);
    else if (a == "--long-calls") o.long_calls = std::stoi(v);
    else if (a == "--hidden") o.hidden = std::stoll(v);
    else if (a == "--tokens") o.tokens = std::stoll(v);
    else if (a == "--many-sources-hidden") o.many_sources_hidden = std::stoll(v);
    else if (a == "--sms") o.sms = std::stoi(v);
    else if (a == "--seed") o.seed = std::stoull(v);
    else if (a == "--timeout-s") cli.timeout_s = std::stoi(v);
    else if (a == "--cases") {
      o.cases.clear();
      std::stringstream ss(v);
      for (std::string name; std::getline(ss, name, ',');) o.cases.push_back(name);
    } else {
      usage(argv[0]), std::exit(2);
    }
  }
  return cli;
}

// The process bootstrap alone: allgathers of every size, barriers, and a rank that
// leaves early, which must make the others fail promptly instead of hanging.
int bootstrap_selftest(int ranks, std::chrono::milliseconds timeout) {
  auto exits = railyard::e2e::run_processes(ranks, timeout, [&](int rank, railyard::runtime::Bootstrap& b) {
    for (int round = 0; round < 20; ++round) {
      const auto all = railyard::runtime::allgather_value(b, static_cast<int64_t>(rank * 1000 + round));
      for (int r = 0; r < ranks; ++r)
        if (all[r] != r * 1000 + round) return 1;
      b.barrier();
    }
    return 0;
  });
  int bad = 0;
  for (const auto& e : exits) bad += e.exit_code != 0;
  exits = railyard::e2e::run_processes(ranks, timeout, [&](int rank, railyard::runtime::Bootstrap& b) {
    if (rank == ranks - 1) return 0;  // leaves before the round
    try {
      b.barrier();
    } catch (const railyard::runtime::BootstrapError&) {
      return 0;  // the expected outcome
    }
    return 1;
  });
  for (const auto& e : exits) bad += e.exit_code != 0;
  std::printf("multi_process_e2e: bootstrap self-test with %d processes: %s\n", ranks, bad ? "FAILED" : "PASSED");
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Cli cli = parse(argc, argv);
  const std::chrono::milliseconds timeout = std::chrono::seconds(cli.timeout_s);
  try {
    if (cli.bootstrap_selftest) return bootstrap_selftest(cli.options.ranks, timeout);
    const auto cases = railyard::e2e::make_cases(cli.options);
    std::printf("multi_process_e2e: %s: %d ranks on one device, %d calls per case, %d in the long run\n",
                railyard::e2e::kRanksFlavour, cli.options.ranks, cli.options.calls, cli.options.long_calls);
    std::fflush(stdout);
    const int code = railyard::e2e::run_ranks_on_one_device(
        cli.options.ranks, timeout, cli.options.seed,
        [&](int, railyard::runtime::Bootstrap& bootstrap, railyard::GpuStream stream) {
          return railyard::e2e::run_all(cases, bootstrap, stream);
        });
    std::printf("multi_process_e2e: %s\n", code == 0 ? "PASSED" : code == railyard::e2e::kSkipped ? "SKIPPED" : "FAILED");
    return code;
  } catch (const std::exception& e) {
    std::printf("multi_process_e2e: FAILED: %s\n", e.what());
    return 1;
  }
}
