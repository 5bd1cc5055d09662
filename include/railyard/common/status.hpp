// Railyard: the result of a host-side call that can fail without throwing
// (argument checks, kernel launches). Host only.
#pragma once

#include <string>
#include <utility>

namespace railyard {

enum class StatusCode {
  Ok,
  InvalidArgument,  // the caller's arguments can never work (bad size, alignment, pointer)
  Unsupported,      // valid, but no compiled configuration handles it
  LaunchFailed,     // the runtime refused the launch
  Timeout,          // a kernel's bounded wait gave up (a peer never answered)
  Aborted,          // a kernel gave up the operation on every rank: one rank's bad routing, or ranks whose
                    // operations differ (the device context is lost on a GPU, unlike InvalidArgument's refusals)
};

inline const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::Ok: return "Ok";
    case StatusCode::InvalidArgument: return "InvalidArgument";
    case StatusCode::Unsupported: return "Unsupported";
    case StatusCode::LaunchFailed: return "LaunchFailed";
    case StatusCode::Timeout: return "Timeout";
    case StatusCode::Aborted: return "Aborted";
  }
  return "?";
}

class [[nodiscard]] Status {
 public:
  Status() = default;  // Ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status success() { return {}; }
  static Status invalid_argument(std::string message) {
    return {StatusCode::InvalidArgument, std::move(message)};
  }
  static Status unsupported(std::string message) { return {StatusCode::Unsupported, std::move(message)}; }
  static Status launch_failed(std::string message) {
    return {StatusCode::LaunchFailed, std::move(message)};
  }

  bool ok() const { return code_ == StatusCode::Ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const {
    return ok() ? "Ok" : std::string(railyard::to_string(code_)) + ": " + message_;
  }

 private:
  StatusCode code_ = StatusCode::Ok;
  std::string message_;
};

}  // namespace railyard
