// kvcli: the rdkv command-line client. One command per invocation, or an interactive shell
// (GNU readline: line editing, history) when no command is given. `kvcli --help` says it all.
//
// Exit status: 0 success (GET: found), 1 not found or condition failed (key exists on insert,
// version mismatch on cas, some key missing in mget), 2 error (usage, connection, server).
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/kv/layout.h"
#include "rdkv/admin.h"
#include "rdkv/client.h"

DEFINE_string(server, "127.0.0.1:7400",
              "The kvserver to talk to, as host:port (in a cluster: "
              "any server, the seed).");
DEFINE_string(seed, "",
              "Same as --server (the name cluster commands use); wins when both are "
              "given.");
DEFINE_string(transport, "auto",
              "auto (verbs when an RDMA device with an active port exists, else tcp), verbs, "
              "or tcp. Must match what the server uses.");
DEFINE_string(auth_token, "", "Token to present to the server (its --auth_token).");
DEFINE_bool(json, false,
            "Print results as JSON on stdout (one object per command; errors too, as "
            "{\"ok\":false,\"code\":...,\"message\":...}).");
DEFINE_string(value_file, "",
              "Read the value of put/insert/cas from this file (the VALUE argument is then "
              "left out).");
DEFINE_bool(newline, true,
            "Text mode: end a GET's value with a newline. --nonewline prints the exact bytes.");
DEFINE_int32(timeout_ms, 2000, "Deadline of one operation, in milliseconds.");
DEFINE_int32(connect_timeout_ms, 5000, "Deadline of connecting to the server, in milliseconds.");
DEFINE_bool(all, false,
            "stats: every server of the cluster, each with its statistics, and their totals.");
DEFINE_double(interval, 1.0, "top: seconds between refreshes (at least 0.1).");
DEFINE_int32(iterations, 0, "top: print this many snapshots, then exit (0: until interrupted).");
DEFINE_bool(verbose, false, "Log the client library's progress (transport choice, reconnects).");

namespace {

using nlohmann::json;

constexpr int kExitOk = 0;
constexpr int kExitNo = 1;
constexpr int kExitError = 2;

constexpr const char* kCommandsHelp = R"(Commands:
  get KEY                      Print KEY's value (exit 1 if absent).
  put KEY VALUE                Store VALUE under KEY (create or replace); prints the new version.
  insert KEY VALUE             Store only if KEY is absent (exit 1 if it exists).
  del KEY                      Delete KEY (exit 1 if absent).
  cas KEY EXPECTED_VERSION VALUE
                               Replace only if KEY's version is EXPECTED_VERSION (exit 1 on a
                               mismatch; the current version is printed).
  mget KEY...                  Print several keys, one "KEY<TAB>VALUE" line each (exit 1 if any
                               is absent).
  stats                        The server's statistics (JSON); in a cluster the totals over
                               every server and each server's own ("total", "per_server").
  stats --all                  Every server (standalone: the one), each with its statistics or
                               its error, and the totals.
  cluster                      The cluster's servers: id, address, reachable or not (why),
                               shards owned in the map, map epoch each reports.
  cluster move SHARDS TO_SERVER_ID
                               Move shards (3, 3,5,9 or 0-7) to server TO_SERVER_ID in one
                               command: the map (epoch + 1) goes to the old owners, the items
                               are copied, the map goes to the new owner and every other
                               server, the old copies are dropped. Prints each step, the
                               copy's progress (items done/estimated total, rate, ETA; one
                               updating line on a terminal) and a report. Every server must be reachable. A move that was
                               interrupted (servers on different epochs) is finished first;
                               after a failure, run the same command again to resume.
  snapshot [NAME]              Each server takes a consistent snapshot of its data (a RocksDB
                               checkpoint under its --snapshot_dir); prints "ADDRESS PATH" lines.
                               Needs --durability=sync|async on the servers.
  ping                         Round trip to the server.
  top                          Live view of every server of the cluster, refreshed every
                               --interval seconds: write ops/s by type (put, insert, delete,
                               cas, import; GETs are one-sided READs the server does not
                               count), errors/s, items, heap used/total, index slot use, and
                               a total line. On a terminal it redraws in place (Ctrl-C ends it);
                               otherwise, or with --iterations=N, it prints plain snapshots
                               (N of them, then exits).
  help                         This text (interactive mode).
  quit, exit                   Leave interactive mode (also Ctrl-D).

VALUE is taken literally, or read from a file as @FILE, or from stdin as '-' (not in
interactive mode), or from --value_file. Write a literal value starting with '@' as @@...
Put "--" before arguments that start with '-'.
Without a command, kvcli starts an interactive shell (history in ~/.kvcli_history); arguments
there may be quoted with '...' or "..." (backslash escapes inside "..."); commands may also be
piped in (kvcli < script). The shell's exit status is that of its last command.

Exit status: 0 success / found; 1 not found or condition failed (insert of an existing key, cas
version mismatch, mget with a missing key); 2 error (bad usage, server unreachable, server
error), with a message on stderr.

JSON output (--json): get -> {"ok":true,"key":K,"found":true,"version":N,"value":V}
(or "value_base64" when the value is not UTF-8); writes -> {"ok":true,"op":...,"key":K,
"version":N}; mget -> {"ok":true,"results":[...]}; stats -> the server's object; errors ->
{"ok":false,"code":"NotFound","message":...}.
)";

void PrintHelp(std::ostream& out) {
  out << "kvcli: command-line client of the rdkv key-value store.\n\n"
         "Usage: kvcli [FLAGS] COMMAND [ARGS...]\n"
         "       kvcli [FLAGS]              (interactive shell)\n\n"
      << kCommandsHelp << "\nFlags:\n";
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  for (const auto& f : flags) {
    if (f.filename != __FILE__) continue;
    std::string head = "  --" + f.name;
    if (f.type != "bool") head += "=" + std::string(f.type == "string" ? "STRING" : "N");
    out << head << "\n      " << f.description << "\n      (default: "
        << (f.type == "string" ? "\"" + f.default_value + "\"" : f.default_value) << ")\n";
  }
  out << "  --help\n      This text.\n\nExamples:\n"
         "  kvcli put user:1 alice\n"
         "  kvcli --json get user:1\n"
         "  kvcli cas user:1 42 bob\n"
         "  kvcli put photo @photo.jpg\n"
         "  echo -n hello | kvcli put greeting -\n"
         "  kvcli --seed=10.0.0.1:7400 cluster move 0-7 2\n"
         "  kvcli --seed=10.0.0.1:7400 --interval=2 top\n";
}

// --- output ---

std::string Base64(std::string_view in) {
  static constexpr char kTable[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v =
        (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    out += kTable[v >> 18];
    out += kTable[(v >> 12) & 63];
    out += kTable[(v >> 6) & 63];
    out += kTable[v & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kTable[v >> 18];
    out += kTable[(v >> 12) & 63];
    out += i + 1 < in.size() ? kTable[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// "value" when the bytes are UTF-8 (JSON strings must be), else "value_base64".
void PutValue(json* j, std::string_view value) {
  try {
    json probe = std::string(value);
    (void)probe.dump();  // throws type_error 316 on invalid UTF-8
    (*j)["value"] = std::move(probe);
  } catch (const json::type_error&) {
    (*j)["value_base64"] = Base64(value);
  }
}

void EmitJson(const json& j) {
  // Keys and messages are UTF-8 in practice; never throw over a stray byte.
  std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n" << std::flush;
}

// Reports a failed operation; returns its exit code.
int Report(const rdkv::Status& s, const std::string& context) {
  bool condition = s.Is(rdkv::StatusCode::kNotFound) || s.Is(rdkv::StatusCode::kAlreadyExists) ||
                   s.Is(rdkv::StatusCode::kVersionMismatch);
  if (FLAGS_json) {
    EmitJson({{"ok", false},
              {"code", std::string(rdkv::StatusCodeName(s.code()))},
              {"message", s.message()}});
  }
  if (s.Is(rdkv::StatusCode::kNotFound) && !FLAGS_json) {
    std::cerr << "kvcli: " << context << ": not found\n";
  } else if (!FLAGS_json || !condition) {
    std::cerr << "kvcli: " << context << ": " << s.ToString() << "\n";
  }
  return condition ? kExitNo : kExitError;
}

// --- values ---

bool ReadFile(const std::string& path, std::string* out, std::string* error) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *error = "cannot open '" + path + "'";
    return false;
  }
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  if (f.bad()) {
    *error = "cannot read '" + path + "'";
    return false;
  }
  return true;
}

// The value argument: literal, @FILE, @@literal, or '-' (stdin).
bool ResolveValue(const std::string& arg, bool interactive, std::string* value,
                  std::string* error) {
  if (arg == "-") {
    if (interactive) {
      *error = "'-' (stdin) is not available in interactive mode";
      return false;
    }
    value->assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    return true;
  }
  if (arg.rfind("@@", 0) == 0) {
    *value = arg.substr(1);
    return true;
  }
  if (arg.size() > 1 && arg[0] == '@') return ReadFile(arg.substr(1), value, error);
  *value = arg;
  return true;
}

// --- arguments ---

// The server to contact first: --seed, else --server.
std::string Seed() { return FLAGS_seed.empty() ? FLAGS_server : FLAGS_seed; }

// A decimal number without sign, below 2^32.
bool ParseNumber(std::string_view text, uint32_t* out) {
  if (text.empty() || text.size() > 10) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > UINT32_MAX) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

// "3", "3,5,9", "0-7", "0-3,9": the shards, ascending, each once.
bool ParseShards(const std::string& text, std::vector<uint32_t>* out, std::string* error) {
  constexpr uint32_t kMostShards = 4096;  // the largest cluster's shard count
  std::vector<bool> seen(kMostShards, false);
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string_view part(text.data() + start,
                          (comma == std::string::npos ? text.size() : comma) - start);
    size_t dash = part.find('-');
    uint32_t first = 0, last = 0;
    bool ok = dash == std::string_view::npos ? ParseNumber(part, &first) && ParseNumber(part, &last)
                                             : ParseNumber(part.substr(0, dash), &first) &&
                                                   ParseNumber(part.substr(dash + 1), &last);
    if (!ok || first > last) {
      *error = "'" + std::string(part) + "' in SHARDS '" + text +
               "' is not a shard number or a range A-B (A <= B)";
      return false;
    }
    if (last >= kMostShards) {
      *error = "shard " + std::to_string(last) + " is beyond the largest shard count (" +
               std::to_string(kMostShards) + ")";
      return false;
    }
    for (uint32_t s = first; s <= last; ++s) seen[s] = true;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  out->clear();
  for (uint32_t s = 0; s < kMostShards; ++s) {
    if (seen[s]) out->push_back(s);
  }
  return true;
}

// --- the session ---

class Cli {
 public:
  explicit Cli(bool interactive) : interactive_(interactive) {}

  // Runs one command; returns the exit code.
  int Run(const std::vector<std::string>& args) {
    if (args.empty()) return kExitOk;
    const std::string& cmd = args[0];
    size_t n = args.size() - 1;
    auto usage = [&](const char* form) {
      std::cerr << "kvcli: usage: " << form << " (see kvcli --help)\n";
      if (FLAGS_json) {
        EmitJson({{"ok", false},
                  {"code", "InvalidArgument"},
                  {"message", std::string("usage: ") + form}});
      }
      return kExitError;
    };
    bool from_file = !FLAGS_value_file.empty() && !interactive_;
    if (cmd == "get") {
      if (n != 1) return usage("get KEY");
      return Get(args[1]);
    }
    if (cmd == "put" || cmd == "insert") {
      if (n != (from_file ? 1u : 2u)) {
        return usage(cmd == "put" ? "put KEY VALUE (or put KEY with --value_file)"
                                  : "insert KEY VALUE (or insert KEY with --value_file)");
      }
      std::string value;
      if (!Value(from_file ? "" : args[2], &value)) return kExitError;
      return Write(cmd, args[1], value, 0);
    }
    if (cmd == "cas") {
      if (n != (from_file ? 2u : 3u)) {
        return usage("cas KEY EXPECTED_VERSION VALUE (or without VALUE with --value_file)");
      }
      uint64_t expected = 0;
      try {
        size_t used = 0;
        expected = std::stoull(args[2], &used);
        if (used != args[2].size() || args[2][0] == '-') throw std::invalid_argument("");
      } catch (const std::exception&) {
        return usage("cas KEY EXPECTED_VERSION VALUE, EXPECTED_VERSION a number");
      }
      std::string value;
      if (!Value(from_file ? "" : args[3], &value)) return kExitError;
      return Write(cmd, args[1], value, expected);
    }
    if (cmd == "del" || cmd == "delete") {
      if (n != 1) return usage("del KEY");
      return Write("del", args[1], "", 0);
    }
    if (cmd == "mget") {
      if (n < 1) return usage("mget KEY...");
      return MultiGet(std::vector<std::string>(args.begin() + 1, args.end()));
    }
    if (cmd == "stats") {
      bool all = FLAGS_all || (n == 1 && args[1] == "--all");
      if (n != 0 && !(n == 1 && args[1] == "--all")) return usage("stats [--all]");
      return all ? StatsAll() : Stats();
    }
    if (cmd == "cluster") {
      if (n >= 1 && args[1] == "move") {
        constexpr const char* kMoveUsage =
            "cluster move SHARDS TO_SERVER_ID (SHARDS: 3, 3,5,9 or 0-7)";
        if (n != 3) return usage(kMoveUsage);
        std::vector<uint32_t> shards;
        uint32_t to = 0;
        std::string error;
        if (!ParseShards(args[2], &shards, &error) || !ParseNumber(args[3], &to)) {
          if (error.empty()) error = "TO_SERVER_ID '" + args[3] + "' is not a number";
          std::cerr << "kvcli: cluster move: " << error << "\n";
          return usage(kMoveUsage);
        }
        return Move(shards, to);
      }
      if (n != 0) return usage("cluster [move SHARDS TO_SERVER_ID]");
      return Cluster();
    }
    if (cmd == "snapshot") {
      if (n > 1) return usage("snapshot [NAME]");
      return Snapshot(n == 1 ? args[1] : std::string());
    }
    if (cmd == "ping") {
      if (n != 0) return usage("ping");
      return Ping();
    }
    if (cmd == "top") {
      if (n != 0) return usage("top (flags --interval, --iterations)");
      return Top();
    }
    if (cmd == "help") {
      if (interactive_) {
        std::cout << kCommandsHelp;
      } else {
        PrintHelp(std::cout);
      }
      return kExitOk;
    }
    std::cerr << "kvcli: unknown command '" << cmd << "' (see kvcli --help)\n";
    if (FLAGS_json) {
      EmitJson({{"ok", false}, {"code", "InvalidArgument"}, {"message", "unknown command " + cmd}});
    }
    return kExitError;
  }

 private:
  bool Value(const std::string& arg, std::string* value) {
    std::string error;
    bool ok = (FLAGS_value_file.empty() || interactive_)
                  ? ResolveValue(arg, interactive_, value, &error)
                  : ReadFile(FLAGS_value_file, value, &error);
    if (!ok) {
      std::cerr << "kvcli: value: " << error << "\n";
      if (FLAGS_json) EmitJson({{"ok", false}, {"code", "InvalidArgument"}, {"message", error}});
    }
    return ok;
  }

  // Connects on first use (so usage errors and `help` need no server).
  rdkv::Client* client(int* code) {
    if (client_ != nullptr) return client_.get();
    rdkv::ClientOptions o;
    o.seed = Seed();
    o.transport = FLAGS_transport;
    o.auth_token = FLAGS_auth_token;
    o.op_timeout = std::chrono::milliseconds(FLAGS_timeout_ms);
    o.connect_timeout = std::chrono::milliseconds(FLAGS_connect_timeout_ms);
    auto c = rdkv::Client::Connect(o);
    if (!c.ok()) {
      *code = Report(c.status(), "connect to " + Seed());
      return nullptr;
    }
    client_ = std::move(c).value();
    return client_.get();
  }

  int Get(const std::string& key) {
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    auto r = c->Get(key);
    if (!r.ok()) {
      if (r.status().Is(rdkv::StatusCode::kNotFound) && FLAGS_json) {
        EmitJson({{"ok", true}, {"key", key}, {"found", false}});
        return kExitNo;
      }
      return Report(r.status(), "get " + key);
    }
    if (FLAGS_json) {
      json j = {{"ok", true}, {"key", key}, {"found", true}, {"version", r->version}};
      PutValue(&j, r->value);
      EmitJson(j);
    } else {
      std::cout.write(r->value.data(), static_cast<std::streamsize>(r->value.size()));
      if (FLAGS_newline || interactive_) std::cout << "\n";
      std::cout << std::flush;
    }
    return kExitOk;
  }

  int Write(const std::string& op, const std::string& key, const std::string& value,
            uint64_t expected) {
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    rdkv::Result<uint64_t> r = rdkv::Status::Internal("unreached");
    if (op == "put") {
      r = c->Put(key, value);
    } else if (op == "insert") {
      r = c->Insert(key, value);
    } else if (op == "cas") {
      r = c->Cas(key, expected, value);
    } else {
      rdkv::Status s = c->Delete(key);
      if (s.ok()) {
        r = uint64_t{0};
      } else {
        r = s;
      }
    }
    if (!r.ok()) return Report(r.status(), op + " " + key);
    if (FLAGS_json) {
      json j = {{"ok", true}, {"op", op}, {"key", key}};
      if (op != "del") j["version"] = *r;
      EmitJson(j);
    } else if (op == "del") {
      std::cout << "OK\n";
    } else {
      std::cout << "OK version " << *r << "\n";
    }
    return kExitOk;
  }

  int MultiGet(const std::vector<std::string>& keys) {
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    std::vector<std::string_view> views(keys.begin(), keys.end());
    auto results = c->MultiGet(views);
    int worst = kExitOk;
    json arr = json::array();
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto& r = results[i];
      if (r.ok()) {
        if (FLAGS_json) {
          json j = {{"key", keys[i]}, {"found", true}, {"version", r->version}};
          PutValue(&j, r->value);
          arr.push_back(j);
        } else {
          std::cout << keys[i] << "\t" << r->value << "\n";
        }
      } else if (r.status().Is(rdkv::StatusCode::kNotFound)) {
        worst = std::max(worst, kExitNo);
        if (FLAGS_json) {
          arr.push_back({{"key", keys[i]}, {"found", false}});
        } else {
          std::cout << keys[i] << "\t(not found)\n";
        }
      } else {
        worst = kExitError;
        std::cerr << "kvcli: get " << keys[i] << ": " << r.status().ToString() << "\n";
        if (FLAGS_json) {
          arr.push_back({{"key", keys[i]},
                         {"error",
                          {{"code", std::string(rdkv::StatusCodeName(r.status().code()))},
                           {"message", r.status().message()}}}});
        } else {
          std::cout << keys[i] << "\t(error)\n";
        }
      }
    }
    if (FLAGS_json) EmitJson({{"ok", worst != kExitError}, {"results", arr}});
    std::cout << std::flush;
    return worst;
  }

  int Snapshot(const std::string& name) {
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    auto r = rdkv::Admin(*c).Snapshot(name);
    if (!r.ok()) return Report(r.status(), "snapshot");
    if (FLAGS_json) {
      json lines = json::array();
      std::string text = *r;
      for (size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
        std::string line = text.substr(pos, nl - pos);
        size_t sp = line.find(' ');
        lines.push_back({{"server", line.substr(0, sp)}, {"path", line.substr(sp + 1)}});
      }
      std::cout << json{{"ok", true}, {"snapshots", lines}}.dump() << "\n";
    } else {
      std::cout << *r;
    }
    return kExitOk;
  }

  int Stats() {
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    auto r = c->Stats();
    if (!r.ok()) return Report(r.status(), "stats");
    json j = json::parse(*r, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return Report(rdkv::Status::ProtocolError("the server's stats are not JSON"), "stats");
    }
    std::cout << j.dump(FLAGS_json ? -1 : 2, ' ', false, json::error_handler_t::replace) << "\n"
              << std::flush;
    return kExitOk;
  }

  static std::string ShardList(const std::vector<uint32_t>& shards) {
    std::string out;
    for (size_t i = 0; i < shards.size(); ++i) {
      size_t j = i;
      while (j + 1 < shards.size() && shards[j + 1] == shards[j] + 1) ++j;
      if (!out.empty()) out += ",";
      out += std::to_string(shards[i]);
      if (j > i) out += "-" + std::to_string(shards[j]);
      i = j;
    }
    return out.empty() ? "-" : out;
  }

  // Adds every numeric field of `from` (nested objects too) into `total`.
  static void SumInto(json* total, const json& from) {
    for (auto& [k, v] : from.items()) {
      if (v.is_object()) {
        if (!total->contains(k)) (*total)[k] = json::object();
        SumInto(&(*total)[k], v);
      } else if (v.is_number_integer()) {
        (*total)[k] = (total->contains(k) ? (*total)[k].get<int64_t>() : 0) + v.get<int64_t>();
      } else if (v.is_number_float()) {
        (*total)[k] = (total->contains(k) ? (*total)[k].get<double>() : 0.0) + v.get<double>();
      }
    }
  }

  int StatsAll() {
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    std::vector<rdkv::ServerInfo> servers = rdkv::Admin(*c).Servers(true);
    json per = json::array();
    json total = json::object();
    size_t reachable = 0;
    for (const rdkv::ServerInfo& s : servers) {
      json one = {{"id", s.id}, {"address", s.address}, {"reachable", s.reachable}};
      if (!s.reachable) {
        one["error"] = s.error;
      } else {
        json st = json::parse(s.stats, nullptr, /*allow_exceptions=*/false);
        if (st.is_object()) {
          ++reachable;
          SumInto(&total, st);
        }
        one["stats"] = st;
      }
      per.push_back(std::move(one));
    }
    json j = {{"servers", servers.size()},
              {"reachable", reachable},
              {"total", total},
              {"per_server", per}};
    std::cout << j.dump(FLAGS_json ? -1 : 2, ' ', false, json::error_handler_t::replace) << "\n"
              << std::flush;
    return reachable == servers.size() ? kExitOk : kExitError;
  }

  // --- top ---

  // One server's counters at one moment.
  struct TopSample {
    bool reachable = false;
    std::string error;
    std::map<std::string, uint64_t> ops;  // the stats' "ops" object
    uint64_t errors = 0, items = 0, used = 0, heap = 0, slots = 0;
  };

  static TopSample Sample(const rdkv::ServerInfo& s) {
    TopSample t;
    if (!s.reachable) {
      t.error = s.error;
      return t;
    }
    json st = json::parse(s.stats, nullptr, /*allow_exceptions=*/false);
    if (!st.is_object()) {
      t.error = "the server's stats are not JSON";
      return t;
    }
    t.reachable = true;
    auto num = [](const json& j, const char* k) -> uint64_t {
      return j.contains(k) && j[k].is_number_unsigned() ? j[k].get<uint64_t>() : 0;
    };
    if (st.contains("ops") && st["ops"].is_object()) {
      for (auto& [k, v] : st["ops"].items()) {
        if (v.is_number_unsigned()) t.ops[k] = v.get<uint64_t>();
      }
    }
    if (st.contains("errors") && st["errors"].is_object()) t.errors = num(st["errors"], "total");
    t.items = num(st, "items");
    t.used = num(st, "used_bytes");
    t.heap = num(st, "heap_bytes");
    t.slots = num(st, "index_buckets") * rdkv::kv::kSlotsPerBucket;
    return t;
  }

  static std::string Mib(uint64_t bytes) {
    char b[32];
    snprintf(b, sizeof b, "%.1f", bytes / (1024.0 * 1024.0));
    return b;
  }
  static std::string Percent(uint64_t part, uint64_t whole) {
    if (whole == 0) return "-";
    char b[16];
    snprintf(b, sizeof b, "%.1f%%", 100.0 * part / whole);
    return b;
  }

  int Top() {
    if (!(FLAGS_interval >= 0.1)) {
      std::cerr << "kvcli: top: --interval must be at least 0.1 (seconds)\n";
      return kExitError;
    }
    if (FLAGS_iterations < 0) {
      std::cerr << "kvcli: top: --iterations must be 0 (until interrupted) or more\n";
      return kExitError;
    }
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    rdkv::Admin admin(*c);
    const bool terminal = isatty(STDOUT_FILENO) == 1;
    // The write ops shown, in order (the stats' "ops" keys), with their column names.
    static constexpr std::pair<const char*, const char*> kOps[] = {{"put", "put/s"},
                                                                   {"insert", "ins/s"},
                                                                   {"delete", "del/s"},
                                                                   {"cas", "cas/s"},
                                                                   {"import", "imp/s"}};
    using Clock = std::chrono::steady_clock;
    std::map<uint32_t, TopSample> before;
    Clock::time_point t_before = Clock::now();
    for (const rdkv::ServerInfo& s : admin.Servers(true)) before[s.id] = Sample(s);
    const auto interval =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(FLAGS_interval));
    bool all_reachable = true;
    for (int it = 0; FLAGS_iterations == 0 || it < FLAGS_iterations; ++it) {
      std::this_thread::sleep_until(t_before + interval);
      std::vector<rdkv::ServerInfo> servers = admin.Servers(true);
      const Clock::time_point t_now = Clock::now();
      const double secs = std::max(1e-6, std::chrono::duration<double>(t_now - t_before).count());
      auto rate = [secs](uint64_t now, uint64_t was) {
        // A restarted server starts its counters again from 0.
        return static_cast<double>(now >= was ? now - was : now) / secs;
      };
      std::ostringstream o;
      char stamp[32];
      std::time_t wall = std::time(nullptr);
      std::tm tm{};
      localtime_r(&wall, &tm);
      std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
      size_t up = 0;
      for (const auto& s : servers) up += s.reachable;
      const uint64_t epoch = admin.map_epoch();
      o << "kvcli top  " << stamp << "  every " << FLAGS_interval << " s  "
        << (epoch == 0 ? std::string("standalone") : "map epoch " + std::to_string(epoch))
        << "  servers " << up << "/" << servers.size() << " up\n";
      char line[512];
      snprintf(line, sizeof line, "%-4s %-21s", "ID", "ADDRESS");
      o << line;
      for (const auto& op : kOps) {
        snprintf(line, sizeof line, " %9s", op.second);
        o << line;
      }
      snprintf(line, sizeof line, " %9s %9s %11s %9s %9s %7s %7s\n", "writes/s", "err/s", "items",
               "heap_MiB", "of_MiB", "heap%", "slots%");
      o << line;
      std::map<std::string, double> total_rate;
      double total_writes = 0, total_errors = 0;
      uint64_t total_items = 0, total_used = 0, total_heap = 0, total_slots = 0;
      std::map<uint32_t, TopSample> now_samples;
      for (const rdkv::ServerInfo& s : servers) {
        TopSample now = Sample(s);
        snprintf(line, sizeof line, "%-4u %-21s", s.id, s.address.c_str());
        o << line;
        if (!now.reachable) {
          all_reachable = false;
          o << " DOWN: " << now.error << "\n";
          now_samples[s.id] = std::move(now);
          continue;
        }
        const TopSample& was = before[s.id];
        double writes = 0;
        for (const auto& op : kOps) {
          double r = rate(now.ops[op.first], was.ops.count(op.first) ? was.ops.at(op.first) : 0);
          total_rate[op.first] += r;
          writes += r;
          snprintf(line, sizeof line, " %9.0f", r);
          o << line;
        }
        const double errs = rate(now.errors, was.errors);
        total_writes += writes;
        total_errors += errs;
        total_items += now.items;
        total_used += now.used;
        total_heap += now.heap;
        total_slots += now.slots;
        snprintf(line, sizeof line, " %9.0f %9.0f %11llu %9s %9s %7s %7s\n", writes, errs,
                 static_cast<unsigned long long>(now.items), Mib(now.used).c_str(),
                 Mib(now.heap).c_str(), Percent(now.used, now.heap).c_str(),
                 Percent(now.items, now.slots).c_str());
        o << line;
        now_samples[s.id] = std::move(now);
      }
      snprintf(line, sizeof line, "%-4s %-21s", "all", "(total)");
      o << line;
      for (const auto& op : kOps) {
        snprintf(line, sizeof line, " %9.0f", total_rate[op.first]);
        o << line;
      }
      snprintf(line, sizeof line, " %9.0f %9.0f %11llu %9s %9s %7s %7s\n", total_writes,
               total_errors, static_cast<unsigned long long>(total_items), Mib(total_used).c_str(),
               Mib(total_heap).c_str(), Percent(total_used, total_heap).c_str(),
               Percent(total_items, total_slots).c_str());
      o << line;
      // On a terminal: home, clear, then the view; elsewhere snapshots one after another.
      if (terminal) {
        std::cout << "\033[H\033[2J" << o.str() << std::flush;
      } else {
        std::cout << o.str() << "\n" << std::flush;
      }
      before = std::move(now_samples);
      t_before = t_now;
    }
    return all_reachable ? kExitOk : kExitError;
  }

  int Cluster() {
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    rdkv::Admin admin(*c);
    std::vector<rdkv::ServerInfo> servers = admin.Servers(false);
    const uint64_t epoch = admin.map_epoch();
    bool all_up = true;
    for (const auto& s : servers) all_up = all_up && s.reachable;
    if (FLAGS_json) {
      json arr = json::array();
      for (const auto& s : servers) {
        json one = {{"id", s.id},
                    {"address", s.address},
                    {"reachable", s.reachable},
                    {"shards", s.shards},
                    {"map_epoch", s.map_epoch}};
        if (!s.reachable) one["error"] = s.error;
        arr.push_back(std::move(one));
      }
      EmitJson(
          {{"ok", all_up}, {"map_epoch", epoch}, {"standalone", epoch == 0}, {"servers", arr}});
    } else {
      std::cout << (epoch == 0 ? std::string("standalone server")
                               : "cluster map epoch " + std::to_string(epoch))
                << "\n";
      for (const auto& s : servers) {
        std::cout << "server " << s.id << "  " << s.address << "  "
                  << (s.reachable ? "reachable" : "UNREACHABLE") << "  epoch " << s.map_epoch
                  << "  shards " << ShardList(s.shards) << " (" << s.shards.size() << ")";
        if (!s.reachable) std::cout << "  error: " << s.error;
        std::cout << "\n";
      }
      std::cout << std::flush;
    }
    return all_up ? kExitOk : kExitError;
  }

  int Move(const std::vector<uint32_t>& shards, uint32_t to) {
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    // Progress goes to stdout in text mode, to stderr with --json (stdout: one object).
    std::ostream& progress_out = FLAGS_json ? std::cerr : std::cout;
    // On a terminal the copy's progress lines ("  copy: ...") rewrite one line in place.
    const bool terminal = isatty(FLAGS_json ? STDERR_FILENO : STDOUT_FILENO) == 1;
    bool open_line = false;
    rdkv::Result<rdkv::MoveReport> r = rdkv::Admin(*c).MoveShards(
        shards, to, [&progress_out, terminal, &open_line](std::string_view line) {
          const bool copy_progress = line.substr(0, 8) == "  copy: ";
          if (terminal && copy_progress) {
            progress_out << "\r" << line << "\033[K" << std::flush;
            open_line = true;
            return;
          }
          if (open_line) progress_out << "\r\033[K";  // the next line replaces the progress
          open_line = false;
          progress_out << line << "\n" << std::flush;
        });
    if (open_line) progress_out << "\r\033[K" << std::flush;
    if (!r.ok()) return Report(r.status(), "cluster move");
    const rdkv::MoveReport& m = *r;
    const char* kStepNames[4] = {"install_on_old_owners", "copy", "install_on_new_owner_and_rest",
                                 "drop_old_copies"};
    if (FLAGS_json) {
      json steps = json::object();
      for (int i = 0; i < 4; ++i) steps[kStepNames[i]] = m.step_seconds[i];
      json j = {{"ok", true},
                {"to_server", m.to_server},
                {"from_epoch", m.from_epoch},
                {"to_epoch", m.to_epoch},
                {"moved", m.moved},
                {"skipped", m.skipped},
                {"items_copied", m.items_copied},
                {"bytes_copied", m.bytes_copied},
                {"items_dropped", m.items_dropped},
                {"step_seconds", steps},
                {"total_seconds", m.total_seconds}};
      if (!m.resumed.empty() || m.resumed_to_epoch != 0) {
        j["resumed"] = {{"shards", m.resumed},
                        {"from_epoch", m.resumed_from_epoch},
                        {"to_epoch", m.resumed_to_epoch}};
      }
      EmitJson(j);
      return kExitOk;
    }
    std::cout << "\n";
    if (m.resumed_to_epoch != 0) {
      std::cout << "finished an interrupted move: map epoch " << m.resumed_from_epoch << " -> "
                << m.resumed_to_epoch << ", shards " << ShardList(m.resumed) << "\n";
    }
    if (m.moved.empty()) {
      std::cout << "nothing to move: shards " << ShardList(m.skipped)
                << " already belong to server " << m.to_server << " (map epoch " << m.to_epoch
                << ")\n";
    } else {
      std::cout << "moved shards " << ShardList(m.moved) << " to server " << m.to_server
                << ": map epoch " << m.from_epoch << " -> " << m.to_epoch << "\n";
      if (!m.skipped.empty()) {
        std::cout << "skipped (already on server " << m.to_server << "): " << ShardList(m.skipped)
                  << "\n";
      }
    }
    char line[256];
    std::snprintf(line, sizeof(line),
                  "copied %llu items (%llu bytes), dropped %llu old copies\n"
                  "seconds: install on old owners %.3f, copy %.3f, install on new owner and "
                  "the rest %.3f, drop %.3f; total %.3f\n",
                  static_cast<unsigned long long>(m.items_copied),
                  static_cast<unsigned long long>(m.bytes_copied),
                  static_cast<unsigned long long>(m.items_dropped), m.step_seconds[0],
                  m.step_seconds[1], m.step_seconds[2], m.step_seconds[3], m.total_seconds);
    std::cout << line << std::flush;
    return kExitOk;
  }

  int Ping() {
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    auto t0 = std::chrono::steady_clock::now();
    rdkv::Status s = c->Ping();
    auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    if (!s.ok()) return Report(s, "ping");
    if (FLAGS_json) {
      EmitJson({{"ok", true}, {"server", Seed()}, {"rtt_us", us}});
    } else {
      std::cout << "PONG from " << Seed() << " in " << us / 1000.0 << " ms\n" << std::flush;
    }
    return kExitOk;
  }

  bool interactive_;
  std::unique_ptr<rdkv::Client> client_;
};

// Splits an interactive line like a shell would (quotes, backslash escapes). False on an
// unterminated quote.
bool Tokenize(const std::string& line, std::vector<std::string>* out) {
  out->clear();
  std::string cur;
  bool in_token = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (c == ' ' || c == '\t') {
      if (in_token) out->push_back(std::move(cur));
      cur.clear();
      in_token = false;
    } else if (c == '\'') {
      size_t end = line.find('\'', i + 1);
      if (end == std::string::npos) return false;
      cur += line.substr(i + 1, end - i - 1);
      i = end;
      in_token = true;
    } else if (c == '"') {
      in_token = true;
      for (++i;; ++i) {
        if (i >= line.size()) return false;
        if (line[i] == '"') break;
        if (line[i] == '\\' && i + 1 < line.size()) {
          char e = line[++i];
          cur += e == 'n' ? '\n' : e == 't' ? '\t' : e;
        } else {
          cur += line[i];
        }
      }
    } else if (c == '\\' && i + 1 < line.size()) {
      cur += line[++i];
      in_token = true;
    } else {
      cur += c;
      in_token = true;
    }
  }
  if (in_token) out->push_back(std::move(cur));
  return true;
}

int Interactive() {
  Cli cli(/*interactive=*/true);
  bool tty = isatty(STDIN_FILENO) != 0;
  std::string history_path;
  if (const char* home = std::getenv("HOME"); home != nullptr && tty) {
    history_path = std::string(home) + "/.kvcli_history";
    read_history(history_path.c_str());
  }
  std::string prompt = "rdkv " + Seed() + "> ";
  if (tty) std::cout << "kvcli: connected lazily to " << Seed() << "; type help or quit\n";
  int last = kExitOk;
  for (;;) {
    std::string line;
    if (tty) {
      char* raw = readline(prompt.c_str());
      if (raw == nullptr) {
        std::cout << "\n";
        break;
      }
      line = raw;
      std::free(raw);
      if (!line.empty()) {
        add_history(line.c_str());
        if (!history_path.empty()) append_history(1, history_path.c_str());
      }
    } else if (!std::getline(std::cin, line)) {
      break;
    }
    std::vector<std::string> args;
    if (!Tokenize(line, &args)) {
      std::cerr << "kvcli: unterminated quote\n";
      last = kExitError;
      continue;
    }
    if (args.empty()) continue;
    if (args[0] == "quit" || args[0] == "exit") break;
    last = cli.Run(args);
  }
  if (!history_path.empty()) history_truncate_file(history_path.c_str(), 1000);
  return last;  // like a shell: the status of the last command
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-h" || a == "-help" || a == "--helpfull") {
      PrintHelp(std::cout);
      return kExitOk;
    }
  }
  gflags::SetUsageMessage("command-line client of the rdkv key-value store (kvcli --help)");
  gflags::SetVersionString("0.1.0");
  // Arguments after "--" are never flags. (gflags would move them before the others.)
  std::vector<std::string> after_dashes;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--") {
      after_dashes.assign(argv + i + 1, argv + argc);
      argc = i;
      break;
    }
  }
  gflags::ParseCommandLineFlags(&argc, &argv, /*remove_flags=*/true);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = FLAGS_verbose ? 0 : 2;  // the library's INFO/WARNING lines only on request
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_timeout_ms <= 0 || FLAGS_connect_timeout_ms <= 0) {
    std::cerr << "kvcli: --timeout_ms and --connect_timeout_ms must be positive\n";
    return kExitError;
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  args.insert(args.end(), after_dashes.begin(), after_dashes.end());
  if (args.empty()) return Interactive();
  Cli cli(/*interactive=*/false);
  return cli.Run(args);
}
