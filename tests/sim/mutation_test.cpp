// The simulator's run-time mutants (src/sim/mutation.hpp), which scripts/mutation.py
// drives: a site named in RAILYARD_SIM_MUTANT is weakened, every other call is not, and
// RAILYARD_SIM_SITES lists the sites a process executed. The variables are read once
// per process, so each case runs this binary again as a child with its environment.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "railyard/sim/device.hpp"
#include "railyard/sim/sim.hpp"

namespace sim = railyard::sim;
namespace dev = railyard::sim::device;

namespace {

// The one site of the child kernel: an mbarrier wait whose phase never completes
// (two arrivals expected, one made). Unmutated it is a hang; with its wait deleted the
// kernel finishes.
constexpr unsigned kWaitLine = __LINE__ + 10;  // the line of the try_wait below
constexpr const char* kFile = "tests/sim/mutation_test.cpp";

int run_child_kernel() {
  sim::reset({.seed = 1});
  sim::add_device(sim::h100_props());
  sim::launch(sim::default_stream(0), {1, 1, 64, "wait_forever"}, [] {
    auto* bar = reinterpret_cast<uint64_t*>(dev::dynamic_smem());
    dev::mbarrier_init(bar, 2, std::source_location::current());
    dev::mbarrier_arrive(bar, 1, 0, std::source_location::current());
    while (!dev::mbarrier_try_wait_parity(bar, 0, std::source_location::current())) {
    }
  });
  try {
    sim::stream_synchronize(sim::default_stream(0));
    return 0;
  } catch (const sim::Error& e) {
    return e.kind() == sim::ErrorKind::Hang ? 3 : 4;
  }
}

// Runs this binary as the child (the kernel alone) with `env` added; its exit status.
int child_status(const std::string& env_name, const std::string& env_value) {
  const pid_t pid = fork();
  if (pid == 0) {
    setenv(env_name.c_str(), env_value.c_str(), 1);
    setenv("RAILYARD_MUTATION_TEST_CHILD", "1", 1);
    execl("/proc/self/exe", "mutation_test", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string site(unsigned line, const char* kind) { return std::string(kFile) + ":" + std::to_string(line) + ":" + kind; }

TEST(MutationSwitch, TheNamedSiteIsWeakenedAndNoOther) {
  EXPECT_EQ(child_status("RAILYARD_SIM_MUTANT", site(kWaitLine, "mbarrier_wait")), 0) << "the wait was deleted";
  EXPECT_EQ(child_status("RAILYARD_SIM_MUTANT", site(kWaitLine + 1, "mbarrier_wait")), 3) << "another line: a hang";
  EXPECT_EQ(child_status("RAILYARD_SIM_MUTANT", site(kWaitLine, "bar_sync")), 3) << "another kind: a hang";
  EXPECT_EQ(child_status("RAILYARD_SIM_MUTANT", std::string("elsewhere.cuh:") + std::to_string(kWaitLine) +
                                                    ":mbarrier_wait"),
            3)
      << "another file: a hang";
}

TEST(MutationSwitch, AMalformedMutantEndsTheProcessSayingWhy) {
  EXPECT_EQ(child_status("RAILYARD_SIM_MUTANT", site(kWaitLine, "weaken")), 2);
  EXPECT_EQ(child_status("RAILYARD_SIM_MUTANT", "no-line-here"), 2);
}

TEST(MutationSwitch, ExecutedSitesAreRecorded) {
  char path[] = "/tmp/railyard_sites_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_EQ(child_status("RAILYARD_SIM_SITES", path), 3);  // recording changes nothing
  std::ifstream in(path);
  std::stringstream lines;
  lines << in.rdbuf();
  std::remove(path);
  EXPECT_NE(lines.str().find(site(kWaitLine, "mbarrier_wait") + "\n"), std::string::npos) << lines.str();
}

}  // namespace

// The child runs the kernel and exits with its outcome; the parent runs the tests.
int main(int argc, char** argv) {
  if (std::getenv("RAILYARD_MUTATION_TEST_CHILD")) return run_child_kernel();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
