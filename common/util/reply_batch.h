// ReplyBatch: replies that one thread gives in a row, sent together (one write per connection).
// Here, apart from the transport, so that code which answers through callbacks it does not
// know (the persister's group commit, the replicator's batch completion) can open one.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace rdkv {

// What holds replies for a ReplyBatch: a transport's server session.
class HoldsReplies {
 public:
  virtual ~HoldsReplies() = default;
  // Sends what this holder's replies left unsent for the batch that is ending.
  virtual void SendHeld() = 0;
};

// While one lives on a thread, the replies that thread gives (transport::ServerSession::Reply,
// any session) may be held and sent together when it ends: one write per session for all of them
// instead of one per reply (tcp; a transport that does not hold sends at once). For a thread
// that answers many requests in a row away from the transport's receive pass, e.g. a
// replication sender settling a batch of writes (docs/design.md "Batching"). Nests: the
// outermost sends. A held reply waits for the batch's end (or for the connection's next flush,
// whichever is first): keep a batch around work that does not wait, and call SendHeldNow
// before anything under it that may (the store does before it sleeps for a full heap).
// Lives on one thread's stack (not thread-safe; each thread has its own).
class ReplyBatch {
 public:
  ReplyBatch() { ++Local().depth; }
  ~ReplyBatch() {
    State& st = Local();
    if (--st.depth > 0) return;
    SendHeldNow();
  }
  ReplyBatch(const ReplyBatch&) = delete;
  ReplyBatch& operator=(const ReplyBatch&) = delete;

  // For a session's Reply: whether a batch is open on this thread.
  static bool Open() { return Local().depth > 0; }
  // For a session's Reply that left its output unsent: SendHeld runs at the batch's end,
  // usually once per session however many replies it held (the check for a repeat looks at the
  // last kRecentHolds sessions only, so that a batch over thousands of connections stays
  // linear; a second SendHeld of a session finds nothing left to send).
  static void Hold(std::shared_ptr<HoldsReplies> session) {
    State& st = Local();
    const size_t n = st.held.size();
    for (size_t i = n; i > 0 && n - i < kRecentHolds; --i) {
      if (st.held[i - 1] == session) return;
    }
    st.held.push_back(std::move(session));
  }
  // Sends what this thread holds now, the batch staying open: for code under a batch that is
  // about to wait (a sleep, a lock held for long), so that no held answer waits with it.
  static void SendHeldNow() {
    State& st = Local();
    if (st.held.empty()) return;
    std::vector<std::shared_ptr<HoldsReplies>> held;
    held.swap(st.held);
    for (const std::shared_ptr<HoldsReplies>& s : held) s->SendHeld();
    held.clear();
    if (st.held.empty()) st.held.swap(held);  // keep the capacity: no allocation next time
  }

 private:
  static constexpr size_t kRecentHolds = 8;
  struct State {
    int depth = 0;
    std::vector<std::shared_ptr<HoldsReplies>> held;
  };
  static State& Local() {
    static thread_local State state;
    return state;
  }
};

}  // namespace rdkv
