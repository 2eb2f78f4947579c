// A JSON value taken from a file, as an error message quotes it: ASCII only, control characters
// and other non-ASCII escaped (\uXXXX), invalid UTF-8 replaced rather than thrown on.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace mxmoe {

inline std::string json_text(const nlohmann::json& value) {
  return value.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
}

}  // namespace mxmoe
