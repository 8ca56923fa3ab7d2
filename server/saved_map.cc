#include "server/saved_map.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "server/persistence/format.h"

namespace rdkv::server {

namespace fs = std::filesystem;

namespace {

Status WriteAll(int fd, const std::string& text, const std::string& path) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("write " + path, errno);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

std::string SavedMapPath(const std::string& data_dir) {
  return (fs::path(data_dir) / "cluster_map.json").string();
}

Status SaveClusterMap(const cluster::ClusterMap& map, const std::string& path) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create " + dir.string() + ": " + ec.message());
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno("create " + tmp, errno);
  Status s = WriteAll(fd, map.ToPrettyJson() + "\n", tmp);
  if (s.ok() && ::fsync(fd) != 0) s = Status::FromErrno("fsync " + tmp, errno);
  if (::close(fd) != 0 && s.ok()) s = Status::FromErrno("close " + tmp, errno);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = Status::FromErrno("rename " + tmp + " to " + path, errno);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return persistence::FsyncPath(dir, /*directory=*/true);
}

Result<cluster::ClusterMap> ChooseStartupMap(cluster::ClusterMap from_flag,
                                             const std::string& flag_path,
                                             const std::string& data_dir, std::string* why) {
  const std::string flag_name = flag_path.empty() ? "the given cluster map" : flag_path;
  if (data_dir.empty()) {
    *why = "using " + flag_name + " (epoch " + std::to_string(from_flag.epoch) +
           "): no data dir, so no saved map";
    return from_flag;
  }
  const std::string path = SavedMapPath(data_dir);
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    *why = "using " + flag_name + " (epoch " + std::to_string(from_flag.epoch) + "): no " + path +
           " yet";
    return from_flag;
  }
  Result<cluster::ClusterMap> saved = cluster::LoadClusterMap(path);
  if (!saved.ok()) {
    return Status::InvalidArgument(
        "the saved cluster map cannot be used: " + saved.status().message() +
        ". It is the newest map this server was sent; repair it, or delete it if --cluster_map "
        "is known to be current");
  }
  if (saved->shards != from_flag.shards) {
    return Status::InvalidArgument(
        "the saved cluster map " + path + " has " + std::to_string(saved->shards) + " shards but " +
        flag_name + " has " + std::to_string(from_flag.shards) +
        "; the shard count is fixed for a cluster's life (is this the right --data_dir?)");
  }
  if (saved->epoch > from_flag.epoch) {
    *why = "using the saved map " + path + " (epoch " + std::to_string(saved->epoch) +
           "): it is newer than " + flag_name + " (epoch " + std::to_string(from_flag.epoch) +
           "), a map change this server acknowledged after the file was written";
    return std::move(saved).value();
  }
  *why = "using " + flag_name + " (epoch " + std::to_string(from_flag.epoch) + "): the saved map " +
         path + " (epoch " + std::to_string(saved->epoch) + ") is not newer";
  return from_flag;
}

}  // namespace rdkv::server
