// JSON that comes from another process (a server's STATS or map, etcd's replies, an operator's
// map file): parsed with a bound on its nesting. nlohmann's parser keeps its own stack, but
// writing a value out (dump(), also inside error messages that quote a field) recurses once
// per level, so a message of a few hundred KiB of '[' that is parsed and then written out ends
// the process with a stack overflow. A depth callback makes the parser drop what lies deeper,
// and the whole text is refused.
//
// Header-only; pure (thread-safe).
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

namespace rdkv {

// Deeper than any JSON rdkv writes (a cluster map or STATS: 5 levels at most).
inline constexpr int kMaxJsonDepth = 32;

// `text` parsed; a discarded value (is_discarded()) when it is not JSON or nests deeper than
// kMaxJsonDepth. Never throws.
inline nlohmann::json ParseJsonBounded(std::string_view text) {
  bool too_deep = false;
  nlohmann::json j = nlohmann::json::parse(
      text,
      [&too_deep](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        if (depth <= kMaxJsonDepth) return true;
        too_deep = true;
        return false;
      },
      /*allow_exceptions=*/false);
  if (too_deep) return nlohmann::json(nlohmann::json::value_t::discarded);
  return j;
}

}  // namespace rdkv
