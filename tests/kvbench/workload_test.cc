// kvbench's workload files, property parser, keys and values.
#include "bench/kvbench/workload.h"

#include <gtest/gtest.h>

#include <string>

namespace rdkv::kvbench {
namespace {

const std::string kDir = KVBENCH_WORKLOADS_DIR;

Result<WorkloadConfig> Parse(const std::string& text) {
  Properties p;
  Status s = p.ParseText(text, "test.properties");
  if (!s.ok()) return s;
  return ParseWorkload(p);
}

void ExpectError(const std::string& text, const std::string& needle) {
  auto w = Parse(text);
  ASSERT_FALSE(w.ok()) << text;
  EXPECT_TRUE(w.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(w.status().message().find(needle), std::string::npos)
      << "message '" << w.status().message() << "' lacks '" << needle << "'";
}

TEST(Properties, JavaSyntax) {
  Properties p;
  ASSERT_TRUE(p.ParseText("# comment\n! also a comment\n\n  recordcount = 10\r\n"
                          "operationcount:20\nfieldcount 5\nrequestdistribution=\\\n   latest\n"
                          "recordcount=30\n",
                          "f")
                  .ok());
  EXPECT_EQ(p.Get("recordcount"), "30");  // a later setting wins
  EXPECT_EQ(p.Get("operationcount"), "20");
  EXPECT_EQ(p.Get("fieldcount"), "5");
  EXPECT_EQ(p.Get("requestdistribution"), "latest");
  EXPECT_EQ(p.OriginOf("recordcount"), "f:9");
  EXPECT_EQ(p.OriginOf("requestdistribution"), "f:7");  // where the continued line starts
  auto w = ParseWorkload(p);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->recordcount, 30);
  EXPECT_EQ(w->fieldcount, 5);
  EXPECT_EQ(w->requestdistribution, Distribution::kLatest);
}

TEST(Properties, Overrides) {
  Properties p;
  ASSERT_TRUE(p.ParseOverride("recordcount=77").ok());
  EXPECT_EQ(p.Get("recordcount"), "77");
  EXPECT_EQ(p.OriginOf("recordcount"), "-p");
  EXPECT_FALSE(p.ParseOverride("recordcount").ok());
  EXPECT_FALSE(p.ParseOverride("=5").ok());
}

TEST(Properties, MalformedLines) {
  Properties p;
  Status s = p.ParseText("recordcount=1\n=5\n", "w");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("w:2"), std::string::npos) << s.message();
  Status t = Properties().ParseText("recordcount=\\", "w");
  EXPECT_FALSE(t.ok());
}

TEST(Workload, Defaults) {
  auto w = Parse("recordcount=100\n");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->insertcount, 100);
  EXPECT_EQ(w->readproportion, 0.95);
  EXPECT_EQ(w->updateproportion, 0.05);
  EXPECT_EQ(w->requestdistribution, Distribution::kUniform);
  EXPECT_EQ(w->zipfianconstant, 0.99);
  EXPECT_EQ(w->fieldcount, 10);
  EXPECT_EQ(w->fieldlength, 100);
  EXPECT_FALSE(w->orderedinserts);
  EXPECT_EQ(w->threadcount, 1);
  EXPECT_EQ(w->status_interval, 10);
}

TEST(Workload, UnknownAndMalformedPropertiesAreErrors) {
  ExpectError("recordcount=10\nrecordcont=5\n",
              "unknown property 'recordcont' (test.properties:2)");
  ExpectError("recordcount=10\nrdkv.sead=x:1\n", "rdkv.seed");  // the hint lists the real ones
  ExpectError("recordcount=1e3\n", "recordcount (test.properties:1) = '1e3': not an integer");
  ExpectError("recordcount=-5\n", "recordcount");
  ExpectError("recordcount=10\nreadproportion=abc\n",
              "readproportion (test.properties:2) = 'abc': not a number");
  ExpectError("recordcount=10\nreadproportion=1.5\n", "must be in [0, 1]");
  ExpectError("recordcount=10\nreadproportion=0\nupdateproportion=0\n", "all 0");
  ExpectError("recordcount=10\nrequestdistribution=exponential\n",
              "uniform, zipfian, latest, hotspot");
  ExpectError("recordcount=10\nzipfianconstant=1\n", "zipfianconstant");
  ExpectError("recordcount=10\nzipfianconstant=0\n", "zipfianconstant");
  ExpectError("recordcount=10\ninsertorder=random\n", "hashed, ordered");
  ExpectError("recordcount=10\nfieldcount=0\n", "fieldcount");
  ExpectError("recordcount=10\nfieldlength=\n", "fieldlength");
  ExpectError("recordcount=10\nthreadcount=two\n", "threadcount");
  ExpectError("recordcount=10\ntarget=-1\n", "target");
  ExpectError("recordcount=10\nmaxexecutiontime=soon\n", "maxexecutiontime");
  ExpectError("recordcount=10\nhotspotdatafraction=2\n", "hotspotdatafraction");
  ExpectError("recordcount=10\nreadallfields=false\n", "readallfields");
  ExpectError("recordcount=10\nworkload=site.ycsb.workloads.TimeSeriesWorkload\n", "workload");
  ExpectError("recordcount=10\ndb=cassandra\n", "db");
  ExpectError("operationcount=10\n", "recordcount must be set");
  ExpectError("recordcount=10\ninsertstart=5\ninsertcount=6\n", "exceeds recordcount");
  ExpectError("recordcount=1\nrequestdistribution=latest\n", "recordcount >= 2");
}

TEST(Workload, RepositoryFilesHaveYcsbMixes) {
  struct Want {
    const char* file;
    double read, update, insert, scan, rmw;
    Distribution dist;
  };
  const Want wants[] = {
      {"workloada", 0.5, 0.5, 0, 0, 0, Distribution::kZipfian},
      {"workloadb", 0.95, 0.05, 0, 0, 0, Distribution::kZipfian},
      {"workloadc", 1, 0, 0, 0, 0, Distribution::kZipfian},
      {"workloadd", 0.95, 0, 0.05, 0, 0, Distribution::kLatest},
      {"workloade", 0, 0, 0.05, 0.95, 0, Distribution::kZipfian},
      {"workloadf", 0.5, 0, 0, 0, 0.5, Distribution::kZipfian},
  };
  for (const Want& want : wants) {
    Properties p;
    ASSERT_TRUE(p.LoadFile(kDir + "/" + want.file).ok()) << want.file;
    auto w = ParseWorkload(p);
    ASSERT_TRUE(w.ok()) << want.file << ": " << w.status().ToString();
    EXPECT_EQ(w->readproportion, want.read) << want.file;
    EXPECT_EQ(w->updateproportion, want.update) << want.file;
    EXPECT_EQ(w->insertproportion, want.insert) << want.file;
    EXPECT_EQ(w->scanproportion, want.scan) << want.file;
    EXPECT_EQ(w->readmodifywriteproportion, want.rmw) << want.file;
    EXPECT_EQ(w->requestdistribution, want.dist) << want.file;
    EXPECT_EQ(w->recordcount, 1000) << want.file;
    EXPECT_EQ(w->operationcount, 1000) << want.file;
    EXPECT_EQ(w->fieldcount, 10);
    EXPECT_EQ(w->fieldlength, 100);
  }
}

TEST(Workload, ScanRefusalExplains) {
  auto w = Parse(
      "recordcount=10\nscanproportion=0.95\ninsertproportion=0.05\nreadproportion=0\n"
      "updateproportion=0\n");
  ASSERT_TRUE(w.ok());
  const std::string m = ScanRefusal(*w);
  EXPECT_NE(m.find("no range scans"), std::string::npos) << m;
  EXPECT_NE(m.find("redis and memcached"), std::string::npos) << m;
}

TEST(CoreWorkload, KeyNames) {
  auto w = Parse("recordcount=10\n");
  ASSERT_TRUE(w.ok());
  CoreWorkload hashed(*w);
  EXPECT_EQ(hashed.BuildKeyName(0), "user6284781860667377211");  // YCSB's first key
  EXPECT_EQ(hashed.BuildKeyName(1), "user8517097267634966620");
  w->orderedinserts = true;
  CoreWorkload ordered(*w);
  EXPECT_EQ(ordered.BuildKeyName(0), "user0");
  EXPECT_EQ(ordered.BuildKeyName(42), "user42");
}

TEST(CoreWorkload, ValuesHaveTheFieldsAndNameTheirKey) {
  auto w = Parse("recordcount=10\n");
  ASSERT_TRUE(w.ok());
  CoreWorkload cw(*w);
  Rng rng(1);
  std::string v;
  cw.BuildValue("user42", rng, &v);
  EXPECT_EQ(v.size(), 10u * (7 + 100));  // "field0=" .. "field9=", 100 bytes each
  EXPECT_EQ(cw.value_size(), v.size());
  EXPECT_EQ(v.compare(0, 14, "field0=user42 "), 0) << v.substr(0, 20);
  EXPECT_EQ(v.compare(107, 7, "field1="), 0);
  EXPECT_TRUE(cw.CheckValue("user42", v));
  EXPECT_FALSE(cw.CheckValue("user43", v));
  EXPECT_FALSE(cw.CheckValue("user42", v.substr(1)));
  std::string bad = v;
  bad[107] = 'x';
  EXPECT_FALSE(cw.CheckValue("user42", bad));
  for (char c : v) EXPECT_TRUE(c >= ' ' && c <= '~');

  auto small = Parse("recordcount=10\nfieldcount=3\nfieldlength=4\n");
  ASSERT_TRUE(small.ok());
  CoreWorkload sw(*small);
  sw.BuildValue("user6284781860667377211", rng, &v);  // key longer than a field: not embedded
  EXPECT_EQ(v.size(), 3u * (7 + 4));
  EXPECT_TRUE(sw.CheckValue("user6284781860667377211", v));
}

TEST(CoreWorkload, OperationMixAndKeyChooser) {
  auto w = Parse(
      "recordcount=1000\noperationcount=1000\nreadproportion=0.5\nupdateproportion=0\n"
      "readmodifywriteproportion=0.5\nrequestdistribution=zipfian\n");
  ASSERT_TRUE(w.ok());
  CoreWorkload cw(*w);
  auto ts = cw.NewThread(1);
  int reads = 0, rmw = 0;
  for (int i = 0; i < 100000; ++i) {
    const OpType op = ts->NextOp();
    reads += op == OpType::kRead;
    rmw += op == OpType::kReadModifyWrite;
    const int64_t k = ts->NextKeynum();
    ASSERT_GE(k, 0);
    ASSERT_LE(k, 999);  // never a key not yet inserted
  }
  EXPECT_EQ(reads + rmw, 100000);
  EXPECT_NEAR(reads / 100000.0, 0.5, 0.01);
}

TEST(CoreWorkload, LatestReadsOnlyAcknowledgedInserts) {
  auto w = Parse(
      "recordcount=100\noperationcount=1000\nreadproportion=0.95\nupdateproportion=0\n"
      "insertproportion=0.05\nrequestdistribution=latest\n");
  ASSERT_TRUE(w.ok());
  CoreWorkload cw(*w);
  auto ts = cw.NewThread(2);
  EXPECT_EQ(cw.LastAcknowledged(), 99);
  const int64_t a = cw.NextInsertKeynum(), b = cw.NextInsertKeynum();
  EXPECT_EQ(a, 100);
  EXPECT_EQ(b, 101);
  cw.AcknowledgeInsert(b);
  for (int i = 0; i < 10000; ++i) ASSERT_LE(ts->NextKeynum(), 99);
  cw.AcknowledgeInsert(a);
  EXPECT_EQ(cw.LastAcknowledged(), 101);
  int newest = 0;
  for (int i = 0; i < 10000; ++i) newest += ts->NextKeynum() == 101;
  EXPECT_GT(newest, 1000);  // about 1/zeta(101) = 19 %
}

}  // namespace
}  // namespace rdkv::kvbench
