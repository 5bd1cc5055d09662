// Railyard public API: how Buffer reports failures. Host only.
//
// One convention for the whole API, exceptions:
//  - std::invalid_argument: the caller's arguments can never work. The message names
//    the argument (as the field of the args struct) and the expected value, e.g.
//    "railyard Buffer::dispatch: args.num_tokens is 9; expected 0..8 (config.max_tokens_per_rank)".
//    Launcher checks that fail are rethrown as this type, their message kept.
//  - railyard::Error: valid arguments that this build or device cannot run
//    (StatusCode::Unsupported), a launch the runtime refused (LaunchFailed), or a
//    kernel that failed and left its report in the buffer's failure record
//    (Buffer::synchronize): a timed-out wait (Timeout), or an operation given up on
//    every rank (Aborted: one rank's bad routing, or ranks whose operations differ).
//  - errors of the layers below pass through unchanged: runtime::RegisteredBufferError
//    (creation, with ConfigMismatchError / TopologyError / BootstrapError nested),
//    runtime::DeviceError, and the simulator's sim::Error for faults and hangs.
#pragma once

#include <stdexcept>
#include <string>

#include "railyard/common/status.hpp"

namespace railyard {

class Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

}  // namespace railyard
