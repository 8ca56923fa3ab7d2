// ReplyBatch: replies that one thread gives in a row, sent together (one write per connection).
// Here, apart from the transport, so that code which answers through callbacks it does not
// know (the persister's group commit, the replicator's batch completion) can open one.
#pragma once

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
// outermost sends. Keep it around work that does not wait: a held reply waits for its end.
// Lives on one thread's stack (not thread-safe; each thread has its own).
class ReplyBatch {
 public:
  ReplyBatch() { ++Local().depth; }
  ~ReplyBatch() {
    State& st = Local();
    if (--st.depth > 0) return;
    std::vector<std::shared_ptr<HoldsReplies>> held;
    held.swap(st.held);
    for (const std::shared_ptr<HoldsReplies>& s : held) s->SendHeld();
    held.clear();
    if (st.held.empty()) st.held.swap(held);  // keep the capacity: no allocation next time
  }
  ReplyBatch(const ReplyBatch&) = delete;
  ReplyBatch& operator=(const ReplyBatch&) = delete;

  // For a session's Reply: whether a batch is open on this thread.
  static bool Open() { return Local().depth > 0; }
  // For a session's Reply that left its output unsent: SendHeld runs at the batch's end (once
  // per session, however many replies it held).
  static void Hold(std::shared_ptr<HoldsReplies> session) {
    State& st = Local();
    for (const std::shared_ptr<HoldsReplies>& s : st.held) {
      if (s == session) return;
    }
    st.held.push_back(std::move(session));
  }

 private:
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
