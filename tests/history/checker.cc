#include "tests/history/checker.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

namespace rdkv::history {

std::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kLinearizable:
      return "LINEARIZABLE";
    case Verdict::kViolation:
      return "NOT LINEARIZABLE";
    case Verdict::kUnknown:
      return "UNKNOWN (search budget exceeded)";
    case Verdict::kBadHistory:
      return "BAD HISTORY";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

bool IsWrite(OpType t) { return t == OpType::kPut || t == OpType::kInsert || t == OpType::kCas; }

// The register: absent (value -1), the write `value` (an index into the key's ops), or
// kUnread: a write of unknown outcome whose value no get returned (all such writes leave the
// same state, so the search need not tell them apart). `ver`
// is the last version assigned to the key (it survives deletes): exact, or when the last
// write's version is unknown, a lower bound of it.
constexpr int32_t kAbsent = -1;
constexpr int32_t kUnread = -2;
struct State {
  int32_t value = kAbsent;
  bool exact = true;
  uint64_t ver = 0;
  bool operator==(const State&) const = default;
  uint64_t Hash() const {
    uint64_t h = static_cast<uint64_t>(static_cast<uint32_t>(value)) * 0x9E3779B97F4A7C15ull;
    h ^= (ver + (exact ? 0x51ED27ull : 0)) * 0xC2B2AE3D27D4EB4Full;
    return h ^ (h >> 29);
  }
};

// The configurations seen: (definite ops linearized, state, unknown ops used per class). A
// configuration is not explored again, nor one with the same definite ops and state that used
// at least as many unknown ops of every class: it is dominated. (The definite ops fix the
// first return left, so every unknown op invoked before it is available from here on, and
// those of one class are interchangeable: only how many are left matters. An op still
// pending can always stay pending, so fewer used can do all that more used can.)
// Bitsets and counts live in arenas; an open addressing table holds entry indices.
class Memo {
 public:
  Memo(size_t words, size_t classes) : words_(words), uwords_(classes), table_(1024, kEmpty) {}

  // Adds the configuration; false when it, or one that dominates it, was already there.
  bool Insert(const std::vector<uint64_t>& bits, const std::vector<uint32_t>& used, const State& s,
              uint64_t hash) {
    if ((entries_.size() + 1) * 2 > table_.size()) Grow();
    size_t mask = table_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      uint32_t e = table_[i];
      if (e == kEmpty) {
        table_[i] = static_cast<uint32_t>(entries_.size());
        entries_.push_back({hash, s});
        arena_.insert(arena_.end(), bits.begin(), bits.end());
        uarena_.insert(uarena_.end(), used.begin(), used.end());
        return true;
      }
      const Entry& en = entries_[e];
      if (en.hash == hash && en.state == s &&
          std::equal(bits.begin(), bits.end(), arena_.begin() + e * words_)) {
        const uint32_t* u = uarena_.data() + e * uwords_;
        bool fewer = true;
        for (size_t c = 0; c < uwords_ && fewer; ++c) fewer = u[c] <= used[c];
        if (fewer) return false;
      }
    }
  }
  size_t bytes() const {
    return arena_.capacity() * 8 + uarena_.capacity() * 4 + entries_.capacity() * sizeof(Entry) +
           table_.size() * 4;
  }

 private:
  static constexpr uint32_t kEmpty = 0xffffffffu;
  struct Entry {
    uint64_t hash;
    State state;
  };
  void Grow() {
    std::vector<uint32_t> t(table_.size() * 2, kEmpty);
    size_t mask = t.size() - 1;
    for (uint32_t e = 0; e < entries_.size(); ++e) {
      size_t i = entries_[e].hash & mask;
      while (t[i] != kEmpty) i = (i + 1) & mask;
      t[i] = e;
    }
    table_.swap(t);
  }
  const size_t words_, uwords_;
  std::vector<uint64_t> arena_;
  std::vector<uint32_t> uarena_;
  std::vector<Entry> entries_;
  std::vector<uint32_t> table_;
};

// One key's search.
class KeyChecker {
 public:
  KeyChecker(std::vector<Op> ops, const CheckOptions& options, KeyReport* report)
      : all_(std::move(ops)), options_(options), report_(report) {}

  void Run() {
    std::sort(all_.begin(), all_.end(), [](const Op& a, const Op& b) {
      return a.invoke_ns != b.invoke_ns ? a.invoke_ns < b.invoke_ns : a.complete_ns < b.complete_ns;
    });
    Count();
    if (!Prepare()) return;
    Search();
  }

 private:
  void Count() {
    KeyReport& r = *report_;
    r.ops = all_.size();
    for (const Op& op : all_) {
      switch (op.type) {
        case OpType::kGet:
          ++r.gets;
          break;
        case OpType::kPut:
          ++r.puts;
          break;
        case OpType::kInsert:
          ++r.inserts;
          break;
        case OpType::kCas:
          ++r.cas;
          break;
        case OpType::kDelete:
          ++r.deletes;
          break;
      }
      if (op.outcome == Outcome::kUnknown) ++r.unknown;
      if (op.outcome == Outcome::kFail) ++r.failed;
    }
  }

  void Fail(Verdict v, std::string why, std::vector<Op> window) {
    report_->verdict = v;
    report_->explanation = std::move(why);
    report_->window = std::move(window);
  }

  // Keeps the ops that matter (ops_), maps values to their writes, fixes each write's version
  // where a read observed it, and reports what contradicts the recorder's unique values.
  bool Prepare() {
    std::unordered_map<std::string, int> failed_writes;
    for (size_t i = 0; i < all_.size(); ++i) {
      const Op& op = all_[i];
      if (op.outcome == Outcome::kFail) {
        if (IsWrite(op.type)) failed_writes.emplace(op.value, static_cast<int>(i));
        continue;
      }
      if (op.type == OpType::kGet && op.outcome == Outcome::kUnknown) continue;
      ops_.push_back(op);
    }
    size_t n = ops_.size();
    version_.assign(n, std::nullopt);
    std::unordered_map<std::string, int> writer;
    for (size_t i = 0; i < n; ++i) {
      const Op& op = ops_[i];
      if (!IsWrite(op.type)) continue;
      auto [it, fresh] = writer.emplace(op.value, static_cast<int>(i));
      if (!fresh) {
        Fail(Verdict::kBadHistory,
             "value \"" + op.value + "\" is written by two operations: values must be unique",
             {ops_[it->second], op});
        return false;
      }
      if (op.outcome == Outcome::kOk) version_[i] = op.version;
    }
    std::vector<int> observer(n, -1);  // a get that fixed an unknown write's version
    read_of_.assign(n, -1);
    must_by_.assign(n, INT64_MAX);
    for (size_t i = 0; i < n; ++i) {
      if (ops_[i].outcome != Outcome::kUnknown) must_by_[i] = ops_[i].complete_ns;
    }
    for (size_t i = 0; i < n; ++i) {
      const Op& op = ops_[i];
      if (op.type != OpType::kGet || op.outcome != Outcome::kOk) continue;
      auto it = writer.find(op.value);
      if (it == writer.end()) {
        auto f = failed_writes.find(op.value);
        if (f != failed_writes.end()) {
          Fail(Verdict::kViolation,
               "a get returned value \"" + op.value + "\" of a write that failed (no effect)",
               {all_[f->second], op});
        } else {
          Fail(Verdict::kViolation,
               "invented value: a get returned \"" + op.value + "\", which no operation wrote",
               {op});
        }
        return false;
      }
      int w = it->second;
      read_of_[i] = w;
      const Op& wop = ops_[w];
      if (op.complete_ns < wop.invoke_ns) {
        Fail(Verdict::kViolation,
             "a get returned value \"" + op.value + "\" before its write was invoked", {op, wop});
        return false;
      }
      if (wop.outcome == Outcome::kOk && wop.version != op.version) {
        Fail(Verdict::kViolation,
             "a get returned value \"" + op.value + "\" with version " +
                 std::to_string(op.version) + " but its write was acknowledged with version " +
                 std::to_string(wop.version) + " (a write applied twice?)",
             {wop, op});
        return false;
      }
      if (version_[w].has_value() && *version_[w] != op.version) {
        Fail(Verdict::kViolation,
             "value \"" + op.value + "\" was read with versions " + std::to_string(*version_[w]) +
                 " and " + std::to_string(op.version) + " (a write applied twice?)",
             {wop, ops_[observer[w]], op});
        return false;
      }
      version_[w] = op.version;
      observer[w] = static_cast<int>(i);
      must_by_[w] = std::min(must_by_[w], op.complete_ns);
    }
    if (options_.unknown_deadline_ns > 0) {  // observed unknown writes: by their deadline too
      for (size_t i = 0; i < n; ++i) {
        if (ops_[i].outcome == Outcome::kUnknown && must_by_[i] != INT64_MAX) {
          must_by_[i] = std::min(must_by_[i], ops_[i].complete_ns + options_.unknown_deadline_ns);
        }
      }
    }
    return !options_.version_precheck || VersionsInRealTimeOrder();
  }

  // Versions never decrease along the linearization, so an op that observed a key's version
  // (a get's, a write's new version, a cas's expected one) cannot observe less than an op that
  // completed (for an observed unknown write: had to take effect) before it was invoked saw.
  bool VersionsInRealTimeOrder() {
    const size_t n = ops_.size();
    // The version the register has after op i, when known.
    auto after = [&](size_t i) -> std::optional<uint64_t> {
      const Op& op = ops_[i];
      if (op.type == OpType::kGet) {
        if (op.outcome == Outcome::kOk) return op.version;
        return std::nullopt;
      }
      if (IsWrite(op.type) && must_by_[i] != INT64_MAX) return version_[i];
      return std::nullopt;
    };
    std::vector<size_t> by_done;
    for (size_t i = 0; i < n; ++i) {
      if (after(i).has_value()) by_done.push_back(i);
    }
    std::sort(by_done.begin(), by_done.end(),
              [&](size_t a, size_t b) { return must_by_[a] < must_by_[b]; });
    // ops_ is sorted by invoke time: sweep it, folding in the ops done before each invoke.
    size_t d = 0;
    int best = -1;  // the op with the highest version done so far
    for (size_t i = 0; i < n; ++i) {
      const Op& op = ops_[i];
      while (d < by_done.size() && must_by_[by_done[d]] < op.invoke_ns) {
        if (best < 0 || *after(by_done[d]) > *after(best)) best = static_cast<int>(by_done[d]);
        ++d;
      }
      if (best < 0) continue;
      uint64_t m = *after(best);
      std::string seen = "version " + std::to_string(m) + " had been " +
                         (ops_[best].type == OpType::kGet ? "read" : "written") +
                         " by an op that completed before this one was invoked";
      if (op.type == OpType::kGet && op.outcome == Outcome::kOk && op.version < m) {
        Fail(Verdict::kViolation,
             "stale read: a get returned version " + std::to_string(op.version) + " but " + seen,
             {ops_[best], op});
        return false;
      }
      bool applied = op.outcome == Outcome::kOk || must_by_[i] != INT64_MAX;
      if (IsWrite(op.type) && applied && version_[i].has_value() && *version_[i] <= m) {
        Fail(Verdict::kViolation,
             "versions not increasing: a " + std::string(OpTypeName(op.type)) + " wrote version " +
                 std::to_string(*version_[i]) + " but " + seen,
             {ops_[best], op});
        return false;
      }
      if (op.type == OpType::kCas && op.outcome == Outcome::kOk && op.expected < m) {
        Fail(Verdict::kViolation,
             "a cas succeeded expecting version " + std::to_string(op.expected) + " but " + seen,
             {ops_[best], op});
        return false;
      }
    }
    return true;
  }

  // The state after ops_[i] takes effect in `s`, if it can.
  std::optional<State> Apply(const State& s, int i) const {
    const Op& op = ops_[i];
    bool present = s.value != kAbsent;
    auto assign = [&](State base) -> std::optional<State> {
      State t;
      t.value = must_by_[i] == INT64_MAX ? kUnread : i;
      if (version_[i].has_value()) {
        if (*version_[i] <= base.ver) return std::nullopt;  // versions must increase
        t.ver = *version_[i];
        t.exact = true;
      } else {
        t.ver = base.ver + 1;
        t.exact = false;
      }
      return t;
    };
    switch (op.type) {
      case OpType::kGet:
        if (op.outcome == Outcome::kNotFound) {
          if (present) return std::nullopt;
          return s;
        }
        if (s.value != read_of_[i]) return std::nullopt;
        if (s.exact && s.ver != op.version) return std::nullopt;
        return s;
      case OpType::kPut:
        return assign(s);
      case OpType::kInsert:
        if (op.outcome == Outcome::kExists) {
          if (!present) return std::nullopt;
          return s;
        }
        if (present) return std::nullopt;
        return assign(s);
      case OpType::kCas:
        if (op.outcome == Outcome::kNotFound) {
          if (present) return std::nullopt;
          return s;
        }
        if (!present) return std::nullopt;
        if (op.outcome == Outcome::kVersionMismatch) {
          if (s.exact && s.ver == op.expected) return std::nullopt;
          return s;
        }
        // ok or unknown (applied): the current version is the expected one.
        if (s.exact ? s.ver != op.expected : op.expected < s.ver) return std::nullopt;
        return assign(State{s.value, true, op.expected});
      case OpType::kDelete:
        if (op.outcome == Outcome::kNotFound) {
          if (present) return std::nullopt;
          return s;
        }
        if (!present) return std::nullopt;
        return State{kAbsent, s.exact, s.ver};
    }
    return std::nullopt;
  }

  // The search. Ops that must take effect (definite outcomes, and unknown writes a get
  // observed: before that get completes) are events on a list, calls and returns by time
  // (calls first at equal times: such ops count as concurrent), and are linearized just in
  // time: an op may go next when its call comes before the first return left on the list.
  // Unknown ops nobody observed have no return; they are tried after the definite candidates
  // of each configuration, each may go next once invoked before that first return, or never.
  void Search() {
    const auto start = Clock::now();
    const int n = static_cast<int>(ops_.size());
    struct Event {
      int64_t t;
      bool call;
      int op;
    };
    std::vector<Event> ev;
    std::vector<int> unknown;  // ops without a return, by invoke time
    std::vector<bool> optional(n, false);
    int definite = 0;
    std::vector<int> unknown_slot(n, -1);
    // Unknown ops of one class (type, and expected version for a cas) have the same effect:
    // of those invoked in time, only the latest unused is tried (using an earlier one instead
    // leaves the less flexible one pending). The next of the same class, by invoke time:
    std::vector<int> same_class_next;
    std::map<std::pair<OpType, uint64_t>, int> last_of_class;
    for (int i = 0; i < n; ++i) {
      if (must_by_[i] == INT64_MAX && options_.unknown_deadline_ns <= 0) {
        int slot = static_cast<int>(unknown.size());
        unknown_slot[i] = slot;
        unknown.push_back(i);
        same_class_next.push_back(-1);
        auto cls =
            std::make_pair(ops_[i].type, ops_[i].type == OpType::kCas ? ops_[i].expected : 0);
        auto [it, fresh] = last_of_class.emplace(cls, slot);
        if (!fresh) {
          same_class_next[it->second] = slot;
          it->second = slot;
        }
        continue;
      }
      ev.push_back({ops_[i].invoke_ns, true, i});
      if (must_by_[i] == INT64_MAX) {
        // Optional: an unknown op that takes effect before its deadline, or never.
        ev.push_back({ops_[i].complete_ns + options_.unknown_deadline_ns, false, i});
        optional[i] = true;
      } else {
        ev.push_back({must_by_[i], false, i});
        ++definite;
      }
    }
    std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) {
      return a.t != b.t ? a.t < b.t : (a.call && !b.call);
    });
    const int m = static_cast<int>(ev.size());
    const int head = m;
    std::vector<int> next(m + 1), prev(m + 1), match(m, -1), call_of(n, -1), dslot(n, -1);
    int d = 0;
    for (int e = 0; e < m; ++e) {
      if (ev[e].call) {
        call_of[ev[e].op] = e;
        dslot[ev[e].op] = d++;
      }
    }
    for (int e = 0; e < m; ++e) {
      if (!ev[e].call) match[call_of[ev[e].op]] = e;
    }
    next[head] = m > 0 ? 0 : -1;
    for (int e = 0; e < m; ++e) {
      prev[e] = e == 0 ? head : e - 1;
      next[e] = e + 1 < m ? e + 1 : -1;
    }
    auto unlink = [&](int e) {
      next[prev[e]] = next[e];
      if (next[e] >= 0) prev[next[e]] = prev[e];
    };
    auto relink = [&](int e) {
      next[prev[e]] = e;
      if (next[e] >= 0) prev[next[e]] = e;
    };
    // The first return on the list: the time before which a next op must have been invoked.
    auto first_return = [&]() {
      int e = next[head];
      while (e >= 0 && ev[e].call) e = next[e];
      return e;
    };

    std::mt19937_64 rng(0x6c696e636865636bull);
    std::vector<uint64_t> zobrist(n);
    for (auto& z : zobrist) z = rng();
    std::vector<uint64_t> bits((m / 2 + 63) / 64, 0), ubits((unknown.size() + 63) / 64, 0);
    auto flip = [](std::vector<uint64_t>& b, int i) { b[i / 64] ^= uint64_t{1} << (i % 64); };
    std::vector<int> class_of(unknown.size());
    std::vector<uint32_t> used_per_class(last_of_class.size(), 0);
    {
      std::map<std::pair<OpType, uint64_t>, int> index;
      for (auto& [cls, last] : last_of_class) index.emplace(cls, static_cast<int>(index.size()));
      for (size_t u = 0; u < unknown.size(); ++u) {
        const Op& o = ops_[unknown[u]];
        class_of[u] = index[{o.type, o.type == OpType::kCas ? o.expected : 0}];
      }
    }
    Memo memo(bits.size(), used_per_class.size());
    struct Frame {
      bool is_unknown;
      int pos;  // the call event, or the slot in `unknown`
      State before;
      bool skipped = false;  // an optional op past its deadline, not linearized
    };
    std::vector<Frame> stack;
    State state;
    uint64_t set_hash = 0;
    int remaining = definite;
    uint64_t steps = 0;     // loop iterations, for the budget checks
    size_t best_depth = 0;  // the deepest point where the search was stuck, for the report
    int best_stuck = -1;
    std::vector<int> best_linearized;
    State best_state;
    int64_t best_limit = 0;

    // Where the scan of the current configuration is: a call event (phase 0), else the next
    // slot of `unknown` to try (phase 1).
    bool phase_unknown = false;
    int entry = next[head];
    size_t uslot = 0;
    auto try_op = [&](int op) -> bool {
      std::optional<State> ns = Apply(state, op);
      if (!ns.has_value()) return false;
      bool unk = unknown_slot[op] >= 0;
      flip(unk ? ubits : bits, unk ? unknown_slot[op] : dslot[op]);
      if (unk) ++used_per_class[class_of[unknown_slot[op]]];
      uint64_t h = unk ? set_hash : set_hash ^ zobrist[op];
      if (!memo.Insert(bits, used_per_class, *ns, h ^ ns->Hash())) {
        flip(unk ? ubits : bits, unk ? unknown_slot[op] : dslot[op]);
        if (unk) --used_per_class[class_of[unknown_slot[op]]];
        return false;
      }
      ++report_->states;
      stack.push_back({unk, unk ? unknown_slot[op] : call_of[op], state});
      state = *ns;
      set_hash = h;
      return true;
    };
    while (remaining > 0) {
      if ((++steps & 0xffff) == 0) {
        bool memory = memo.bytes() > options_.max_memo_bytes;
        bool time =
            options_.max_seconds > 0 &&
            std::chrono::duration<double>(Clock::now() - start).count() > options_.max_seconds;
        if (memory || time) {
          Fail(Verdict::kUnknown,
               "the search explored " + std::to_string(report_->states) +
                   " configurations and reached its " +
                   (memory ? "memory budget (--max_memo_mb)" : "time budget (--max_seconds)") +
                   "; ops of unknown outcome multiply the orders to try: see README "
                   "(--unknown_deadline_ms)",
               {});
          return;
        }
      }
      if (!phase_unknown) {
        if (entry >= 0 && ev[entry].call) {
          if (try_op(ev[entry].op)) {
            if (!optional[ev[entry].op]) --remaining;
            unlink(entry);
            unlink(match[entry]);
            entry = next[head];
          } else {
            entry = next[entry];
          }
          continue;
        }
        if (entry >= 0 && optional[ev[entry].op]) {
          // An optional op's deadline: from here it never takes effect.
          int op = ev[entry].op, call = call_of[op];
          flip(bits, dslot[op]);
          uint64_t h = set_hash ^ zobrist[op];
          if (memo.Insert(bits, used_per_class, state, h ^ state.Hash())) {
            ++report_->states;
            stack.push_back({false, call, state, true});
            set_hash = h;
            unlink(call);
            unlink(entry);
            entry = next[head];
            continue;
          }
          flip(bits, dslot[op]);
        }
        phase_unknown = true;
        uslot = 0;
        continue;
      }
      int ret = first_return();
      int64_t limit = ev[ret].t;
      bool moved = false;
      for (; uslot < unknown.size() && ops_[unknown[uslot]].invoke_ns <= limit; ++uslot) {
        auto used = [&](size_t u) { return (ubits[u / 64] >> (u % 64)) & 1; };
        if (used(uslot)) continue;
        bool later = false;  // an unused op of the class invoked later, still in time
        for (int u = same_class_next[uslot]; u >= 0 && !later; u = same_class_next[u]) {
          if (ops_[unknown[u]].invoke_ns > limit) break;
          later = !used(static_cast<size_t>(u));
        }
        if (later) continue;
        if (try_op(unknown[uslot])) {
          moved = true;
          break;
        }
      }
      if (moved) {
        phase_unknown = false;
        entry = next[head];
        continue;
      }
      // Stuck: no op can go before that return. Backtrack.
      if (best_stuck < 0 || stack.size() > best_depth) {
        best_depth = stack.size();
        best_stuck = ev[ret].op;
        best_linearized.clear();
        for (const Frame& f : stack) {
          if (!f.skipped) best_linearized.push_back(f.is_unknown ? unknown[f.pos] : ev[f.pos].op);
        }
        best_limit = ev[ret].t;
        best_state = state;
      }
      if (stack.empty()) {
        Report(best_stuck, best_limit, best_linearized, best_state);
        return;
      }
      Frame f = stack.back();
      stack.pop_back();
      state = f.before;
      if (f.is_unknown) {
        flip(ubits, f.pos);
        --used_per_class[class_of[f.pos]];
        phase_unknown = true;
        uslot = static_cast<size_t>(f.pos) + 1;
      } else {
        int op = ev[f.pos].op;
        flip(bits, dslot[op]);
        set_hash ^= zobrist[op];
        if (!optional[op]) ++remaining;
        relink(match[f.pos]);
        relink(f.pos);
        if (f.skipped) {  // the last choice of its configuration: on to the unknown ops
          phase_unknown = true;
          uslot = 0;
        } else {
          phase_unknown = false;
          entry = next[f.pos];
        }
      }
    }
  }

  std::string StateString(const State& s) const {
    std::string v = s.exact ? std::to_string(s.ver) : ">=" + std::to_string(s.ver);
    if (s.value == kAbsent) return "absent (last version " + v + ")";
    if (s.value == kUnread) return "present(a value no get returned, version " + v + ")";
    return "present(\"" + ops_[s.value].value + "\", version " + v + ")";
  }

  void Report(int stuck, int64_t limit, const std::vector<int>& linearized, const State& s) {
    KeyReport& r = *report_;
    r.verdict = Verdict::kViolation;
    if (stuck < 0) {
      r.explanation = "no linearization exists";
      return;
    }
    const Op& st = ops_[stuck];
    r.explanation = "no linearization: after the longest linearizable prefix (" +
                    std::to_string(linearized.size()) + " ops), no order of the ops below " +
                    "lets " + std::string(OpTypeName(st.type)) + " by client " +
                    std::to_string(st.client) + " complete";
    r.state_before = StateString(s);
    size_t from =
        linearized.size() > options_.context_ops ? linearized.size() - options_.context_ops : 0;
    for (size_t i = from; i < linearized.size(); ++i) r.context.push_back(ops_[linearized[i]]);
    std::vector<bool> done(ops_.size(), false);
    for (int i : linearized) done[i] = true;
    // The window: every op not linearized that was invoked before the stuck op had to take
    // effect; of the unknown ops that may never apply, those invoked since the earliest
    // definite op of the window (older ones are counted).
    int64_t earliest = INT64_MAX;
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (!done[i] && must_by_[i] != INT64_MAX && ops_[i].invoke_ns <= limit) {
        earliest = std::min(earliest, ops_[i].invoke_ns);
      }
    }
    size_t older_unknown = 0;
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (done[i] || ops_[i].invoke_ns > limit) continue;
      if (must_by_[i] == INT64_MAX && ops_[i].invoke_ns < earliest) {
        ++older_unknown;
        continue;
      }
      r.window.push_back(ops_[i]);
    }
    if (older_unknown > 0) {
      r.explanation += " (" + std::to_string(older_unknown) +
                       " older ops of unknown outcome, never applied in that prefix, not shown)";
    }
  }

  std::vector<Op> all_;
  const CheckOptions& options_;
  KeyReport* report_;
  std::vector<Op> ops_;                           // the ops that may have had an effect
  std::vector<std::optional<uint64_t>> version_;  // a write's version, when known
  std::vector<int> read_of_;                      // a get's write (index into ops_)
  // When an op must have taken effect: its completion, or for an unknown write the first
  // completion of a get that observed it; INT64_MAX: maybe never.
  std::vector<int64_t> must_by_;
};

}  // namespace

KeyReport CheckKey(const std::string& key, std::vector<Op> ops, const CheckOptions& options) {
  KeyReport r;
  r.key = key;
  auto start = Clock::now();
  KeyChecker(std::move(ops), options, &r).Run();
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

CheckResult CheckHistory(const std::vector<Op>& ops, const CheckOptions& options) {
  auto start = Clock::now();
  std::map<std::string, std::vector<Op>> by_key;
  for (const Op& op : ops) by_key[op.key].push_back(op);
  std::vector<std::pair<std::string, std::vector<Op>>> keys(std::make_move_iterator(by_key.begin()),
                                                            std::make_move_iterator(by_key.end()));
  CheckResult result;
  result.ops = ops.size();
  result.keys.resize(keys.size());
  int threads =
      options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(1, std::min<int>(threads, static_cast<int>(keys.size())));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < keys.size(); i = next++) {
      result.keys[i] = CheckKey(keys[i].first, std::move(keys[i].second), options);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (const KeyReport& k : result.keys) {
    if (static_cast<int>(k.verdict) > static_cast<int>(result.verdict)) result.verdict = k.verdict;
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

std::string FormatOp(const Op& op, int64_t origin_ns) {
  std::string s =
      "c" + std::to_string(op.client) + " " + std::string(OpTypeName(op.type)) + "(" + op.key;
  if (op.type == OpType::kCas) s += ", expected=" + std::to_string(op.expected);
  if (IsWrite(op.type)) s += ", \"" + op.value + "\"";
  s += ") -> " + std::string(OutcomeName(op.outcome));
  if (op.outcome == Outcome::kOk && op.type == OpType::kGet) s += " \"" + op.value + "\"";
  if (op.outcome == Outcome::kOk && op.type != OpType::kDelete) {
    s += " v" + std::to_string(op.version);
  }
  char t[96];
  if (op.outcome == Outcome::kUnknown) {
    std::snprintf(t, sizeof(t), "  [+%.3f ms, +%.3f ms (unknown: may apply any time after invoke)]",
                  (op.invoke_ns - origin_ns) / 1e6, (op.complete_ns - origin_ns) / 1e6);
  } else {
    std::snprintf(t, sizeof(t), "  [+%.3f ms, +%.3f ms]", (op.invoke_ns - origin_ns) / 1e6,
                  (op.complete_ns - origin_ns) / 1e6);
  }
  return s + t;
}

std::string FormatReport(const CheckResult& r) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "verdict: %s\nops: %zu, keys: %zu, time: %.3f s\n",
                std::string(VerdictName(r.verdict)).c_str(), r.ops, r.keys.size(), r.seconds);
  out += line;
  out += "per key:  key  ops (get put insert cas delete)  unknown fail  states  seconds  verdict\n";
  for (const KeyReport& k : r.keys) {
    std::snprintf(line, sizeof(line),
                  "  %s  %zu (%zu %zu %zu %zu %zu)  %zu %zu  %" PRIu64 "  %.3f  %s\n",
                  k.key.c_str(), k.ops, k.gets, k.puts, k.inserts, k.cas, k.deletes, k.unknown,
                  k.failed, k.states, k.seconds, std::string(VerdictName(k.verdict)).c_str());
    out += line;
  }
  for (const KeyReport& k : r.keys) {
    if (k.verdict == Verdict::kLinearizable) continue;
    out += "\nkey " + k.key + ": " + std::string(VerdictName(k.verdict)) + "\n  " + k.explanation +
           "\n";
    int64_t origin = INT64_MAX;
    for (const Op& op : k.context) origin = std::min(origin, op.invoke_ns);
    for (const Op& op : k.window) origin = std::min(origin, op.invoke_ns);
    if (!k.state_before.empty()) {
      if (!k.context.empty()) {
        out += "  last linearized ops:\n";
        for (const Op& op : k.context) out += "    " + FormatOp(op, origin) + "\n";
      }
      out += "  state after them: " + k.state_before + "\n";
    }
    if (!k.window.empty()) {
      out += "  operations that cannot be linearized (" + std::to_string(k.window.size()) + "):\n";
      for (const Op& op : k.window) out += "    " + FormatOp(op, origin) + "\n";
    }
  }
  return out;
}

}  // namespace rdkv::history
