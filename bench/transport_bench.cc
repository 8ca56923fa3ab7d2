// transport_bench: one-sided READ latency and rate over a transport, server and client in one
// process (as perftest's ib_read_lat runs both ends on one device).
//
//   transport_bench --transport=tcp --size=64
//   transport_bench --transport=verbs --host=$RDKV_RXE_ADDR --size=64 --json=out.json
//
// Prints: READ latency at queue depth 1 (p50/p99/avg, microseconds) and READ rate at
// --qd outstanding READs, as "key=value" lines and optionally JSON; with --connects=N also the
// connection setup rate (sequential Connect + close, the whole handshake).
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <vector>

#include "common/transport/transport.h"

DEFINE_string(transport, "tcp", "tcp or verbs");
DEFINE_string(host, "127.0.0.1", "Address to listen on and connect to (verbs: the rxe address)");
DEFINE_int32(size, 64, "Bytes per READ");
DEFINE_int32(iters, 20000, "READs for the latency run");
DEFINE_int32(qd, 16, "Outstanding READs for the rate run");
DEFINE_double(seconds, 3.0, "Duration of the rate run");
DEFINE_string(json, "", "Also write the figures as JSON to this file");
DEFINE_int32(connects, 0,
             "Also time this many sequential Connect + close round trips (handshake cost) and "
             "print connects_per_s and the median connect time");

DEFINE_bool(index_pattern, false,
            "Also time the READs of a GET's index path alone, as the transport serves them: "
            "--index_buckets READs of --index_bucket_bytes in one batch (by default the key's "
            "two 512-byte buckets), then one 128-byte READ (the item); prints index_pattern "
            "p50_us");
DEFINE_int32(index_bucket_bytes, 512,
             "Bytes of each bucket READ in --index_pattern (the layout's bucket is 512; other "
             "sizes show what a smaller bucket would cost the fabric)");
DEFINE_int32(index_buckets, 2,
             "Bucket READs in the first batch of --index_pattern (the layout's GET READs 2; 1 "
             "with --index_bucket_bytes=128 is the floor of any GET of two round trips)");

using namespace rdkv;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  auto die = [](const Status& s, const char* what) {
    std::fprintf(stderr, "transport_bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(2);
  };
  Result<transport::TransportKind> kind = transport::ChooseTransport(FLAGS_transport);
  if (!kind.ok()) die(kind.status(), "--transport");
  transport::FabricOptions fo;
  fo.kind = *kind;
  auto fabric = transport::Fabric::Create(fo);
  if (!fabric.ok()) die(fabric.status(), "fabric");
  const size_t region_bytes = 64u << 20;
  auto region = (*fabric)->AllocateRegion(region_bytes, transport::RegionAccess::kRemoteRead);
  if (!region.ok()) die(region.status(), "server region");
  for (size_t i = 0; i < region_bytes; ++i) (*region)->data()[i] = static_cast<uint8_t>(i * 7);

  transport::ListenOptions lo;
  lo.host = FLAGS_host;
  lo.port = 0;
  lo.auth_token = "bench";
  lo.regions = {(*region)->Describe(1)};
  lo.handler = [](std::span<const uint8_t> p, transport::ReplyHandle r) {
    r.session->Reply(r.request_id, p).IgnoreError();
  };
  auto listener = (*fabric)->Listen(std::move(lo));
  if (!listener.ok()) die(listener.status(), "listen");

  transport::ConnectOptions co;
  co.host = FLAGS_host;
  co.port = (*listener)->port();
  co.auth_token = "bench";
  co.max_outstanding_reads = std::max(FLAGS_qd, 1);
  auto conn = (*fabric)->Connect(co);
  if (!conn.ok()) die(conn.status(), "connect");
  const transport::RegionDescriptor rd = (*conn)->regions().at(0);

  const size_t size = static_cast<size_t>(FLAGS_size);
  const int qd = std::max(FLAGS_qd, 1);
  auto local = (*fabric)->AllocateRegion(size * qd + 4096, transport::RegionAccess::kLocal);
  if (!local.ok()) die(local.status(), "local buffer");
  std::vector<transport::ReadOp> ops(qd);
  auto prepare = [&](transport::ReadOp& op, int slot, uint64_t n) {
    op.Reset();
    op.local = (*local)->data() + slot * size;
    op.lkey = (*local)->lkey();
    op.rkey = rd.rkey;
    op.length = static_cast<uint32_t>(size);
    op.remote_addr = rd.addr + (n * 4096) % (region_bytes - size);
  };

  // Latency, queue depth 1.
  std::vector<double> lat;
  lat.reserve(FLAGS_iters);
  for (int i = 0; i < FLAGS_iters + 100; ++i) {
    prepare(ops[0], 0, i);
    transport::ReadOp* p = &ops[0];
    auto t0 = Clock::now();
    Status s = (*conn)->ReadAndWait({&p, 1}, t0 + std::chrono::seconds(5));
    auto t1 = Clock::now();
    if (!s.ok() || ops[0].status.load() != transport::ReadStatus::kOk) {
      die(s.ok() ? Status::RemoteAccessError("READ failed") : s, "latency READ");
    }
    if (i >= 100) lat.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double q) { return lat[std::min(lat.size() - 1, size_t(q * lat.size()))]; };
  double avg = std::accumulate(lat.begin(), lat.end(), 0.0) / lat.size();

  // The index path's READs, without the KV code: what the fabric charges for those bytes.
  std::vector<double> index_lat;
  if (FLAGS_index_pattern) {
    if (FLAGS_index_buckets != 1 && FLAGS_index_buckets != 2) {
      die(Status::InvalidArgument("--index_buckets must be 1 or 2"), "flags");
    }
    if (FLAGS_index_bucket_bytes < 8 || FLAGS_index_bucket_bytes > 1024) {
      die(Status::InvalidArgument("--index_bucket_bytes must be 8..1024"), "flags");
    }
    const uint32_t kBucket = static_cast<uint32_t>(FLAGS_index_bucket_bytes);
    constexpr uint32_t kItem = 128;
    auto pattern_buf = (*fabric)->AllocateRegion(4096, transport::RegionAccess::kLocal);
    if (!pattern_buf.ok()) die(pattern_buf.status(), "index pattern buffer");
    transport::ReadOp pops[3];
    auto setup = [&](transport::ReadOp& op, size_t local_off, uint32_t len, uint64_t remote_off) {
      op.Reset();
      op.local = (*pattern_buf)->data() + local_off;
      op.lkey = (*pattern_buf)->lkey();
      op.rkey = rd.rkey;
      op.length = len;
      op.remote_addr = rd.addr + remote_off % (region_bytes - 4096);
    };
    index_lat.reserve(FLAGS_iters);
    for (int i = 0; i < FLAGS_iters + 100; ++i) {
      const uint64_t n = static_cast<uint64_t>(i) * 7919;
      setup(pops[0], 0, kBucket, n * 4096);
      setup(pops[1], kBucket, kBucket, (n + 3) * 4096 + 1024);
      transport::ReadOp* buckets[2] = {&pops[0], &pops[1]};
      const size_t bucket_reads = FLAGS_index_buckets == 1 ? 1 : 2;
      transport::ReadOp* item = &pops[2];
      auto t0 = Clock::now();
      Status s = (*conn)->ReadAndWait({buckets, bucket_reads}, t0 + std::chrono::seconds(5));
      if (s.ok()) {
        setup(pops[2], 2 * kBucket, kItem, (n + 5) * 4096 + 2048);
        s = (*conn)->ReadAndWait({&item, 1}, t0 + std::chrono::seconds(5));
      }
      auto t1 = Clock::now();
      for (size_t k = 0; k < 3; ++k) {
        const transport::ReadOp& op = pops[k];
        if (k == 1 && bucket_reads == 1) continue;
        if (s.ok() && op.status.load() != transport::ReadStatus::kOk) {
          s = Status::RemoteAccessError("READ failed");
        }
      }
      if (!s.ok()) die(s, "index pattern READ");
      if (i >= 100) index_lat.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    std::sort(index_lat.begin(), index_lat.end());
  }
  const double index_p50 = index_lat.empty() ? 0 : index_lat[index_lat.size() / 2];

  // Rate: keep qd READs outstanding.
  uint64_t done = 0, posted = 0;
  auto end = Clock::now() + std::chrono::duration<double>(FLAGS_seconds);
  auto r0 = Clock::now();
  std::vector<bool> busy(qd, false);
  while (Clock::now() < end) {
    std::vector<transport::ReadOp*> batch;
    for (int i = 0; i < qd; ++i) {
      if (busy[i] && ops[i].done()) {
        if (ops[i].status.load() != transport::ReadStatus::kOk)
          die(Status::Internal("READ failed"), "rate READ");
        busy[i] = false;
        ++done;
      }
      if (!busy[i]) {
        prepare(ops[i], i, posted++);
        batch.push_back(&ops[i]);
        busy[i] = true;
      }
    }
    if (!batch.empty()) {
      Status s = (*conn)->PostReads(batch);
      if (!s.ok()) die(s, "post");
    }
    (*conn)->PollReads();
  }
  // Drain.
  std::vector<transport::ReadOp*> pending;
  for (int i = 0; i < qd; ++i)
    if (busy[i]) pending.push_back(&ops[i]);
  for (auto* p : pending) {
    while (!p->done()) (*conn)->PollReads();
    ++done;
  }
  double secs = std::chrono::duration<double>(Clock::now() - r0).count();
  double rate = done / secs;

  // Connection setup: Connect (the whole handshake, windows bound) and close, one at a time.
  double connects_per_s = 0, connect_p50_ms = 0;
  if (FLAGS_connects > 0) {
    std::vector<double> ms;
    auto c0 = Clock::now();
    for (int i = 0; i < FLAGS_connects; ++i) {
      auto t0 = Clock::now();
      auto c = (*fabric)->Connect(co);
      if (!c.ok()) die(c.status(), "connect (setup timing)");
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    connects_per_s = FLAGS_connects / std::chrono::duration<double>(Clock::now() - c0).count();
    std::sort(ms.begin(), ms.end());
    connect_p50_ms = ms[ms.size() / 2];
    std::printf("rdkv transport_bench transport=%s connects=%d connects_per_s=%.1f p50_ms=%.2f\n",
                FLAGS_transport.c_str(), FLAGS_connects, connects_per_s, connect_p50_ms);
  }
  std::printf(
      "rdkv transport_bench transport=%s size=%d read_lat_qd1 p50_us=%.2f p99_us=%.2f avg_us=%.2f "
      "n=%zu\n",
      FLAGS_transport.c_str(), FLAGS_size, pct(0.50), pct(0.99), avg, lat.size());
  std::printf("rdkv transport_bench transport=%s size=%d read_rate qd=%d reads_per_s=%.0f\n",
              FLAGS_transport.c_str(), FLAGS_size, qd, rate);
  if (FLAGS_index_pattern) {
    std::printf(
        "rdkv transport_bench transport=%s index_pattern (%d x %d B, then 128 B) p50_us=%.2f "
        "n=%zu\n",
        FLAGS_transport.c_str(), FLAGS_index_buckets, FLAGS_index_bucket_bytes, index_p50,
        index_lat.size());
  }
  if (!FLAGS_json.empty()) {
    std::ofstream(FLAGS_json) << "{\"transport\":\"" << FLAGS_transport
                              << "\",\"size\":" << FLAGS_size << ",\"p50_us\":" << pct(0.5)
                              << ",\"p99_us\":" << pct(0.99) << ",\"avg_us\":" << avg
                              << ",\"qd\":" << qd << ",\"reads_per_s\":" << rate
                              << ",\"connects_per_s\":" << connects_per_s
                              << ",\"connect_p50_ms\":" << connect_p50_ms
                              << ",\"index_pattern_p50_us\":" << index_p50 << "}\n";
  }
  return 0;
}
