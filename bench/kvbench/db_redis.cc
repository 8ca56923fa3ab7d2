// -db redis: hiredis, one connection per client thread. A record is one string value
// (GET / SET), the same single value rdkv and memcached store. (YCSB's own redis binding keeps
// a hash per record plus a sorted-set index for scans; kvbench has no scans and compares equal
// work per operation instead.)
#include <hiredis/hiredis.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "bench/kvbench/db.h"

namespace rdkv::kvbench {

namespace {

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

struct ContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};

std::string ConnectionErrorKind(const redisContext* c) {
  switch (c->err) {
    case REDIS_ERR_IO:
      return "io";
    case REDIS_ERR_EOF:
      return "eof";
    case REDIS_ERR_PROTOCOL:
      return "protocol";
    case REDIS_ERR_OOM:
      return "client_oom";
    default:
      return "connection";
  }
}

Result<std::unique_ptr<redisContext, ContextFree>> Connect(const std::string& host, int port) {
  timeval tv{5, 0};
  std::unique_ptr<redisContext, ContextFree> c(redisConnectWithTimeout(host.c_str(), port, tv));
  if (!c) return Status::Unavailable("redis: cannot allocate a context");
  if (c->err) {
    return Status::Unavailable("redis: cannot connect to " + host + ":" + std::to_string(port) +
                               ": " + c->errstr);
  }
  redisSetTimeout(c.get(), tv);
  return c;
}

class RedisDB final : public DB {
 public:
  RedisDB(std::string host, int port, std::unique_ptr<redisContext, ContextFree> c)
      : host_(std::move(host)), port_(port), c_(std::move(c)) {}

  OpStatus Read(std::string_view key, std::string* value) override {
    Reply r;
    if (OpStatus s = Command(&r, "GET %b", key.data(), key.size()); !s.ok()) return s;
    if (r->type == REDIS_REPLY_NIL) return OpStatus::NotFound();
    if (r->type != REDIS_REPLY_STRING) return OpStatus::Error("unexpected_reply");
    value->assign(r->str, r->len);
    return OpStatus::Ok();
  }
  OpStatus Update(std::string_view key, std::string_view value) override { return Set(key, value); }
  OpStatus Insert(std::string_view key, std::string_view value) override { return Set(key, value); }

 private:
  OpStatus Set(std::string_view key, std::string_view value) {
    Reply r;
    if (OpStatus s = Command(&r, "SET %b %b", key.data(), key.size(), value.data(), value.size());
        !s.ok()) {
      return s;
    }
    if (r->type != REDIS_REPLY_STATUS) return OpStatus::Error("unexpected_reply");
    return OpStatus::Ok();
  }

  template <typename... Args>
  OpStatus Command(Reply* out, const char* fmt, Args... args) {
    if (!c_ || c_->err) {
      // A broken connection is replaced by the next operation (that one still counts as failed).
      auto c = Connect(host_, port_);
      if (!c.ok()) return OpStatus::Error("connect");
      c_ = std::move(*c);
    }
    out->reset(static_cast<redisReply*>(redisCommand(c_.get(), fmt, args...)));
    if (!*out) return OpStatus::Error(ConnectionErrorKind(c_.get()));
    if ((*out)->type == REDIS_REPLY_ERROR) {
      // "OOM command not allowed ..." -> "OOM"
      std::string first((*out)->str, (*out)->len);
      first = first.substr(0, first.find(' '));
      return OpStatus::Error(first.empty() ? "ERR" : first);
    }
    return OpStatus::Ok();
  }

  std::string host_;
  int port_;
  std::unique_ptr<redisContext, ContextFree> c_;
};

class RedisBackend final : public Backend {
 public:
  RedisBackend(std::string host, int port) : host_(std::move(host)), port_(port) {}
  std::string name() const override { return "redis"; }
  Result<std::unique_ptr<DB>> NewDB() override {
    auto c = Connect(host_, port_);
    if (!c.ok()) return c.status();
    return std::unique_ptr<DB>(std::make_unique<RedisDB>(host_, port_, std::move(*c)));
  }

 private:
  std::string host_;
  int port_;
};

}  // namespace

Result<int> ParsePortProperty(const Properties& props, const std::string& name, int fallback);

Result<std::unique_ptr<Backend>> MakeRedisBackend(const Properties& props) {
  const std::string host = props.Get("redis.host", "127.0.0.1");
  auto port = ParsePortProperty(props, "redis.port", 6379);
  if (!port.ok()) return port.status();
  // Fail early with a clear message when nothing answers.
  auto probe = Connect(host, *port);
  if (!probe.ok()) return probe.status();
  return std::unique_ptr<Backend>(std::make_unique<RedisBackend>(host, *port));
}

}  // namespace rdkv::kvbench
