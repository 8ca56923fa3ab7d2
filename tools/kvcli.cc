// kvcli: the rdkv command-line client. One command per invocation, or an interactive shell
// (GNU readline: line editing, history) when no command is given. `kvcli --help` says it all.
//
// Exit status: 0 success (GET: found), 1 not found or condition failed (key exists on insert,
// version mismatch on cas, some key missing in mget), 2 error (usage, connection, server).
#include <fcntl.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

#include "common/cluster/etcd_map.h"
#include "common/etcd/etcd_client.h"
#include "common/kv/layout.h"
#include "common/kv/limits.h"
#include "common/util/cli_flags.h"
#include "common/util/json_bounded.h"
#include "common/util/latency_json.h"
#include "common/util/secret.h"
#include "rdkv/admin.h"
#include "rdkv/client.h"

DEFINE_string(server, "127.0.0.1:7400",
              "The kvserver to talk to, as host:port (in a cluster: "
              "any server, the seed).");
DEFINE_string(seed, "",
              "Same as --server (the name cluster commands use); wins when both are "
              "given.");
DEFINE_string(etcd, "",
              "etcd endpoints (host:port[,...]) of a cluster whose map lives in etcd: without "
              "--seed/--server, kvcli finds a server there; `cluster import-map` needs it.");
DEFINE_string(cluster_name, "rdkv", "The cluster's name in etcd (keys under /rdkv/NAME/).");
DEFINE_string(etcd_cacert, "",
              "With https:// --etcd endpoints: the CA certificate (PEM) that signed etcd's "
              "certificate (default: the system's CA store).");
DEFINE_string(etcd_cert, "",
              "With https:// --etcd endpoints: this process's client certificate (PEM) for an "
              "etcd run with --client-cert-auth (with --etcd_key).");
DEFINE_string(etcd_key, "", "The private key (PEM) of --etcd_cert.");

DEFINE_int32(replication_factor, 0,
             "cluster import-map: give every shard R replicas (its owner, then the next R-1 "
             "servers of the map) when the file has no \"replicas\"; 0 keeps the file's.");
DEFINE_string(transport, "auto",
              "auto (verbs when an RDMA device with an active port exists, else tcp), verbs, "
              "or tcp. Must match what the server uses.");
// Secrets (docs/security.md): from a file or the environment, never the command line.
DEFINE_string(auth_token_file, "",
              "File holding the servers' data secret (else $RDKV_AUTH_TOKEN).");
DEFINE_string(admin_token_file, "",
              "File holding the servers' admin secret, for admin commands (else "
              "$RDKV_ADMIN_TOKEN). Without it admin commands work only on loopback servers "
              "that have no admin secret.");
DEFINE_string(auth_token, "",
              "Refused (a secret here is visible in ps): use --auth_token_file or "
              "$RDKV_AUTH_TOKEN.");
// TLS (tcp only; docs/security.md "TLS (tcp)").
DEFINE_string(tls_ca_file, "",
              "PEM CA that signed the servers' certificates: turns TLS on (for servers started "
              "with --tls_cert_file). Each server is verified by chain and by its address.");
DEFINE_string(tls_cert_file, "",
              "PEM client certificate, for servers with --tls_require_client_cert.");
DEFINE_string(tls_key_file, "", "PEM private key of --tls_cert_file.");
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
DEFINE_bool(base64, false,
            "KEY arguments, and literal VALUE arguments, are base64: how --json prints keys "
            "and values that are not UTF-8 (\"key_base64\", \"value_base64\"), so any bytes "
            "round-trip.");

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
                               is absent; its line reads KEY<TAB>(not found), which a value
                               could too). For scripts use --json, where a missing key is
                               "found":false and cannot be taken for a value.
  stats                        The server's statistics (JSON); in a cluster the totals over
                               every server and each server's own ("total", "per_server").
                               "latency": count, p50_us, p99_us per op since the server
                               started (--json adds the histogram's buckets).
  stats --all                  Every server (standalone: the one), each with its statistics or
                               its error, and the totals.
  cluster                      The cluster's servers: id, address, reachable or not (why),
                               shards owned in the map, map epoch each reports.
  cluster import-map FILE      With --etcd: store FILE (a cluster map) as the cluster's map in
                               etcd (only when it has none); servers started with --etcd read
                               it from there, and every later change goes through etcd.
  cluster promote SHARD SERVER_ID
                               Make SERVER_ID, an in-sync backup of SHARD, its primary (the
                               old primary becomes a backup); writes pause for about a lease.
  cluster add-replica SHARD SERVER_ID
                               Add SERVER_ID as a replica of SHARD: it joins (gets every new
                               write), the shard's items are copied while writes go on, then
                               the request ids of its recent writes (so that retries get their
                               first answers there), then it is in sync. Run again to resume
                               after a failure.
  cluster remove-replica SHARD SERVER_ID
                               Remove backup SERVER_ID from SHARD and drop its copy.
  cluster drain SERVER_ID      Promote an in-sync backup of every shard SERVER_ID is primary of
                               (maintenance: it keeps its data as a backup; no failover).
  cluster events               With --etcd: the failover coordinator's decisions, elections
                               and copies, oldest first (docs/design.md "Failover").
  cluster move SHARDS TO_SERVER_ID
                               (Replicated cluster: each shard moves as add-replica, promote,
                               remove-replica, serving GETs and writes throughout; a target
                               that is already a backup is refused: use cluster promote.)
                               Move shards (3, 3,5,9 or 0-7) to server TO_SERVER_ID in one
                               command: the map (epoch + 1) goes to the old owners, the items
                               and the request ids of recent writes are copied, the map goes
                               to the new owner and every other server, the old copies are
                               dropped. Prints each step, the
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
                               count), errors/s, write latency p50/p99 in microseconds over
                               the interval (the servers' histograms, every write op), items,
                               heap used/total, index slot use, and a total line. On a terminal it redraws in place (Ctrl-C ends it);
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
("key_base64" / "value_base64" instead when the bytes are not UTF-8; give such keys and
literal values back with --base64); writes -> {"ok":true,"op":...,"key":K,
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

// Decodes standard base64 (padding optional, no whitespace); false on anything else.
bool FromBase64(std::string_view in, std::string* out) {
  auto sextet = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  while (!in.empty() && in.back() == '=' && in.size() % 4 != 1) in.remove_suffix(1);
  if (in.size() % 4 == 1) return false;
  out->clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v = sextet(c);
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return true;
}

bool IsUtf8(std::string_view s) {
  try {
    (void)json(std::string(s)).dump();  // throws type_error 316 on invalid UTF-8
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

// `name` ("key", "value") when the bytes are UTF-8 (JSON strings must be), else
// `name`_base64: never lossy.
void PutBytes(json* j, const std::string& name, std::string_view bytes) {
  if (IsUtf8(bytes)) {
    (*j)[name] = std::string(bytes);
  } else {
    (*j)[name + "_base64"] = Base64(bytes);
  }
}
void PutValue(json* j, std::string_view value) { PutBytes(j, "value", value); }
void PutKey(json* j, std::string_view key) { PutBytes(j, "key", key); }

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

// Reads `fd` to its end, at most kv::kMaxValueBytes (the largest value any server accepts):
// the limit applies while reading, so an endless source (/dev/zero) stops there.
bool ReadBounded(int fd, const std::string& what, std::string* out, std::string* error) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    *error = "cannot stat " + what + ": " + std::strerror(errno);
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    *error = what + " is a directory; give a file";
    return false;
  }
  if (S_ISBLK(st.st_mode)) {
    *error = what + " is a block device; give a file";
    return false;
  }
  constexpr uint64_t kLimit = rdkv::kv::kMaxValueBytes;
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > kLimit) {
    *error = what + " holds " + std::to_string(st.st_size) + " bytes, more than the limit of " +
             std::to_string(kLimit) + " bytes on a value";
    return false;
  }
  out->clear();
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = "cannot read " + what + ": " + std::strerror(errno);
      return false;
    }
    if (n == 0) return true;
    if (out->size() + static_cast<size_t>(n) > kLimit) {
      *error = what + " gives more than the limit of " + std::to_string(kLimit) +
               " bytes on a value (stopped reading there)";
      return false;
    }
    out->append(buf, static_cast<size_t>(n));
  }
}

bool ReadFile(const std::string& path, std::string* out, std::string* error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = "cannot open '" + path + "': " + std::strerror(errno);
    return false;
  }
  bool ok = ReadBounded(fd, "'" + path + "'", out, error);
  ::close(fd);
  return ok;
}

// The value argument: literal (base64 with --base64), @FILE, @@literal, or '-' (stdin).
bool ResolveValue(const std::string& arg, bool interactive, std::string* value,
                  std::string* error) {
  if (arg == "-") {
    if (interactive) {
      *error = "'-' (stdin) is not available in interactive mode";
      return false;
    }
    return ReadBounded(STDIN_FILENO, "stdin", value, error);
  }
  if (arg.size() > 1 && arg[0] == '@' && arg[1] != '@')
    return ReadFile(arg.substr(1), value, error);
  std::string literal = arg.rfind("@@", 0) == 0 ? arg.substr(1) : arg;
  if (FLAGS_base64) {
    if (!FromBase64(literal, value)) {
      *error = "'" + literal + "' is not base64 (--base64)";
      return false;
    }
    return true;
  }
  *value = std::move(literal);
  return true;
}

// --- arguments ---

// The server to contact first: --seed, else --server.
std::string Seed() { return FLAGS_seed.empty() ? FLAGS_server : FLAGS_seed; }
// Whether the seed was given (else, with --etcd, the registered servers are the seeds).
bool SeedGiven() {
  return !FLAGS_seed.empty() || !gflags::GetCommandLineFlagInfoOrDie("server").is_default;
}

// The etcd client of --etcd; kInvalidArgument for a bad flag value.
rdkv::Result<std::unique_ptr<rdkv::etcd::EtcdClient>> EtcdFromFlags() {
  RDKV_ASSIGN_OR_RETURN(std::vector<std::string> endpoints, rdkv::etcd::ParseEndpoints(FLAGS_etcd));
  rdkv::etcd::EtcdOptions eo;
  eo.endpoints = std::move(endpoints);
  eo.ca_file = FLAGS_etcd_cacert;
  eo.cert_file = FLAGS_etcd_cert;
  eo.key_file = FLAGS_etcd_key;
  return rdkv::etcd::EtcdClient::Create(eo);
}

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
  int Run(std::vector<std::string> args) {
    if (args.empty()) return kExitOk;
    const std::string cmd = args[0];
    size_t n = args.size() - 1;
    auto usage = [&](const std::string& form) {
      std::cerr << "kvcli: usage: " << form << " (see kvcli --help)\n";
      if (FLAGS_json) {
        EmitJson({{"ok", false}, {"code", "InvalidArgument"}, {"message", "usage: " + form}});
      }
      return kExitError;
    };
    if (FLAGS_base64 && n >= 1 &&
        (cmd == "get" || cmd == "put" || cmd == "insert" || cmd == "cas" || cmd == "del" ||
         cmd == "delete" || cmd == "mget")) {
      for (size_t i = 1; i <= (cmd == "mget" ? n : 1); ++i) {
        std::string key;
        if (!FromBase64(args[i], &key)) {
          return usage("--base64: KEY '" + args[i] + "' is not base64");
        }
        args[i] = std::move(key);
      }
    }
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
      if (n >= 1 && args[1] == "import-map") {
        if (n != 2) return usage("cluster import-map FILE (with --etcd)");
        return ImportMapToEtcd(args[2]);
      }
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
      if (n >= 1 && args[1] == "drain") {
        uint32_t server = 0;
        if (n != 2 || !ParseNumber(args[2], &server)) return usage("cluster drain SERVER_ID");
        return Drain(server);
      }
      if (n >= 1 && args[1] == "events") {
        if (n != 1) return usage("cluster events (with --etcd)");
        return Events();
      }
      if (n >= 1 &&
          (args[1] == "promote" || args[1] == "add-replica" || args[1] == "remove-replica")) {
        const std::string what = "cluster " + args[1] + " SHARD SERVER_ID";
        uint32_t shard = 0, server = 0;
        if (n != 3 || !ParseNumber(args[2], &shard) || !ParseNumber(args[3], &server)) {
          return usage(what.c_str());
        }
        return ChangeReplicas(args[1], shard, server);
      }
      if (n != 0) {
        return usage(
            "cluster [move SHARDS TO_SERVER_ID | promote|add-replica|remove-replica SHARD "
            "SERVER_ID | drain SERVER_ID | events]");
      }
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
    // Secrets from files or the environment (docs/security.md).
    auto data =
        rdkv::LoadSecret(FLAGS_auth_token_file, "RDKV_AUTH_TOKEN", FLAGS_auth_token, "auth_token");
    auto admin = rdkv::LoadSecret(FLAGS_admin_token_file, "RDKV_ADMIN_TOKEN", "", "admin_token");
    if (!data.ok() || !admin.ok()) {
      *code = Report(!data.ok() ? data.status() : admin.status(), "read the secret");
      return nullptr;
    }
    o.auth_token = std::move(data).value();
    o.admin_token = std::move(admin).value();
    o.tls.ca_file = FLAGS_tls_ca_file;
    o.tls.cert_file = FLAGS_tls_cert_file;
    o.tls.key_file = FLAGS_tls_key_file;
    o.op_timeout = std::chrono::milliseconds(FLAGS_timeout_ms);
    o.connect_timeout = std::chrono::milliseconds(FLAGS_connect_timeout_ms);
    std::vector<std::string> seeds = {Seed()};
    if (!FLAGS_etcd.empty() && !SeedGiven()) {
      // The servers registered in etcd, tried in turn.
      auto etcd = EtcdFromFlags();
      rdkv::Result<std::vector<std::string>> found =
          etcd.ok() ? rdkv::cluster::RegisteredAddresses(**etcd, FLAGS_cluster_name)
                    : rdkv::Result<std::vector<std::string>>(etcd.status());
      if (!found.ok()) {
        *code = Report(found.status(),
                       "find the servers of cluster '" + FLAGS_cluster_name + "' in etcd");
        return nullptr;
      }
      if (found->empty()) {
        *code = Report(rdkv::Status::Unavailable("no server of cluster '" + FLAGS_cluster_name +
                                                 "' is registered in etcd"),
                       "find a server");
        return nullptr;
      }
      seeds = std::move(found).value();
    }
    rdkv::Result<std::unique_ptr<rdkv::Client>> c = rdkv::Status::Unavailable("no seed");
    for (const std::string& seed : seeds) {
      o.seed = seed;
      c = rdkv::Client::Connect(o);
      if (c.ok()) break;
    }
    if (!c.ok()) {
      *code = Report(c.status(), "connect to " + o.seed);
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
        json j = {{"ok", true}, {"found", false}};
        PutKey(&j, key);
        EmitJson(j);
        return kExitNo;
      }
      return Report(r.status(), "get " + key);
    }
    if (FLAGS_json) {
      json j = {{"ok", true}, {"found", true}, {"version", r->version}};
      PutKey(&j, key);
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
      json j = {{"ok", true}, {"op", op}};
      PutKey(&j, key);
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
          json j = {{"found", true}, {"version", r->version}};
          PutKey(&j, keys[i]);
          PutValue(&j, r->value);
          arr.push_back(j);
        } else {
          std::cout << keys[i] << "\t" << r->value << "\n";
        }
      } else if (r.status().Is(rdkv::StatusCode::kNotFound)) {
        worst = std::max(worst, kExitNo);
        if (FLAGS_json) {
          json j = {{"found", false}};
          PutKey(&j, keys[i]);
          arr.push_back(j);
        } else {
          std::cout << keys[i] << "\t(not found)\n";
        }
      } else {
        worst = kExitError;
        std::cerr << "kvcli: get " << keys[i] << ": " << r.status().ToString() << "\n";
        if (FLAGS_json) {
          json j = {{"error",
                     {{"code", std::string(rdkv::StatusCodeName(r.status().code()))},
                      {"message", r.status().message()}}}};
          PutKey(&j, keys[i]);
          arr.push_back(j);
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
      std::cout << json{{"ok", true}, {"snapshots", lines}}.dump(-1, ' ', false,
                                                                 json::error_handler_t::replace)
                << "\n";
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
    json j = rdkv::ParseJsonBounded(*r);
    if (j.is_discarded()) {
      return Report(rdkv::Status::ProtocolError("the server's stats are not JSON"), "stats");
    }
    if (!FLAGS_json) WithoutBuckets(&j);
    std::cout << j.dump(FLAGS_json ? -1 : 2, ' ', false, json::error_handler_t::replace) << "\n"
              << std::flush;
    return kExitOk;
  }

  // For people: a stats object's "latency" keeps count, p50_us and p99_us per op; its bucket
  // counts and bounds (what --json prints, for programs) go.
  // Every "latency" object in `j` (a cluster's totals and per-server stats too).
  static void WithoutBuckets(json* j) {
    if (j->is_array()) {
      for (json& v : *j) WithoutBuckets(&v);
      return;
    }
    if (!j->is_object()) return;
    for (auto& [k, v] : j->items()) {
      if (k != "latency" || !v.is_object()) {
        WithoutBuckets(&v);
        continue;
      }
      v.erase("bounds_us");
      if (v.contains("ops") && v["ops"].is_object()) {
        for (auto& [op, one] : v["ops"].items()) {
          if (one.is_object()) one.erase("buckets");
        }
      }
    }
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
        json st = rdkv::ParseJsonBounded(s.stats);
        if (st.is_object()) {
          ++reachable;
          rdkv::SumStats(&total, st);
          one["stats"] = st;
        } else {
          one["error"] = "the server's stats are not JSON of the expected shape";
        }
      }
      per.push_back(std::move(one));
    }
    if (!FLAGS_json) {
      WithoutBuckets(&total);
      WithoutBuckets(&per);
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
    json latency;  // the stats' "latency" (common/util/latency_json.h)
  };

  static TopSample Sample(const rdkv::ServerInfo& s) {
    TopSample t;
    if (!s.reachable) {
      t.error = s.error;
      return t;
    }
    json st = rdkv::ParseJsonBounded(s.stats);
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
    if (st.contains("latency")) t.latency = st["latency"];
    return t;
  }

  // The write latency of an interval (the difference of two samples' histograms, every write
  // op merged): per-bucket counts, and the bounds they go with (empty when the server sends
  // none).
  struct TopLatency {
    std::vector<double> bounds_us;
    std::vector<uint64_t> counts;
    void Add(const TopLatency& other) {
      if (bounds_us.empty())
        *this = other;
      else if (other.bounds_us == bounds_us) {
        for (size_t i = 0; i < counts.size() && i < other.counts.size(); ++i) {
          counts[i] += other.counts[i];
        }
      }
    }
    // "p50 p99" cells in microseconds; "-" when no write was answered in the interval.
    std::string Cells() const {
      uint64_t n = 0;
      for (uint64_t c : counts) n += c;
      char b[64];
      if (n == 0) {
        snprintf(b, sizeof b, " %9s %9s", "-", "-");
      } else {
        snprintf(b, sizeof b, " %9.0f %9.0f", rdkv::HistogramQuantile(bounds_us, counts, 0.5),
                 rdkv::HistogramQuantile(bounds_us, counts, 0.99));
      }
      return b;
    }
  };
  static TopLatency WriteLatency(const TopSample& now, const TopSample& was) {
    static const std::vector<std::string> kWrites = {"put", "insert", "delete", "cas", "import"};
    TopLatency l;
    l.counts = rdkv::LatencyBucketsSince(now.latency, was.latency, kWrites);
    if (!l.counts.empty()) l.bounds_us = rdkv::LatencyBounds(now.latency);
    return l;
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
    if (!(FLAGS_interval >= 0.1 && FLAGS_interval <= 86400)) {  // NaN and inf fail too
      std::cerr << "kvcli: top: --interval must be a number within 0.1..86400 (seconds)\n";
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
      snprintf(line, sizeof line, " %9s %9s %9s %9s %11s %9s %9s %7s %7s\n", "writes/s", "err/s",
               "wr_p50_us", "wr_p99_us", "items", "heap_MiB", "of_MiB", "heap%", "slots%");
      o << line;
      std::map<std::string, double> total_rate;
      double total_writes = 0, total_errors = 0;
      TopLatency total_latency;
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
        const TopLatency latency = WriteLatency(now, was);
        total_latency.Add(latency);
        total_writes += writes;
        total_errors += errs;
        total_items += now.items;
        total_used += now.used;
        total_heap += now.heap;
        total_slots += now.slots;
        snprintf(line, sizeof line, " %9.0f %9.0f%s %11llu %9s %9s %7s %7s\n", writes, errs,
                 latency.Cells().c_str(), static_cast<unsigned long long>(now.items),
                 Mib(now.used).c_str(), Mib(now.heap).c_str(), Percent(now.used, now.heap).c_str(),
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
      snprintf(line, sizeof line, " %9.0f %9.0f%s %11llu %9s %9s %7s %7s\n", total_writes,
               total_errors, total_latency.Cells().c_str(),
               static_cast<unsigned long long>(total_items), Mib(total_used).c_str(),
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
                    {"backup_shards", s.backup_shards},
                    {"joining_shards", s.joining_shards},
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
        if (!s.backup_shards.empty()) {
          std::cout << "  backup of " << ShardList(s.backup_shards) << " ("
                    << s.backup_shards.size() << ")";
        }
        if (!s.joining_shards.empty()) {
          std::cout << "  joining " << ShardList(s.joining_shards) << " ("
                    << s.joining_shards.size() << ", catching up)";
        }
        if (!s.reachable) std::cout << "  error: " << s.error;
        std::cout << "\n";
      }
      std::cout << std::flush;
    }
    return all_up ? kExitOk : kExitError;
  }

  int ImportMapToEtcd(const std::string& file) {
    if (FLAGS_etcd.empty()) {
      std::cerr << "kvcli: cluster import-map needs --etcd=host:port[,...]\n";
      return kExitError;
    }
    rdkv::Result<rdkv::cluster::ClusterMap> map = rdkv::cluster::LoadClusterMap(file);
    if (!map.ok()) return Report(map.status(), "cluster import-map");
    const uint32_t most =
        static_cast<uint32_t>(std::min<size_t>(map->servers.size(), rdkv::cluster::kMaxReplicas));
    const uint32_t has = static_cast<uint32_t>(map->MaxReplicas());
    if (FLAGS_replication_factor > 0) {
      const uint32_t r = static_cast<uint32_t>(FLAGS_replication_factor);
      if (r > most) {
        std::cerr << "kvcli: --replication_factor=" << r << " is more than the map's "
                  << map->servers.size() << " servers (or 5)\n";
        return kExitError;
      }
      if (has > 1 && r < has) {
        std::cerr << "kvcli: " << file << " already has shards with " << has
                  << " replicas; --replication_factor=" << r
                  << " would be below them (give at least " << has << ", or leave it out)\n";
        return kExitError;
      }
      // Without replicas: backups assigned now. With them: the sets are kept, and the
      // coordinator adds replicas to the shards below r.
      if (has <= 1) map->AssignBackups(r);
      map->replication_factor = r;
    } else if (map->replication_factor > most) {
      std::cerr << "kvcli: " << file << " says replication_factor " << map->replication_factor
                << ", more than its " << map->servers.size() << " servers (or 5)\n";
      return kExitError;
    } else if (map->replication_factor == 0 && has > 1) {
      // Replica sets without a factor: kvcoord would never restore a lost replica.
      map->replication_factor = has;
      std::cerr << "kvcli: " << file << " has replica sets but no replication_factor: using " << has
                << " (its largest set), which kvcoord restores after a failure; give "
                   "--replication_factor to choose\n";
    }
    auto etcd = EtcdFromFlags();
    if (!etcd.ok()) return Report(etcd.status(), "cluster import-map: --etcd");
    rdkv::Status s = rdkv::cluster::ImportMap(**etcd, FLAGS_cluster_name, *map);
    if (!s.ok()) return Report(s, "cluster import-map");
    if (FLAGS_json) {
      EmitJson({{"ok", true},
                {"cluster", FLAGS_cluster_name},
                {"epoch", map->epoch},
                {"key", rdkv::cluster::MapKey(FLAGS_cluster_name)}});
    } else {
      std::cout << "imported map epoch " << map->epoch << " (" << map->servers.size()
                << " servers, " << map->shards << " shards, R=" << map->MaxReplicas()
                << ") into etcd as " << rdkv::cluster::MapKey(FLAGS_cluster_name)
                << "; start the servers with --etcd\n";
    }
    return kExitOk;
  }

  // Every shard `server` is primary of gets an in-sync backup as primary (the backup that is
  // primary of the fewest shards), one promotion at a time.
  int Drain(uint32_t server) {
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    rdkv::Admin admin(*c);
    std::vector<rdkv::ServerInfo> servers = admin.Servers(/*with_stats=*/false);
    const rdkv::ServerInfo* target = nullptr;
    for (const rdkv::ServerInfo& s : servers) {
      if (s.id == server) target = &s;
    }
    if (target == nullptr) {
      return Report(rdkv::Status::InvalidArgument("server " + std::to_string(server) +
                                                  " is not in the cluster map"),
                    "cluster drain");
    }
    std::map<uint32_t, size_t> primaries;
    for (const rdkv::ServerInfo& s : servers) primaries[s.id] = s.shards.size();
    std::ostream& out = FLAGS_json ? std::cerr : std::cout;
    json moved = json::array();
    for (uint32_t shard : target->shards) {
      std::optional<uint32_t> best;
      for (const rdkv::ServerInfo& s : servers) {
        if (s.id == server || !s.reachable) continue;
        if (std::find(s.backup_shards.begin(), s.backup_shards.end(), shard) ==
            s.backup_shards.end()) {
          continue;
        }
        if (!best || primaries[s.id] < primaries[*best]) best = s.id;
      }
      if (!best) {
        return Report(rdkv::Status::InvalidArgument(
                          "shard " + std::to_string(shard) + " has no reachable in-sync backup: " +
                          "add one (cluster add-replica) or move the shard (cluster move)"),
                      "cluster drain " + std::to_string(server));
      }
      rdkv::Result<rdkv::ReplicaReport> r =
          admin.Promote(shard, *best, [&out](std::string_view line) { out << line << "\n"; });
      if (!r.ok())
        return Report(r.status(), "cluster drain: promote shard " + std::to_string(shard));
      ++primaries[*best];
      out << "shard " << shard << ": server " << *best << " is its primary (map epoch "
          << r->to_epoch << ")\n"
          << std::flush;
      moved.push_back({{"shard", shard}, {"primary", *best}, {"epoch", r->to_epoch}});
    }
    if (FLAGS_json) {
      EmitJson({{"ok", true}, {"server", server}, {"promoted", moved}});
    } else {
      std::cout << "server " << server << " is primary of no shard now (" << target->shards.size()
                << " promoted)\n";
    }
    return kExitOk;
  }

  int Events() {
    if (FLAGS_etcd.empty()) {
      std::cerr << "kvcli: cluster events needs --etcd=host:port[,...]\n";
      return kExitError;
    }
    auto etcd = EtcdFromFlags();
    if (!etcd.ok()) return Report(etcd.status(), "cluster events: --etcd");
    const std::string prefix = "/rdkv/" + FLAGS_cluster_name + "/events/";
    rdkv::Result<rdkv::etcd::RangeResult> got = (*etcd)->GetPrefix(prefix);
    if (!got.ok()) return Report(got.status(), "cluster events");
    json all = json::array();
    for (const rdkv::etcd::KeyValue& kv : got->kvs) {
      json e = rdkv::ParseJsonBounded(kv.value);
      if (!e.is_object()) continue;
      if (FLAGS_json) {
        all.push_back(e);
        continue;
      }
      // Fields of another type read as empty (value() would throw on them).
      auto text = [&e](const char* name) {
        auto it = e.find(name);
        return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
      };
      auto time = e.find("time_us");
      const uint64_t us =
          time != e.end() && time->is_number_unsigned() ? time->get<uint64_t>() : uint64_t{0};
      const std::time_t secs = static_cast<std::time_t>(us / 1000000);
      std::tm tm{};
      gmtime_r(&secs, &tm);
      char when[32];
      std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
      std::printf("%s.%03u UTC  %-10s %-12s %s\n", when, static_cast<unsigned>(us / 1000 % 1000),
                  text("kind").c_str(), text("coordinator").c_str(), text("text").c_str());
    }
    if (FLAGS_json) EmitJson({{"ok", true}, {"events", all}});
    if (!FLAGS_json && got->kvs.empty()) {
      std::cout << "no events for cluster '" << FLAGS_cluster_name
                << "' (no failover coordinator has run)\n";
    }
    return kExitOk;
  }

  int ChangeReplicas(const std::string& what, uint32_t shard, uint32_t server) {
    int code = kExitError;
    rdkv::Client* c = client(&code);
    if (c == nullptr) return code;
    std::ostream& progress_out = FLAGS_json ? std::cerr : std::cout;
    auto progress = [&progress_out](std::string_view line) {
      progress_out << line << "\n" << std::flush;
    };
    rdkv::Admin admin(*c);
    rdkv::Result<rdkv::ReplicaReport> r = what == "promote" ? admin.Promote(shard, server, progress)
                                          : what == "add-replica"
                                              ? admin.AddReplica(shard, server, progress)
                                              : admin.RemoveReplica(shard, server, progress);
    if (!r.ok()) return Report(r.status(), "cluster " + what);
    if (FLAGS_json) {
      EmitJson({{"ok", true},
                {"shard", shard},
                {"server", server},
                {"from_epoch", r->from_epoch},
                {"to_epoch", r->to_epoch},
                {"items_copied", r->items_copied},
                {"bytes_copied", r->bytes_copied},
                {"ids_copied", r->ids_copied},
                {"items_dropped", r->items_dropped},
                {"copy_seconds", r->copy_seconds},
                {"seconds", r->seconds}});
    } else {
      std::cout << "cluster " << what << " shard " << shard << " server " << server
                << ": map epoch " << r->from_epoch << " -> " << r->to_epoch;
      if (r->items_copied > 0 || r->ids_copied > 0) {
        std::cout << ", " << r->items_copied << " items and " << r->ids_copied
                  << " request ids copied in " << r->copy_seconds << " s";
      }
      std::cout << " (" << r->seconds << " s)\n" << std::flush;
    }
    return kExitOk;
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
                {"ids_copied", m.ids_copied},
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
    char line[320];
    std::snprintf(line, sizeof(line),
                  "copied %llu items (%llu bytes) and %llu request ids, dropped %llu old "
                  "copies\n"
                  "seconds: install on old owners %.3f, copy %.3f, install on new owner and "
                  "the rest %.3f, drop %.3f; total %.3f\n",
                  static_cast<unsigned long long>(m.items_copied),
                  static_cast<unsigned long long>(m.bytes_copied),
                  static_cast<unsigned long long>(m.ids_copied),
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
  // gflags would accept every flag linked in and exit 1 (our "not found") on a bad one.
  if (std::string bad = rdkv::cli::CheckCommandLine(argc, argv, "kvcli", __FILE__, {"v"});
      !bad.empty()) {
    std::cerr << "kvcli: " << bad << "\n";
    return kExitError;
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
  try {
    if (args.empty()) return Interactive();
    Cli cli(/*interactive=*/false);
    return cli.Run(args);
  } catch (const std::exception& e) {  // a bug, or out of memory: still a clear exit 2
    std::cerr << "kvcli: internal error: " << e.what() << "\n";
    return kExitError;
  }
}
