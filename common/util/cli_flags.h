// Checks a tool's command line before gflags parses it (kvserver, kvcli).
//
// gflags knows every flag linked into the binary, RocksDB's tool flags included, and on a bad
// flag it exits with status 1, which rdkv's tools use for "not found". CheckCommandLine accepts
// only the program's own flags (those defined in `own_file`), the few listed in `extra` (e.g.
// glog's "v") and gflags' own --flagfile/--fromenv/--tryfromenv/--undefok/--version; it also
// checks that each value given on the command line, or in a FLAGS_<name> variable that
// --fromenv/--tryfromenv names, parses, so the caller can exit with its usage status (2).
// Values read by --flagfile are parsed by gflags itself (a bad one exits 1).
//
// Thread-safety: call from main() before other threads start (it sets flags to try values).
#pragma once

#include <gflags/gflags.h>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace rdkv::cli {

// True for gflags' own flags that rdkv's tools accept.
inline bool IsGflagsBuiltin(std::string_view name) {
  return name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok" ||
         name == "version";
}

// True when the flag is one of the program's own (defined in `own_file`) or in `extra`.
inline bool IsOwnFlag(const gflags::CommandLineFlagInfo& f, std::string_view own_file,
                      std::initializer_list<std::string_view> extra) {
  if (f.filename == own_file) return true;
  for (std::string_view e : extra) {
    if (f.name == e) return true;
  }
  return false;
}

// True when the command line asks for help before any "--": -h, or a flag starting with
// --help or -help (--helpfull, --helpshort: the program's own help, never gflags' full list).
inline bool AsksForHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") return false;
    if (a == "-h" || a.rfind("--help", 0) == 0 || a.rfind("-help", 0) == 0) return true;
  }
  return false;
}

// "" when every flag in argv[1..argc) (up to a "--") is accepted and its value parses; else a
// message naming the first bad flag. `program` prefixes the hint ("see kvserver --help").
inline std::string CheckCommandLine(int argc, char** argv, std::string_view program,
                                    std::string_view own_file,
                                    std::initializer_list<std::string_view> extra = {}) {
  const std::string hint = " (" + std::string(program) + " --help lists the flags)";
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;  // a positional argument, or "-" (stdin)
    std::string_view body = a.substr(a[1] == '-' ? 2 : 1);
    size_t eq = body.find('=');
    std::string name(body.substr(0, eq));
    const bool has_value = eq != std::string_view::npos;
    std::string value = has_value ? std::string(body.substr(eq + 1)) : std::string();
    if (name.empty()) return "'" + std::string(a) + "' is not a flag" + hint;
    if (IsGflagsBuiltin(name)) {
      if (!has_value && name != "version" && i + 1 < argc) value = argv[++i];  // --flagfile FILE
      if (name == "fromenv" || name == "tryfromenv") {
        // NAME,NAME...: each must be the program's flag, and a FLAGS_<name> it finds must parse.
        for (size_t start = 0; start <= value.size();) {
          size_t comma = value.find(',', start);
          std::string env_name =
              value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
          start = comma == std::string::npos ? value.size() + 1 : comma + 1;
          if (env_name.empty()) continue;
          gflags::CommandLineFlagInfo info;
          if (!gflags::GetCommandLineFlagInfo(env_name.c_str(), &info) ||
              !IsOwnFlag(info, own_file, extra)) {
            return "--" + name + ": unknown flag " + env_name + hint;
          }
          const char* env = std::getenv(("FLAGS_" + env_name).c_str());
          if (env != nullptr && gflags::SetCommandLineOption(env_name.c_str(), env).empty()) {
            return "FLAGS_" + env_name + "=" + env + " (--" + name + "): not a valid " + info.type +
                   hint;
          }
        }
      }
      continue;
    }
    gflags::CommandLineFlagInfo info;
    bool negated = false;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      if (name.rfind("no", 0) == 0 && gflags::GetCommandLineFlagInfo(name.c_str() + 2, &info) &&
          info.type == "bool") {
        negated = true;
        name = name.substr(2);
      } else {
        return "unknown flag --" + name + hint;
      }
    }
    if (!IsOwnFlag(info, own_file, extra)) {
      return "unknown flag --" + name + " (not a " + std::string(program) +
             " flag: " + std::string(program) + " --help lists the flags)";
    }
    if (negated) {
      if (has_value) return "--no" + name + " takes no value" + hint;
      continue;
    }
    if (!has_value) {
      if (info.type == "bool") continue;
      if (i + 1 >= argc) return "--" + name + " needs a value" + hint;
      value = argv[++i];
    }
    if (gflags::SetCommandLineOption(name.c_str(), value.c_str()).empty()) {
      return "--" + name + "=" + value + ": not a valid " + info.type +
             (info.type == "bool" ? " (true or false)" : "") + hint;
    }
  }
  return "";
}

// One entry per own flag, in gflags' --help format (scripts grep it: deploy/local-cluster.sh):
// "    -name (description) type: T default: D\n".
inline std::string OwnFlagsHelp(std::string_view own_file,
                                std::initializer_list<std::string_view> extra = {}) {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  std::string out;
  for (const auto& f : flags) {
    if (!IsOwnFlag(f, own_file, extra)) continue;
    out += "    -" + f.name + " (" + f.description + ") type: " + f.type +
           " default: " + (f.type == "string" ? "\"" + f.default_value + "\"" : f.default_value) +
           "\n";
  }
  return out;
}

}  // namespace rdkv::cli
