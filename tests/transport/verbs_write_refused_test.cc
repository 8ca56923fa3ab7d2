// The negative check that only real verbs can give: a server region is registered for remote
// READ only, so an RDMA WRITE to it, with the right rkey and in bounds, is refused by the NIC
// (IBV_WC_REM_INV_REQ_ERR or IBV_WC_REM_ACCESS_ERR) and changes nothing; the server keeps serving
// everyone else. Runs in the Soft-RoCE VM (tests/rxe/vm.sh); SKIPPED elsewhere (FAILS with
// RDKV_REQUIRE_VERBS=1).
#include <infiniband/verbs.h>

#include <cstring>
#include <vector>

#include "tests/transport/verbs_test_env.h"

namespace rdkv::transport {
namespace {

using namespace std::chrono_literals;
using testing_env::RegionByte;

class VerbsWriteRefused : public testing_env::VerbsEnv {};

// The NIC's refusals of a WRITE: the server's queue pairs allow remote READ only (from the
// proof on; docs/transport-verbs.md "Handshake"), so the responder rejects the opcode itself
// (IBV_WC_REM_INV_REQ_ERR) before it looks at the rkey; a QP that allowed writes would still
// find no write permission on the window or MR (IBV_WC_REM_ACCESS_ERR).
bool Refused(int wc) { return wc == IBV_WC_REM_ACCESS_ERR || wc == IBV_WC_REM_INV_REQ_ERR; }

TEST_F(VerbsWriteRefused, WriteToAServerRegionIsRefusedAndChangesNothing) {
  ASSERT_TRUE(Listen(Echo()).ok());
  auto attacker = Connect();
  auto other = Connect();
  ASSERT_TRUE(attacker.ok()) << attacker.status().ToString();
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  const RegionDescriptor r = (*attacker)->regions().at(0);
  auto* hooks = dynamic_cast<VerbsConnection*>(attacker->get());
  ASSERT_NE(hooks, nullptr) << "a verbs Fabric's connections are VerbsConnections";

  // 4 KiB of 0xAB at offset 4096, with the advertised rkey: everything right but the permission.
  const size_t kOffset = 4096, kLen = 4096;
  std::memset(local_->data(), 0xAB, kLen);
  Result<int> wc = hooks->PostWriteForTest({local_->data(), kLen}, local_->lkey(), r.addr + kOffset,
                                           r.rkey, 30s);
  ASSERT_TRUE(wc.ok()) << wc.status().ToString();
  EXPECT_TRUE(Refused(*wc)) << "work completion status: "
                            << ibv_wc_status_str(static_cast<ibv_wc_status>(*wc));

  // Not one byte of the region changed.
  for (size_t i = 0; i < kRegionSize; ++i) {
    ASSERT_EQ(region_->data()[i], RegionByte(i)) << "the refused WRITE changed byte " << i;
  }
  // RC: the refused WRITE put the attacker's queue pair in the error state.
  EXPECT_FALSE((*attacker)->alive());

  // The server is unaffected: the other client, and a new one, read the right bytes and call.
  EXPECT_TRUE(ReadAndCheck(other->get(), kOffset, kLen));
  std::vector<uint8_t> resp;
  std::vector<uint8_t> req = {1, 2, 3};
  ASSERT_TRUE((*other)->Call(req, &resp, 10s).ok());
  EXPECT_EQ(resp, req);
  auto fresh = Connect();
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_TRUE(ReadAndCheck(fresh->get(), kOffset, kLen));
  EXPECT_TRUE(ReadAndCheck(fresh->get(), 0, 64));
  ASSERT_TRUE((*fresh)->Call(req, &resp, 10s).ok());
}

TEST_F(VerbsWriteRefused, WriteWithAGuessedRkeyIsRefusedToo) {
  ASSERT_TRUE(Listen(Echo()).ok());
  auto c = Connect();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const RegionDescriptor r = (*c)->regions().at(0);
  auto* hooks = dynamic_cast<VerbsConnection*>(c->get());
  ASSERT_NE(hooks, nullptr);
  std::memset(local_->data(), 0xCD, 64);
  // rkeys are predictable on rxe; the next one up is what an attacker would try.
  Result<int> wc =
      hooks->PostWriteForTest({local_->data(), 64}, local_->lkey(), r.addr, r.rkey + 0x100, 30s);
  ASSERT_TRUE(wc.ok()) << wc.status().ToString();
  EXPECT_TRUE(Refused(*wc)) << ibv_wc_status_str(static_cast<ibv_wc_status>(*wc));
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(region_->data()[i], RegionByte(i));
  auto fresh = Connect();
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_TRUE(ReadAndCheck(fresh->get(), 0, 64));
}

}  // namespace
}  // namespace rdkv::transport
