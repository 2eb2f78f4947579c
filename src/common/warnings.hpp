// Warnings that must not stop the work (a corrupt cache entry, an unwritable cache directory): one
// line on stderr beginning "mxmoe: warning:", each distinct message once per process.
#pragma once

#include <string>

namespace mxmoe {

void warn_once(const std::string& message);

}  // namespace mxmoe
