#include "bench/kvbench/workload.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace rdkv::kvbench {

namespace {

std::string_view Trim(std::string_view s) {
  const char* ws = " \t\f\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

// Java .properties: a line ending in an odd number of backslashes continues.
bool Continues(std::string_view line) {
  size_t n = 0;
  while (n < line.size() && line[line.size() - 1 - n] == '\\') ++n;
  return n % 2 == 1;
}

Status SplitAssignment(std::string_view line, std::string* name, std::string* value) {
  // name ends at the first unescaped '=', ':' or whitespace.
  size_t i = 0;
  std::string key;
  while (i < line.size()) {
    const char c = line[i];
    if (c == '\\' && i + 1 < line.size()) {
      key.push_back(line[i + 1]);
      i += 2;
      continue;
    }
    if (c == '=' || c == ':' || c == ' ' || c == '\t' || c == '\f') break;
    key.push_back(c);
    ++i;
  }
  while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\f')) ++i;
  if (i < line.size() && (line[i] == '=' || line[i] == ':')) ++i;
  *name = key;
  *value = std::string(Trim(line.substr(i)));
  if (name->empty()) return Status::InvalidArgument("no property name");
  return Status::Ok();
}

}  // namespace

Status Properties::ParseText(std::string_view text, const std::string& origin) {
  std::vector<std::string_view> lines;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = Trim(lines[i]);
    if (line.empty() || line[0] == '#' || line[0] == '!') continue;
    const std::string where = origin + ":" + std::to_string(i + 1);
    std::string logical;
    while (Continues(line)) {
      logical.append(line.substr(0, line.size() - 1));
      if (++i == lines.size()) {
        return Status::InvalidArgument(where + ": line continuation at the end of the file");
      }
      line = Trim(lines[i]);
    }
    logical.append(line);
    std::string name, value;
    Status s = SplitAssignment(logical, &name, &value);
    if (!s.ok()) {
      return Status::InvalidArgument(where + ": malformed line '" + logical + "': " + s.message());
    }
    Set(name, value, where);
  }
  return Status::Ok();
}

Status Properties::LoadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::FromErrno("cannot read workload file " + path, errno);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseText(ss.str(), path);
}

Status Properties::ParseOverride(std::string_view assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return Status::InvalidArgument("-p " + std::string(assignment) + ": expected name=value");
  }
  Set(std::string(Trim(assignment.substr(0, eq))), std::string(Trim(assignment.substr(eq + 1))),
      "-p");
  return Status::Ok();
}

void Properties::Set(const std::string& name, const std::string& value, const std::string& origin) {
  values_[name] = {value, origin};
}

std::string Properties::Get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.first;
}

std::string Properties::OriginOf(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? "" : it->second.second;
}

std::string_view DistributionName(Distribution d) {
  switch (d) {
    case Distribution::kUniform:
      return "uniform";
    case Distribution::kZipfian:
      return "zipfian";
    case Distribution::kLatest:
      return "latest";
    case Distribution::kHotspot:
      return "hotspot";
  }
  return "?";
}

const std::vector<std::pair<std::string, std::string>>& KnownProperties() {
  static const std::vector<std::pair<std::string, std::string>> kProps = {
      {"workload", "site.ycsb.workloads.CoreWorkload (the only one)"},
      {"recordcount", "records loaded by the load phase (and the run phase's key space)"},
      {"operationcount", "operations of the run phase (0: until maxexecutiontime)"},
      {"warmupoperationcount",
       "run phase: operations on one thread before the measured ones, not counted (default 0)"},
      {"insertstart", "first key number the load phase inserts (default 0)"},
      {"insertcount", "records this load inserts (default recordcount - insertstart)"},
      {"readproportion", "share of reads (default 0.95)"},
      {"updateproportion", "share of updates (default 0.05)"},
      {"insertproportion", "share of inserts (default 0)"},
      {"readmodifywriteproportion", "share of read-modify-writes (default 0)"},
      {"scanproportion", "share of scans: must be 0 (a hash store has no range scans)"},
      {"maxscanlength", "scan length (workload E; accepted, unused)"},
      {"scanlengthdistribution", "scan length distribution (workload E; accepted, unused)"},
      {"requestdistribution", "uniform, zipfian, latest or hotspot (default uniform)"},
      {"zipfianconstant", "zipfian skew theta, 0 < theta < 1 (default 0.99)"},
      {"hotspotdatafraction", "hotspot: share of the keys that are hot (default 0.2)"},
      {"hotspotopnfraction", "hotspot: share of the operations on hot keys (default 0.8)"},
      {"fieldcount", "fields per record (default 10)"},
      {"fieldlength", "bytes per field (default 100)"},
      {"fieldlengthdistribution", "constant (the only one)"},
      {"readallfields", "true (a record is one value: a read returns all fields)"},
      {"writeallfields", "true (a record is one value: an update writes all fields)"},
      {"insertorder", "hashed (default: key user<fnvhash64(n)>) or ordered (user<n>)"},
      {"zeropadding", "1 (no zero padding of key numbers)"},
      {"table", "table name (accepted, unused: keys carry no table, as in YCSB)"},
      {"maxexecutiontime", "stop after this many seconds (0: no limit)"},
      {"target", "ops/s over all threads (0: as fast as possible); -target"},
      {"threadcount", "client threads; -threads"},
      {"status.interval", "seconds between status lines on stderr (default 10; 0: none)"},
      {"db", "rdkv, redis or memcached; -db"},
      {"rdkv.seed", "rdkv: a server, host:port (default 127.0.0.1:7400)"},
      {"rdkv.transport", "rdkv: auto, tcp or verbs (default auto)"},
      {"rdkv.device", "rdkv: RDMA device for verbs (default: the first active)"},
      {"rdkv.auth_token_file", "rdkv: file with the servers' data secret (else $RDKV_AUTH_TOKEN)"},
      {"rdkv.auth_token", "rdkv: refused (visible in ps; use rdkv.auth_token_file)"},
      {"rdkv.tls_ca_file", "rdkv: PEM CA of the servers' certificates: TLS on (tcp only)"},
      {"rdkv.tls_cert_file", "rdkv: PEM client certificate (servers requiring one)"},
      {"rdkv.tls_key_file", "rdkv: PEM key of rdkv.tls_cert_file"},
      {"rdkv.op_timeout_ms", "rdkv: deadline of one operation in ms (default 2000)"},
      {"rdkv.connections_per_server", "rdkv: connections to each server (default 2)"},
      {"rdkv.busy_poll_us", "rdkv: tcp, us a waiting thread polls before it sleeps (default 50)"},
      {"redis.host", "redis: host (default 127.0.0.1)"},
      {"redis.port", "redis: port (default 6379)"},
      {"memcached.host", "memcached: host (default 127.0.0.1)"},
      {"memcached.port", "memcached: port (default 11211)"},
  };
  return kProps;
}

namespace {

class Checker {
 public:
  explicit Checker(const Properties& p) : p_(p) {}

  std::string Where(const std::string& name) const {
    const std::string o = p_.OriginOf(name);
    return o.empty() ? name : name + " (" + o + ")";
  }
  Status Bad(const std::string& name, const std::string& why) const {
    return Status::InvalidArgument("property " + Where(name) + " = '" + p_.Get(name) + "': " + why);
  }

  Status Int(const std::string& name, int64_t lo, int64_t hi, int64_t* out) const {
    if (!p_.Has(name)) return Status::Ok();
    const std::string v = p_.Get(name);
    int64_t x = 0;
    auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (v.empty() || ec != std::errc() || ptr != v.data() + v.size()) {
      return Bad(name, "not an integer");
    }
    if (x < lo || x > hi) {
      return Bad(name, "must be in " + std::to_string(lo) + ".." + std::to_string(hi));
    }
    *out = x;
    return Status::Ok();
  }
  Status Int32(const std::string& name, int64_t lo, int64_t hi, int* out) const {
    int64_t x = *out;
    RDKV_RETURN_IF_ERROR(Int(name, lo, hi, &x));
    *out = static_cast<int>(x);
    return Status::Ok();
  }
  Status Double(const std::string& name, double lo, double hi, double* out, bool open_lo = false,
                bool open_hi = false) const {
    if (!p_.Has(name)) return Status::Ok();
    const std::string v = p_.Get(name);
    double x = 0;
    auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (v.empty() || ec != std::errc() || ptr != v.data() + v.size() || !std::isfinite(x)) {
      return Bad(name, "not a number");
    }
    if (x < lo || x > hi || (open_lo && x == lo) || (open_hi && x == hi)) {
      std::ostringstream range;
      range << (open_lo ? "(" : "[") << lo << ", " << hi << (open_hi ? ")" : "]");
      return Bad(name, "must be in " + range.str());
    }
    *out = x;
    return Status::Ok();
  }
  Status OneOf(const std::string& name, std::initializer_list<const char*> allowed,
               std::string* out) const {
    if (!p_.Has(name)) return Status::Ok();
    const std::string v = p_.Get(name);
    std::string list;
    for (const char* a : allowed) {
      if (v == a) {
        *out = v;
        return Status::Ok();
      }
      list += list.empty() ? "" : ", ";
      list += a;
    }
    return Bad(name, "must be one of: " + list);
  }

 private:
  const Properties& p_;
};

}  // namespace

Result<WorkloadConfig> ParseWorkload(const Properties& props) {
  std::set<std::string> known;
  for (const auto& [name, _] : KnownProperties()) known.insert(name);
  for (const auto& [name, vo] : props.all()) {
    if (!known.count(name)) {
      std::string hint;
      const size_t dot = name.find('.');
      if (dot != std::string::npos &&
          (name.compare(0, dot, "rdkv") == 0 || name.compare(0, dot, "redis") == 0 ||
           name.compare(0, dot, "memcached") == 0)) {
        hint = " (backend properties: ";
        for (const auto& k : known) {
          if (k.compare(0, dot + 1, name, 0, dot + 1) == 0) hint += k + " ";
        }
        hint.back() = ')';
      }
      return Status::InvalidArgument("unknown property '" + name + "' (" + vo.second + ")" + hint +
                                     "; kvbench --help lists the properties it knows");
    }
  }

  Checker c(props);
  WorkloadConfig w;
  std::string s;
  RDKV_RETURN_IF_ERROR(c.OneOf(
      "workload",
      {"site.ycsb.workloads.CoreWorkload", "com.yahoo.ycsb.workloads.CoreWorkload", "CoreWorkload"},
      &s));
  constexpr int64_t kMaxCount = int64_t{1} << 40;
  RDKV_RETURN_IF_ERROR(c.Int("recordcount", 0, kMaxCount, &w.recordcount));
  RDKV_RETURN_IF_ERROR(c.Int("operationcount", 0, kMaxCount, &w.operationcount));
  RDKV_RETURN_IF_ERROR(c.Int("warmupoperationcount", 0, kMaxCount, &w.warmupoperationcount));
  RDKV_RETURN_IF_ERROR(c.Int("insertstart", 0, kMaxCount, &w.insertstart));
  w.insertcount = w.recordcount - w.insertstart;
  RDKV_RETURN_IF_ERROR(c.Int("insertcount", 0, kMaxCount, &w.insertcount));
  if (!props.Has("recordcount") || w.recordcount == 0) {
    return Status::InvalidArgument("property recordcount must be set to at least 1 (" +
                                   c.Where("recordcount") + ")");
  }
  if (w.insertstart + w.insertcount > w.recordcount) {
    return Status::InvalidArgument("insertstart + insertcount (" +
                                   std::to_string(w.insertstart + w.insertcount) +
                                   ") exceeds recordcount (" + std::to_string(w.recordcount) + ")");
  }

  RDKV_RETURN_IF_ERROR(c.Double("readproportion", 0, 1, &w.readproportion));
  RDKV_RETURN_IF_ERROR(c.Double("updateproportion", 0, 1, &w.updateproportion));
  RDKV_RETURN_IF_ERROR(c.Double("insertproportion", 0, 1, &w.insertproportion));
  RDKV_RETURN_IF_ERROR(c.Double("readmodifywriteproportion", 0, 1, &w.readmodifywriteproportion));
  RDKV_RETURN_IF_ERROR(c.Double("scanproportion", 0, 1, &w.scanproportion));
  const double sum = w.readproportion + w.updateproportion + w.insertproportion +
                     w.readmodifywriteproportion + w.scanproportion;
  if (sum <= 0) {
    return Status::InvalidArgument(
        "the operation proportions (read, update, insert, readmodifywrite, scan) are all 0");
  }
  int64_t ignored = 0;
  RDKV_RETURN_IF_ERROR(c.Int("maxscanlength", 1, kMaxCount, &ignored));
  RDKV_RETURN_IF_ERROR(c.OneOf("scanlengthdistribution", {"uniform", "zipfian"}, &s));

  s = "uniform";
  RDKV_RETURN_IF_ERROR(
      c.OneOf("requestdistribution", {"uniform", "zipfian", "latest", "hotspot"}, &s));
  w.requestdistribution = s == "zipfian"   ? Distribution::kZipfian
                          : s == "latest"  ? Distribution::kLatest
                          : s == "hotspot" ? Distribution::kHotspot
                                           : Distribution::kUniform;
  RDKV_RETURN_IF_ERROR(c.Double("zipfianconstant", 0, 1, &w.zipfianconstant, true, true));
  RDKV_RETURN_IF_ERROR(c.Double("hotspotdatafraction", 0, 1, &w.hotspotdatafraction));
  RDKV_RETURN_IF_ERROR(c.Double("hotspotopnfraction", 0, 1, &w.hotspotopnfraction));
  if (w.requestdistribution == Distribution::kLatest && w.recordcount < 2) {
    return Status::InvalidArgument("requestdistribution=latest needs recordcount >= 2");
  }

  RDKV_RETURN_IF_ERROR(c.Int32("fieldcount", 1, 1000, &w.fieldcount));
  RDKV_RETURN_IF_ERROR(c.Int32("fieldlength", 1, 1 << 20, &w.fieldlength));
  RDKV_RETURN_IF_ERROR(c.OneOf("fieldlengthdistribution", {"constant"}, &s));
  RDKV_RETURN_IF_ERROR(c.OneOf("readallfields", {"true"}, &s));
  RDKV_RETURN_IF_ERROR(c.OneOf("writeallfields", {"true"}, &s));
  RDKV_RETURN_IF_ERROR(c.OneOf("zeropadding", {"1"}, &s));
  s = "hashed";
  RDKV_RETURN_IF_ERROR(c.OneOf("insertorder", {"hashed", "ordered"}, &s));
  w.orderedinserts = s == "ordered";

  RDKV_RETURN_IF_ERROR(c.Double("maxexecutiontime", 0, 1e9, &w.maxexecutiontime));
  RDKV_RETURN_IF_ERROR(c.Double("target", 0, 1e12, &w.target));
  RDKV_RETURN_IF_ERROR(c.Int32("threadcount", 1, 4096, &w.threadcount));
  RDKV_RETURN_IF_ERROR(c.Double("status.interval", 0, 1e6, &w.status_interval));
  RDKV_RETURN_IF_ERROR(c.OneOf("db", {"rdkv", "redis", "memcached"}, &s));
  return w;
}

std::string ScanRefusal(const WorkloadConfig& config) {
  std::ostringstream m;
  m << "this workload has scans (scanproportion=" << config.scanproportion
    << "; YCSB workload E is 95% scans): rdkv is a hash store and has no range scans, so kvbench "
       "cannot run it. The redis and memcached backends store records as plain keys and cannot "
       "scan either, so E is refused for every backend. Workloads A, B, C, D and F run on all "
       "three.";
  return m.str();
}

CoreWorkload::CoreWorkload(const WorkloadConfig& config)
    : config_(config), load_sequence_(config.insertstart), insert_sequence_(config.recordcount) {
  value_size_ = 0;
  for (int i = 0; i < config_.fieldcount; ++i) {
    field_names_.push_back("field" + std::to_string(i) + "=");
    value_size_ += field_names_.back().size() + static_cast<size_t>(config_.fieldlength);
  }
  // YCSB: predict the run phase's inserts (with a fudge factor of 2) so that the scrambled
  // zipfian's key space, and thus which keys are popular, does not change as keys are added.
  expected_new_keys_ = static_cast<int64_t>(static_cast<double>(config_.operationcount) *
                                            config_.insertproportion * 2.0);
  if (config_.requestdistribution == Distribution::kLatest) {
    latest_zetan_ =
        Zeta(static_cast<uint64_t>(insert_sequence_.LastValue()), config_.zipfianconstant);
  }
}

std::string CoreWorkload::BuildKeyName(int64_t keynum) const {
  if (!config_.orderedinserts) keynum = FnvHash64(keynum);
  return "user" + std::to_string(keynum);
}

void CoreWorkload::BuildValue(std::string_view key, Rng& rng, std::string* out) const {
  out->clear();
  out->reserve(value_size_);
  const size_t flen = static_cast<size_t>(config_.fieldlength);
  for (size_t f = 0; f < field_names_.size(); ++f) {
    out->append(field_names_[f]);
    size_t start = out->size();
    out->resize(start + flen);
    char* p = out->data() + start;
    size_t i = 0;
    if (f == 0 && key.size() < flen) {
      std::memcpy(p, key.data(), key.size());
      p[key.size()] = ' ';
      i = key.size() + 1;
    }
    while (i < flen) {
      uint64_t r = rng.NextU64();
      for (int b = 0; b < 8 && i < flen; ++b, ++i, r >>= 8) {
        p[i] = static_cast<char>('!' + (r & 0xff) % 94);  // printable, no spaces
      }
    }
  }
}

bool CoreWorkload::CheckValue(std::string_view key, std::string_view value) const {
  if (value.size() != value_size_) return false;
  const size_t flen = static_cast<size_t>(config_.fieldlength);
  size_t off = 0;
  for (size_t f = 0; f < field_names_.size(); ++f) {
    if (value.compare(off, field_names_[f].size(), field_names_[f]) != 0) return false;
    off += field_names_[f].size();
    if (f == 0 && key.size() < flen &&
        (value.compare(off, key.size(), key) != 0 || value[off + key.size()] != ' ')) {
      return false;
    }
    off += flen;
  }
  return true;
}

void CoreWorkload::AcknowledgeInsert(int64_t keynum) {
  // Only fails with over 2^20 inserts outstanding at once, which kvbench's threads cannot reach.
  (void)insert_sequence_.Acknowledge(keynum);
}

CoreWorkload::ThreadState::ThreadState(const CoreWorkload* w, uint64_t seed) : w_(w), rng_(seed) {
  const WorkloadConfig& c = w->config_;
  // YCSB's order: READ, UPDATE, INSERT, SCAN, READMODIFYWRITE (only those with weight > 0).
  if (c.readproportion > 0) ops_.Add(c.readproportion, static_cast<int>(OpType::kRead));
  if (c.updateproportion > 0) ops_.Add(c.updateproportion, static_cast<int>(OpType::kUpdate));
  if (c.insertproportion > 0) ops_.Add(c.insertproportion, static_cast<int>(OpType::kInsert));
  if (c.scanproportion > 0) ops_.Add(c.scanproportion, static_cast<int>(OpType::kScan));
  if (c.readmodifywriteproportion > 0) {
    ops_.Add(c.readmodifywriteproportion, static_cast<int>(OpType::kReadModifyWrite));
  }
  const int64_t lo = c.insertstart;
  const int64_t hi = c.insertstart + c.insertcount - 1;
  switch (c.requestdistribution) {
    case Distribution::kUniform:
      chooser_ = std::make_unique<UniformGenerator>(lo, hi);
      break;
    case Distribution::kZipfian:
      chooser_ = std::make_unique<ScrambledZipfianGenerator>(
          lo, c.insertstart + c.insertcount + w->expected_new_keys_, c.zipfianconstant);
      break;
    case Distribution::kLatest:
      chooser_ = std::make_unique<SkewedLatestGenerator>(&w->insert_sequence_, c.zipfianconstant,
                                                         w->latest_zetan_);
      break;
    case Distribution::kHotspot:
      chooser_ =
          std::make_unique<HotspotGenerator>(lo, hi, c.hotspotdatafraction, c.hotspotopnfraction);
      break;
  }
}

int64_t CoreWorkload::ThreadState::NextKeynum() {
  int64_t keynum;
  do {
    keynum = chooser_->NextValue(rng_);
  } while (keynum > w_->insert_sequence_.LastValue());
  return keynum;
}

std::unique_ptr<CoreWorkload::ThreadState> CoreWorkload::NewThread(uint64_t seed) const {
  return std::unique_ptr<ThreadState>(new ThreadState(this, seed));
}

}  // namespace rdkv::kvbench
