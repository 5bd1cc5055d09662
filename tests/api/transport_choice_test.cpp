// Transport::Auto's rule and the reasons a requested transport is refused
// (src/api/transport_choice.hpp), for every kind of rank: one whose NIC the GPU drives,
// one whose NIC it cannot drive, one without a NIC, each with or without GIN. The
// buffer-level tests (BufferAcrossDomains.*) show the choice agreed across ranks.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "src/api/transport_choice.hpp"

namespace railyard::detail {
namespace {

std::string refusal(Transport requested, const TransportCandidates& c) {
  try {
    return std::string("chose ") + to_string(choose_transport(requested, c));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

TEST(TransportChoice, AutoPrefersTheMlx5LaneThenGin) {
  runtime::rdma::NicAttributes driven, other;
  driven.gpu_initiated = true;
  const TransportCandidates both{.nic = &driven, .gin = true};
  const TransportCandidates gin_only{.nic = &other, .gin = true};
  const TransportCandidates no_nic_gin{.nic_problem = "no NIC here", .gin = true};
  EXPECT_EQ(choose_transport(Transport::Auto, both), Transport::Mlx5);
  EXPECT_EQ(choose_transport(Transport::Auto, gin_only), Transport::Gin);
  EXPECT_EQ(choose_transport(Transport::Auto, no_nic_gin), Transport::Gin);
  EXPECT_EQ(choose_transport(Transport::Gin, both), Transport::Gin);
  EXPECT_EQ(choose_transport(Transport::Mlx5, both), Transport::Mlx5);
}

TEST(TransportChoice, RefusalsNameTheOptionAndWhatIsMissing) {
  runtime::rdma::NicAttributes other;
  const TransportCandidates nothing{.nic_problem = "this rank's NIC could not be opened: no mlx5 NIC",
                                    .gin_problem = "options.nccl_comm is null"};
  EXPECT_EQ(refusal(Transport::Auto, nothing),
            "railyard Buffer: options.transport is Transport::Auto, and neither transport is available: mlx5: this "
            "rank's NIC could not be opened: no mlx5 NIC; gin: options.nccl_comm is null");
  EXPECT_EQ(refusal(Transport::Gin, nothing), "railyard Buffer: options.transport is Transport::Gin, but options.nccl_comm is null");
  EXPECT_EQ(refusal(Transport::Mlx5, nothing),
            "railyard Buffer: options.transport is Transport::Mlx5, but this rank's NIC could not be opened: no mlx5 "
            "NIC; expected Transport::Gin or Auto there");
  EXPECT_NE(refusal(Transport::Mlx5, {.nic = &other}).find("not one the GPU can drive itself"), std::string::npos);
  EXPECT_EQ(refusal(static_cast<Transport>(7), nothing),
            "railyard Buffer: options.transport is 7; expected Transport::Auto, Mlx5 or Gin");
}

}  // namespace
}  // namespace railyard::detail
