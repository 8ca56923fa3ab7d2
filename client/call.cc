#include "client/call.h"

#include <vector>

#include "client/client_internal.h"
#include "common/kv/limits.h"
#include "common/kv/ops.h"

namespace rdkv::client {

std::string DescribeKey(std::string_view key) {
  static constexpr size_t kShown = 64;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "key '";
  for (size_t i = 0; i < key.size() && i < kShown; ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (key.size() > kShown) out += "...(" + std::to_string(key.size()) + " bytes)";
  out += "'";
  return out;
}

Status Caller::Call(Link& link, const kv::Request& request, uint64_t* version, std::string* body,
                    std::chrono::milliseconds timeout, bool* from_server) {
  if (from_server != nullptr) *from_server = false;
  if (timeout == std::chrono::milliseconds::zero()) timeout = options_.op_timeout;
  auto session_or = links_->SessionOf(link);
  if (!session_or.ok()) return Fail(session_or.status());
  std::shared_ptr<Session> session = std::move(session_or).value();
  const kv::OpInfo& info = kv::InfoOf(request.op);
  // The op table decides: a snapshot's name or a shard move's request is no keyed write.
  const bool write = kv::IsWrite(request.op);
  if (info.has_value) {
    Status size = kv::CheckValueSize(request.value.size(), session->header().max_value_bytes);
    if (!size.ok()) return Fail(size);
  }
  std::vector<uint8_t> encoded, response;
  kv::EncodeRequest(request, &encoded);
  if (write) Add(counters_->writes);
  Status s = session->conn().Call(encoded, &response, timeout);
  if (write) {
    // This client's cached location of the key is (or is about to be) stale.
    link.cache.Erase(kv::KeyHash(request.key));
  }
  auto what = [&] {
    return std::string(kv::OpName(request.op)) +
           (info.keyed ? " of " + DescribeKey(request.key) : "") + " to " + session->conn().peer();
  };
  if (!s.ok()) {
    if (s.Is(StatusCode::kConnectionLost)) session->MarkBroken();
    return Fail(Status(s.code(), what() + ": " + s.message()));
  }
  auto decoded = kv::DecodeResponse(response);
  if (!decoded.ok()) {
    return Fail(Status(decoded.status().code(), what() + ": " + decoded.status().message()));
  }
  const kv::Response& r = decoded.value();
  if (from_server != nullptr) *from_server = true;
  if (!r.status.ok()) {
    std::string msg = r.status.message();
    if (msg.empty()) msg = what() + ": " + std::string(StatusCodeName(r.status.code()));
    if (r.status.Is(StatusCode::kVersionMismatch) &&
        msg.find(std::to_string(r.version)) == std::string::npos) {
      msg += " (current version " + std::to_string(r.version) + ")";
    }
    Status out(r.status.code(), std::move(msg));
    if (out.Is(StatusCode::kWrongOwner) && version != nullptr) *version = r.version;
    bool answer = out.Is(StatusCode::kNotFound) || out.Is(StatusCode::kAlreadyExists) ||
                  out.Is(StatusCode::kVersionMismatch) || out.Is(StatusCode::kWrongOwner);
    return answer ? out : Fail(out);
  }
  if (version != nullptr) *version = r.version;
  if (write) {
    // The server says where the new item is: cache it, so this client's next GET of the key is
    // one READ (checked like any cached location). A malformed hint is ignored, not an error:
    // the write itself succeeded.
    Result<std::optional<kv::ItemLocation>> where = kv::DecodeItemLocation(r.body);
    if (where.ok() && where->has_value()) {
      const kv::ItemLocation& w = **where;
      link.cache.Store(kv::KeyHash(request.key), CachedLocation{w.offset_units, w.units, w.choice});
    }
  }
  if (body != nullptr) body->assign(r.body.data(), r.body.size());
  return Status::Ok();
}

}  // namespace rdkv::client
