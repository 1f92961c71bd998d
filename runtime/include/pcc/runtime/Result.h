//===- Result.h - value-or-error for the runtime ----------------*- C++ -*-===//
//
// The runtime reports every failure as a message that names the file,
// tensor or rank at fault. Result<T> carries either a value or that message.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_RESULT_H
#define PCC_RUNTIME_RESULT_H

#include <optional>
#include <string>
#include <utility>

namespace pccrt {

struct Error {
  std::string message;
};

template <typename T> class [[nodiscard]] Result {
public:
  Result(T value) : value_(std::move(value)) {}
  Result(Error error) : error_(std::move(error.message)) {}

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  const std::string &error() const { return error_; }
  T &operator*() { return *value_; }
  const T &operator*() const { return *value_; }
  T *operator->() { return &*value_; }
  const T *operator->() const { return &*value_; }
  T take() { return std::move(*value_); }

private:
  std::optional<T> value_;
  std::string error_;
};

/// Result<void>: success or an error message.
class [[nodiscard]] Status {
public:
  Status() = default;
  Status(Error error) : error_(std::move(error.message)), failed_(true) {}
  static Status success() { return Status(); }
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const std::string &error() const { return error_; }

private:
  std::string error_;
  bool failed_ = false;
};

} // namespace pccrt

#endif // PCC_RUNTIME_RESULT_H
