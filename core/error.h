// Errors: frugal::Error and its subclasses for what a user can get wrong (FRUGAL_CHECK), and FRUGAL_ASSERT
// for what only a bug inside frugal can cause. Library code never prints and exits.
//
//   FRUGAL_CHECK(a.dim() == 2, "matmul: expected a 2-D tensor, got shape ", a.shape());
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace frugal {

// A user mistake: bad shapes, dtypes, devices, indices or arguments. The message names the op and what was
// given.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ShapeError : public Error {
 public:
  using Error::Error;
};
class DTypeError : public Error {
 public:
  using Error::Error;
};
class IndexError : public Error {
 public:
  using Error::Error;
};
class DeviceError : public Error {
 public:
  using Error::Error;
};
// An allocation that does not fit under the device's memory limit (or the system's memory).
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};
// A bug inside frugal (a broken invariant); never a user mistake.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_internal(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace frugal

// Throws ErrorType (a frugal::Error subclass) with the streamed message when cond is false.
#define FRUGAL_CHECK_T(ErrorType, cond, ...)                   \
  do {                                                         \
    if (!(cond)) [[unlikely]]                                  \
      throw ErrorType(::frugal::detail::str_cat(__VA_ARGS__)); \
  } while (0)
#define FRUGAL_CHECK(cond, ...) FRUGAL_CHECK_T(::frugal::Error, cond, __VA_ARGS__)
#define FRUGAL_CHECK_SHAPE(cond, ...) FRUGAL_CHECK_T(::frugal::ShapeError, cond, __VA_ARGS__)
#define FRUGAL_CHECK_DTYPE(cond, ...) FRUGAL_CHECK_T(::frugal::DTypeError, cond, __VA_ARGS__)
#define FRUGAL_CHECK_INDEX(cond, ...) FRUGAL_CHECK_T(::frugal::IndexError, cond, __VA_ARGS__)

// An internal invariant; a failure is a bug in frugal and says where.
#define FRUGAL_ASSERT(cond, ...)                                                                           \
  do {                                                                                                     \
    if (!(cond)) [[unlikely]]                                                                              \
      ::frugal::detail::throw_internal(#cond, __FILE__, __LINE__, ::frugal::detail::str_cat(__VA_ARGS__)); \
  } while (0)
