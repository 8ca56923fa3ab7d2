// Loading a secret (the data or the admin secret of docs/security.md) from a file or the
// environment, never from the command line (where `ps` and shell history show it).
#pragma once

#include <string>

#include "rdkv/status.h"

namespace rdkv {

// The secret, from the first of: `file` (its whole content, one trailing "\n" or "\r\n"
// removed), the environment variable `env_name`, `deprecated_value` (a deprecated command-line
// flag; a warning naming `deprecated_flag` is printed to stderr). Empty when none is
// set. Errors: kInvalidArgument for an unreadable or empty file, or a secret longer than 1024
// bytes; a file readable by group or others is accepted with a warning on stderr. Thread-compatible
// (reads the environment); control path only.
Result<std::string> LoadSecret(const std::string& file, const char* env_name,
                               const std::string& deprecated_value, const char* deprecated_flag);

}  // namespace rdkv
