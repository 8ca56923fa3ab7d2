// The fabric interface: what rdkv needs from an RDMA NIC, with one implementation per fabric.
//
//   * verbs (common/transport/verbs/): rdma-core, rdma_cm connections, RC queue pairs.
//   * tcp   (common/transport/tcp/):   a software NIC over TCP for machines without RDMA. A
//     transport thread serves READs from the registered bytes (checking rkey and bounds like a
//     NIC) and never calls key-value code.
//
// Control path (this file, Fabric/Listener/Connection creation) may allocate and log.
// Datapath (PostReads, PollReads, Call, Reply) does not log and does not allocate per operation
// beyond what is stated on each method.
//
// Object lifetimes: a Fabric outlives every MemoryRegion, Listener and Connection it created.
// A MemoryRegion that backs a Listener's advertised regions outlives that Listener.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

// Header-only constants of the protocol limits (the transport does not link the kv library).
#include "common/kv/limits.h"
#include "common/util/reply_batch.h"
#include "rdkv/status.h"

namespace rdkv::transport {

enum class TransportKind : uint8_t { kTcp, kVerbs };
std::string_view TransportKindName(TransportKind kind);

// What a server advertises about one registered region in the connection handshake.
struct RegionDescriptor {
  uint64_t addr = 0;            // remote virtual address of byte 0 (what READs are addressed by)
  uint64_t length = 0;          // bytes
  uint32_t rkey = 0;            // remote key; READs with another rkey fail
  uint32_t layout_version = 0;  // meaning of the bytes, chosen by the application
};

enum class RegionAccess : uint8_t {
  kLocal,       // a client's destination buffer for READs (local write only)
  kRemoteRead,  // a server region: peers may READ it; it is never remotely writable
};

// A block of memory registered with the fabric. Huge pages are used when available and the
// size allows; otherwise normal pages (the fallback is logged once at creation).
// Thread-safety: the accessors are const and safe from any thread.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual uint8_t* data() const = 0;
  virtual size_t size() const = 0;
  virtual uint32_t lkey() const = 0;
  virtual uint32_t rkey() const = 0;
  virtual bool huge_pages() const = 0;
  RegionDescriptor Describe(uint32_t layout_version) const {
    return {reinterpret_cast<uint64_t>(data()), size(), rkey(), layout_version};
  }
};

enum class ReadStatus : uint8_t {
  kPending = 0,
  kOk,
  kRemoteAccessError,  // bad rkey, out of bounds, or access not allowed
  kConnectionLost,     // the connection broke before the READ completed
  kLocalError,         // bad local buffer/lkey or another local fault
};

// One one-sided READ. The caller owns it and must keep it (and the destination bytes) alive
// and untouched until done() returns true; the transport writes only `status` and the
// destination. A ReadOp can be reused after it is done (call Reset()).
struct ReadOp {
  uint8_t* local = nullptr;  // destination inside a MemoryRegion of this Fabric
  uint32_t lkey = 0;         // that region's lkey
  uint64_t remote_addr = 0;  // absolute remote address (RegionDescriptor::addr + offset)
  uint32_t rkey = 0;
  uint32_t length = 0;
  std::atomic<ReadStatus> status{ReadStatus::kPending};

  bool done() const { return status.load(std::memory_order_acquire) != ReadStatus::kPending; }
  void Reset() { status.store(ReadStatus::kPending, std::memory_order_relaxed); }
};

// What an authenticated session may do (docs/security.md). kAdmin may do everything kData may,
// plus the admin ops of kv::IsAdmin (IMPORT, SHARD_SCAN, DROP_SHARD, INSTALL_MAP, SNAPSHOT,
// REPLICATE, SHARD_IDS, RECORD_IDS).
enum class SessionRole : uint8_t { kData = 1, kAdmin = 2 };

// TLS 1.3 for the tcp transport (docs/security.md "TLS (tcp)"). PEM file paths, read when the
// listener or connection is created. verbs has no TLS: its Listen/Connect refuse any of these.
struct TlsOptions {
  // Server: this server's certificate chain and private key; setting them turns TLS on.
  // Client: an optional client certificate, presented when the server requires one.
  std::string cert_file;
  std::string key_file;
  // Client: the CA that signed the servers' certificates; setting it turns TLS on (a server is
  // always verified, by chain and by the host name or IP address connected to).
  // Server: verifies client certificates (require_client_cert).
  std::string ca_file;
  bool require_client_cert = false;  // server only: mutual TLS

  bool server_enabled() const { return !cert_file.empty() || !key_file.empty(); }
  bool client_enabled() const { return !ca_file.empty(); }
  bool any() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// Sizes and timeouts for one connection. Defaults suit a KV client.
struct ConnectOptions {
  std::string host;
  uint16_t port = 0;
  // The secret of `role`: the server's data secret for kData, its admin secret for kAdmin
  // (common/transport/auth.h). Never sent: the handshake proves knowledge of it with
  // HMAC-SHA256 over fresh nonces of both sides, and checks that the server knows it too.
  // A wrong secret (either side) fails Connect with kPermissionDenied.
  std::string auth_token;
  SessionRole role = SessionRole::kData;
  std::chrono::milliseconds connect_timeout{5000};
  // TLS (tcp only): on when tls.ca_file is set. The TLS handshake counts against
  // connect_timeout; a failed one (verification, a plaintext server) is kUnavailable.
  TlsOptions tls;
  uint32_t max_outstanding_reads = 1024;  // READs in flight at once on this connection
  uint32_t max_outstanding_calls = 64;    // two-sided requests in flight at once
  // Largest request or response payload.
  size_t max_message_size = kv::MaxMessageBytes(kv::kDefaultMaxValueBytes);
  // tcp: how long a waiting caller polls the socket before it sleeps in the kernel. Polling
  // keeps the CPU from going idle between a request and its answer (waking an idle CPU costs
  // tens of microseconds, more than the loopback round trip); it ends with the wait, so an idle
  // client uses no CPU. 0: sleep at once.
  std::chrono::microseconds busy_poll{50};
};

// The one rule for every busy_poll setting (ConnectOptions, ListenOptions, and the client and
// server options that feed them): 0..10 ms. kInvalidArgument otherwise. (Inline: the tcp and
// verbs libraries do not link the fabric's.)
inline Status CheckBusyPoll(std::chrono::microseconds busy_poll) {
  if (busy_poll.count() < 0 || busy_poll > std::chrono::milliseconds(10)) {
    return Status::InvalidArgument("busy_poll must be 0..10 ms, not " +
                                   std::to_string(busy_poll.count()) + " us");
  }
  return Status::Ok();
}

// A Call started with Connection::StartCall and not finished yet. The caller owns it and keeps
// it (and the response buffer) alive until FinishCall; the fields are the transport's.
struct PendingCall {
  std::vector<uint8_t>* response = nullptr;
  std::chrono::steady_clock::time_point deadline{};
  std::chrono::milliseconds timeout{0};
  uint32_t slot = 0;            // the transport's call slot (held until FinishCall)
  uint64_t sequence = 0;        // and its sequence number, where the transport has one
  const void* token = nullptr;  // the transport's completion flag
  Status result;                // the default StartCall: the whole Call's outcome
  bool started = false;         // StartCall returned OK and FinishCall has not run

  // For transports: records a request that went out.
  void MarkStarted(std::vector<uint8_t>* out, std::chrono::steady_clock::time_point until,
                   std::chrono::milliseconds limit, uint32_t slot_index, uint64_t seq,
                   const void* flag) {
    response = out;
    deadline = until;
    timeout = limit;
    slot = slot_index;
    sequence = seq;
    token = flag;
    started = true;
  }
};

// Client side of one connection to a server. One connection per (client process, server) is
// the intended use: it is fully thread-safe and many threads may post, poll and call at once.
class Connection {
 public:
  virtual ~Connection() = default;

  // The server's regions, as returned by the handshake. Never changes for this connection.
  virtual const std::vector<RegionDescriptor>& regions() const = 0;

  // Posts the READs, as one batch (one doorbell on verbs, one write on tcp). Either all are
  // posted or none: kBusy when fewer than ops.size() slots are free (poll and retry),
  // kConnectionLost when the connection is broken (then an op may be done with
  // kConnectionLost, or, where the NIC failed the post part-way, still in flight until it
  // flushes: wait for done() on each before reusing its buffer), kInvalidArgument for a zero-length
  // or oversize READ (longer than max_message_size) or a batch larger than max_outstanding_reads
  // (it could never be posted whole; ReadAndWait takes any number). Completions arrive in any
  // order; see done(), PollReads and ReadAndWait.
  virtual Status PostReads(std::span<ReadOp* const> ops) = 0;

  // Drives completions without blocking; returns how many READs (from any thread) completed.
  // Completions are driven by the calls that wait or poll (WaitReads, ReadAndWait, Call,
  // PollReads): a posted READ that nobody waits for or polls may stay pending.
  virtual size_t PollReads() = 0;

  // Posts (retrying on kBusy) and waits until every op is done or the deadline passes.
  // Returns OK when every op is done (check each op's status), kTimedOut otherwise.
  // On kTimedOut the ops stay owned by the transport until done() is true or the
  // Connection is destroyed. Ops that could not even be posted before the deadline (every
  // slot stayed busy) are completed with kLocalError, so each op is done or owned, never lost.
  virtual Status ReadAndWait(std::span<ReadOp* const> ops,
                             std::chrono::steady_clock::time_point deadline) = 0;

  // Waits until every op of `ops`, all already posted with PostReads, is done or the deadline
  // passes: OK when all are done, kTimedOut otherwise (the ops not done stay owned by the
  // transport, as after ReadAndWait). Lets one thread keep batches on several connections in
  // flight together and wait for each in turn. The default polls (PollReads) and yields;
  // transports override it with their own blocking wait.
  virtual Status WaitReads(std::span<ReadOp* const> ops,
                           std::chrono::steady_clock::time_point deadline) {
    size_t first = 0;
    for (;;) {
      while (first < ops.size() && ops[first]->done()) ++first;
      if (first == ops.size()) return Status::Ok();
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status::TimedOut(peer() + ": READs not complete by the deadline");
      }
      if (PollReads() == 0) std::this_thread::yield();
    }
  }

  // Two-sided request/response: sends `request` and waits for its response (matched by id).
  // Errors: kTimedOut (the request may have applied), kConnectionLost, kInvalidArgument
  // (oversize), kBusy (max_outstanding_calls requests stayed in flight for the whole timeout;
  // nothing was sent). `response` is resized to the response length (may allocate).
  virtual Status Call(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                      std::chrono::milliseconds timeout) = 0;

  // Call in two halves, so that one thread can have requests on several connections in flight
  // together (the primary forwards a write to all its backups at once). StartCall sends the
  // request: OK, or any error Call returns before the request went out (then nothing is in
  // flight and `call` needs no FinishCall). After OK, FinishCall must run exactly once, on any
  // one thread, and waits for the answer until the deadline StartCall set: it returns what Call
  // would have and fills `response`. `response` and `call` must stay alive and untouched until
  // then. The default runs the whole Call inside StartCall (correct, only not overlapped).
  virtual Status StartCall(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                           std::chrono::milliseconds timeout, PendingCall* call) {
    call->response = response;
    call->timeout = timeout;
    call->result = Call(request, response, timeout);
    call->started = true;
    return Status::Ok();
  }
  virtual Status FinishCall(PendingCall* call) {
    call->started = false;
    return call->result;
  }
  // Waits for a started call's answer until `until` (at most its deadline): true when
  // FinishCall will return without waiting (answered, or the connection is lost), false when
  // `until` passed first. The call stays started either way. The default: true.
  virtual bool WaitCall(PendingCall* call, std::chrono::steady_clock::time_point until) {
    (void)call;
    (void)until;
    return true;
  }

  // False once the connection is known broken (peer died, QP in error, socket closed).
  virtual bool alive() const = 0;
  // "verbs 192.168.77.1:7400" etc., for logs and errors.
  virtual std::string peer() const = 0;
};

// One received request on the server. The payload is valid only during the handler call;
// the ReplyHandle may be kept and used later from any thread (deferred replies, e.g. group
// commit), exactly once.
class ServerSession;
struct ReplyHandle {
  std::shared_ptr<ServerSession> session;
  uint64_t request_id = 0;
};

class ServerSession : public HoldsReplies {
 public:
  virtual ~ServerSession() = default;
  // Sends the response for `request_id`. Thread-safe. kConnectionLost if the client is gone
  // (the reply is dropped; the caller has nothing else to do).
  virtual Status Reply(uint64_t request_id, std::span<const uint8_t> response) = 0;
  virtual std::string peer() const = 0;
  virtual uint64_t id() const = 0;
  // What the client authenticated as; fixed at the handshake. Thread-safe. The Service
  // refuses admin ops (kv::IsAdmin) to sessions that are not kAdmin. Sessions that do not
  // authenticate (test fakes) are kData: least privilege.
  virtual SessionRole role() const { return SessionRole::kData; }
  // Sends what this session's Reply held for a ReplyBatch. Called by the batch's end, on the
  // thread that held it. The default holds nothing.
  void SendHeld() override {}
};

// ReplyBatch (common/util/reply_batch.h): replies given on a thread while one lives may be held
// and sent together at its end (one write per session); ServerSession::SendHeld sends them.
using ReplyBatch = ::rdkv::ReplyBatch;

// Called on a worker thread for each complete request. Must not block for long; defer the
// reply through the handle when the answer needs slow work.
using RequestHandler = std::function<void(std::span<const uint8_t> payload, ReplyHandle reply)>;
// Called on the thread that received a request (tcp: its NIC thread), before the request is
// queued for a worker: answers it there when it can without waiting for anything (no lock held
// for long, no I/O but the reply), returning true; false leaves it to a worker, untouched.
// The answer goes into *response, which the transport sends (with the other answers of that
// receive pass, in one write). It may instead take *reply (move it out) to answer later through
// it, from any thread, and return true: then nothing is sent now. Work answered that way must
// not wait on this thread, and must not be overtaken by a later request of the session where
// that matters (the handler declines those, as the transport's rule below says).
using InlineHandler = std::function<bool(std::span<const uint8_t> payload,
                                         std::vector<uint8_t>* response, ReplyHandle* reply)>;

struct ListenOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: pick a free port (see Listener::port())
  // The data secret (empty: anyone may open a data session) and the admin secret (empty: the
  // admin role is granted only to loopback peers, when loopback_admin). See
  // docs/security.md; the handshake is in common/transport/auth.h.
  std::string auth_token;
  std::string admin_token;
  // Test hook: false treats every peer as remote (no loopback admin without an admin secret).
  bool loopback_admin = true;
  // TLS (tcp only): on when tls.cert_file and tls.key_file are set; then every client must
  // speak TLS 1.3 first (a plaintext one is REFUSED with a reason saying so). The TLS handshake
  // is part of the handshake for the admission limits and handshake_timeout below.
  TlsOptions tls;
  std::vector<RegionDescriptor> regions;  // advertised to clients after authentication
  RequestHandler handler;
  // Optional (tcp only; verbs runs every request on its workers, which receive it themselves):
  // requests it answers skip the handoff to a worker. Not called while workers are paused, nor
  // while an earlier request of the same connection is still with a worker (until the handler
  // call returns: a handler that keeps a ReplyHandle to answer later must make the inline
  // handler decline what could overtake that deferred work), nor for more than 64 requests of
  // one connection per receive pass.
  InlineHandler inline_handler;
  int worker_threads = 2;  // threads that poll receive completions and run the handler
  size_t max_message_size = kv::MaxMessageBytes(kv::kDefaultMaxValueBytes);
  // Authenticated sessions at once; more are REFUSED (kUnavailable) after their handshake.
  uint32_t max_connections = 256;
  // verbs: at most this many sessions share one CQ and SRQ (0: as many as the device's CQ
  // holds, the default and what a server should use). Test hook: a small value spreads a few
  // connections over several CQs.
  uint32_t verbs_sessions_per_cq = 0;
  // Admission (tcp; docs/security.md): sockets that have not finished the handshake are
  // limited apart from sessions, in all and per source address. At either limit the oldest
  // handshaking socket is closed to make room (so silent sockets cannot lock clients out), and
  // each is closed when it has not finished within handshake_timeout.
  uint32_t max_handshakes = 256;
  uint32_t max_handshakes_per_source = 64;
  std::chrono::milliseconds handshake_timeout{2000};
  // A session with no request for this long (and nothing in flight) is closed. 0: never.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(300)};
  // A session whose unsent output stays above the backpressure mark without draining for this
  // long, or ever exceeds max(4 MiB, 2 largest messages), is cut off (a client that does not
  // read its answers). The server's memory per client stays bounded either way.
  std::chrono::milliseconds output_stall_timeout{std::chrono::seconds(10)};
  // tcp: after activity, NIC threads poll their sockets this long before they sleep in the
  // kernel (see ConnectOptions::busy_poll). An idle server sleeps. 0: sleep at once. A NIC
  // thread polls only while it does not wait for its CPU (CpuContention: its run delay), since
  // its polling then takes CPU time from the threads it competes with, which may be the clients
  // that send it work; busy_poll_always polls regardless (NIC threads on cores of their own).
  std::chrono::microseconds busy_poll{50};
  bool busy_poll_always = false;
};

struct ListenerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_refused = 0;  // bad proof, too many, bad handshake, evicted, deadline
  uint64_t connections_open = 0;     // clients connected now (past the handshake)
  uint64_t requests = 0;
  uint64_t requests_inline = 0;  // tcp: answered on the NIC thread (ListenOptions::inline_handler)
  uint64_t reads_served = 0;     // tcp only: READs served by the transport thread
  uint64_t read_bytes_served = 0;   // tcp only: bytes those READs returned
  uint64_t reads_refused = 0;       // tcp only: bad rkey / out of bounds
  uint64_t protocol_errors = 0;     // malformed frames (connection dropped)
  uint64_t handshakes_evicted = 0;  // tcp: handshaking sockets closed to admit newer ones
  uint64_t handshakes_timed_out = 0;
  uint64_t idle_closed = 0;       // sessions closed by idle_timeout
  uint64_t slow_readers_cut = 0;  // sessions cut off for not reading their output
  // tcp: times a NIC thread stopped busy-polling because it waited for its CPU (CpuContention;
  // each hold counts once, a doubled hold again); 0 with busy_poll_always or busy_poll 0.
  uint64_t busy_poll_holds = 0;
};

class Listener {
 public:
  virtual ~Listener() = default;  // stops accepting, disconnects every client, joins threads
  virtual uint16_t port() const = 0;
  virtual ListenerStats stats() const = 0;
  // Test hook: while paused, worker threads run no handler (two-sided requests wait); one-sided
  // READs are still served, as a NIC would.
  virtual void PauseWorkers(bool paused) = 0;
  // Replaces the secrets handshakes are checked against (ListenOptions::auth_token and
  // admin_token, same limits) and revokes every session that proved a secret that changed,
  // by role: each is closed before this returns (verbs: its queue pair leaves RTS, so its
  // memory windows' rkeys read nothing; the windows are deallocated at teardown). Sessions of
  // a role whose secret did not change stay; a handshake in progress with a replaced secret
  // is cut. Returns how many authenticated sessions were revoked. Errors: kInvalidArgument
  // (a secret over the limit; nothing changed), kTimedOut (the secrets were replaced but the
  // listener's threads did not confirm the closes in time). Thread-safe.
  virtual Result<uint64_t> RotateSecrets(const std::string& auth_token,
                                         const std::string& admin_token) = 0;
};

struct FabricOptions {
  TransportKind kind = TransportKind::kTcp;
  std::string device;  // verbs: device name ("rxe0"); empty = the first active device
  bool huge_pages = true;
};

// Owns the device (verbs: context and protection domain). Thread-safe.
class Fabric {
 public:
  virtual ~Fabric() = default;
  static Result<std::unique_ptr<Fabric>> Create(const FabricOptions& options);

  virtual TransportKind kind() const = 0;
  virtual std::string Describe() const = 0;  // "verbs rxe0 port 1", "tcp (software NIC)"

  virtual Result<std::unique_ptr<MemoryRegion>> AllocateRegion(size_t size,
                                                               RegionAccess access) = 0;
  virtual Result<std::unique_ptr<Listener>> Listen(ListenOptions options) = 0;
  virtual Result<std::unique_ptr<Connection>> Connect(const ConnectOptions& options) = 0;
  // Whether Listen could bind host:port now, without listening (0: any port, always OK): for
  // a server to find a busy port before long start-up work. kUnavailable "WHAT HOST:PORT is in
  // use by another process ..." when another listener holds it; the bind error otherwise. The
  // real Listen can still lose a race. The default (a fabric with no ports) says OK.
  virtual Status CheckListenPort(const std::string& what, const std::string& host, uint16_t port) {
    (void)what, (void)host, (void)port;
    return Status::Ok();
  }
};

// Parses --transport=auto|verbs|tcp. auto: verbs when an RDMA device with an active port exists,
// tcp otherwise; the choice and its reason are logged. Unknown names are kInvalidArgument.
Result<TransportKind> ChooseTransport(std::string_view flag_value);

// True when libibverbs lists at least one device with an active port; `why` says what was found.
bool RdmaDeviceAvailable(std::string* why);

}  // namespace rdkv::transport
