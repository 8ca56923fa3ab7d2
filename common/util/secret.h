// Loading a secret (the data or the admin secret of docs/security.md) from a file or the
// environment, never from the command line (where `ps` and shell history show it).
#pragma once

#include <string>

#include "rdkv/status.h"

namespace rdkv {

// The secret, from the first of: `file` (its whole content, one trailing "\n" or "\r\n"
// removed), the environment variable `env_name`. Empty when neither is set.
// `command_line_value` is what the command-line flag `flag` (e.g. "auth_token") held: a secret
// given there is refused, never used (kInvalidArgument naming the file flag and the variable),
// so that a script that still passes one fails at once instead of leaking it to `ps`.
// Errors: kInvalidArgument for a secret on the command line, an unreadable or empty file, or a
// secret longer than 1024 bytes; a file readable by group or others is accepted with a warning on
// stderr. Thread-compatible (reads the environment); control path only.
Result<std::string> LoadSecret(const std::string& file, const char* env_name,
                               const std::string& command_line_value, const char* flag);

}  // namespace rdkv
