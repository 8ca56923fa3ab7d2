#include "common/util/secret.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace rdkv {

namespace {
constexpr size_t kMaxSecret = 1024;

Result<std::string> Checked(std::string secret, const std::string& where) {
  if (secret.size() > kMaxSecret) {
    return Status::InvalidArgument(where + ": the secret is longer than " +
                                   std::to_string(kMaxSecret) + " bytes");
  }
  return secret;
}
}  // namespace

Result<std::string> LoadSecret(const std::string& file, const char* env_name,
                               const std::string& command_line_value, const char* flag) {
  if (!command_line_value.empty()) {
    return Status::InvalidArgument(std::string("--") + flag +
                                   " is refused: a secret on the command line is visible in `ps` "
                                   "and shell history. Put it in a file (--" +
                                   flag + "_file=PATH, mode 0600) or in $" + env_name + ".");
  }
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      return Status::InvalidArgument("cannot read the secret file " + file + ": " +
                                     std::strerror(errno) + " (check the path and permissions)");
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    std::string secret = ss.str();
    if (!secret.empty() && secret.back() == '\n') secret.pop_back();
    if (!secret.empty() && secret.back() == '\r') secret.pop_back();
    if (secret.empty()) {
      return Status::InvalidArgument("the secret file " + file +
                                     " is empty: write the secret into it (e.g. openssl rand "
                                     "-hex 32 > " +
                                     file + ")");
    }
    struct stat st {};
    if (stat(file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      std::fprintf(stderr,
                   "WARNING: the secret file %s is readable by group or others: chmod 600 %s\n",
                   file.c_str(), file.c_str());
    }
    return Checked(std::move(secret), file);
  }
  if (const char* env = std::getenv(env_name); env != nullptr && env[0] != '\0') {
    return Checked(env, std::string("$") + env_name);
  }
  return std::string();
}

}  // namespace rdkv
