// railyard-rdma-probe's command line (probe.hpp says what it does).
#include <cstdio>
#include <string>

#include "src/probe/probe.hpp"

int main(int argc, char** argv) {
  railyard::probe::Options options;
  bool help = false;
  std::string error;
  if (!railyard::probe::parse_arguments(argc, argv, &options, &help, &error)) {
    std::fprintf(stderr, "railyard-rdma-probe: %s\n%s", error.c_str(), railyard::probe::usage());
    return railyard::probe::kUsage;
  }
  if (help) {
    std::fputs(railyard::probe::usage(), stdout);
    return railyard::probe::kOk;
  }
  return railyard::probe::run(options, stdout);
}
