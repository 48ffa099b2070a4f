// The out-of-line part of core/error.h: building the message of a failed internal assertion.
#include "core/error.h"

namespace frugal::detail {

void throw_internal(const char* cond, const char* file, int line, const std::string& msg) {
  throw InternalError(str_cat("internal error (a bug in frugal): ", cond, " failed at ", file, ":", line,
                              msg.empty() ? "" : ": ", msg));
}

}  // namespace frugal::detail
