// AgSpec native token index: many append-only documents of int32 token ids, indexed by
// one suffix automaton (its extra transitions: edge_table.h; the cursors that track the
// longest suffix of a request that occurs in the index: match_cursor.h).
//
// No Python and no drafting policy lives here: token sequences in, matches and
// continuations out. The one binding file is native_bindings.cc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "edge_table.h"
#include "large_pages.h"
#include "token.h"

namespace agspec {

// A caller passed something the index cannot take (negative id, frozen index, ...).
class ArgumentError : public std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// A document id that is not in the index, or was removed.
class DocumentError : public std::out_of_range {
  using std::out_of_range::out_of_range;
};
// A saved index file that is truncated, corrupt, foreign or of another version.
class FormatError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The index was closed, or is being changed by another thread.
class StateError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Which occurrence of a match a continuation copies from. These are retrieval rules, not
// drafting policy: the drafter (agspec.policy) picks one per corpus by name, and the
// index only copies. They live here because each reads up to 64 occurrences and their next
// tokens, which costs several times more from Python (docs/index.md, "Why the rules are
// native").
enum class ContinuationRule : int32_t {
  // The most frequent group of next-3 tokens among the max_occurrences most recent
  // occurrences, ties to the group of the most recent one; copies from its most recent.
  kFrequent = 0,
  kFirst = 1,   // the earliest occurrence
  kRecent = 2,  // the most recent occurrence
  // Token by token, the majority next token among the occurrences that agree with the
  // draft so far (ties: most recent), while at least a tenth of them back it.
  kVote = 3,
  // The k-th most recent occurrence, k = 2 .. 8 (nothing when the match has fewer): the
  // token tree's other candidates (docs/trees.md). kRecent is k = 1.
  kRecent2 = 4,
  kRecent3 = 5,
  kRecent4 = 6,
  kRecent5 = 7,
  kRecent6 = 8,
  kRecent7 = 9,
  kRecent8 = 10,
};

// k for the rules kRecent2 .. kRecent8 (2 .. 8), else 0.
inline size_t recent_rank(ContinuationRule rule) {
  const auto code = static_cast<int32_t>(rule);
  constexpr auto lo = static_cast<int32_t>(ContinuationRule::kRecent2);
  constexpr auto hi = static_cast<int32_t>(ContinuationRule::kRecent8);
  return code >= lo && code <= hi ? size_t(code - lo + 2) : 0;
}

// Raises ArgumentError unless every token id is >= 0 (extend's and a cursor's check).
void check_tokens(const Token* tokens, size_t n);

struct Occurrence {
  int64_t doc_id;
  int64_t end_offset;  // offset in its document of the match's last token
};

// Threads: every public method of TokenIndex may be called from any thread. Readers
// (queries through cursors, save, document, the counters) run concurrently with each
// other; a writer (extend, remove) runs alone. A call that would overlap one of the other
// kind raises StateError instead of waiting or racing, and after close() every call
// raises StateError. A MatchCursor belongs to one thread at a time.
class TokenIndex {
 public:
  TokenIndex();

  // Appends tokens to document doc_id (created on first use). Token ids must be >= 0.
  // slot_hint (a caller that appends to one document again and again: a cursor set)
  // remembers where the document lives, so that later calls skip the id lookup; start
  // it at kNoSlot. A stale or foreign hint is only slower, never wrong.
  static constexpr uint32_t kNoSlot = ~uint32_t{0};
  void extend(int64_t doc_id, const Token* tokens, size_t n, uint32_t* slot_hint = nullptr);
  // Drops a document. Rebuilds the automaton from the remaining documents, in their
  // original insertion order (O(total tokens)); live cursors re-synchronize.
  void remove(int64_t doc_id);

  bool contains(int64_t doc_id) const;
  // A copy: the document may grow once the call has returned.
  std::vector<Token> document(int64_t doc_id) const;
  std::vector<int64_t> document_ids() const;
  size_t num_documents() const;
  size_t num_tokens() const;
  // Positions indexed: every token that has a successor in its document.
  size_t num_positions() const;
  size_t num_states() const;
  size_t num_bytes() const;
  // Read-only: loaded from a file, or frozen. extend and remove then raise ArgumentError.
  bool frozen() const { return frozen_.load(std::memory_order_acquire); }
  // Makes the index read-only for good (a global corpus once built): its queries can
  // then keep answers that only a change could make stale.
  void freeze();

  // Runs fn with the index held for writing, as extend holds it: other threads' calls
  // find a writer inside for as long as fn runs. For tests that need a writer known to
  // be busy at a given moment (fn waits on an event), not one that is busy by timing.
  void hold_for_writing(const std::function<void()>& fn);

  // Writes <path>.tmp.<pid>.<n>, then renames it over path: concurrent saves to one
  // path each write a whole file, and the last rename wins.
  void save(const std::string& path) const;
  // Reads and verifies a saved index (checksum, then every structural invariant), so a
  // file edited with a recomputed checksum raises FormatError instead of crashing or
  // hanging a later query. The result is frozen (read-only).
  static std::shared_ptr<TokenIndex> load(const std::string& path);
  // Checks every invariant load checks, on this index (O(size)); raises FormatError.
  void verify() const;

  // Marks the index closed: from now on every call (and every cursor's) raises
  // StateError. Calls already running finish; the memory goes with the last shared_ptr.
  void close() { closed_.store(true); }
  bool closed() const { return closed_.load(); }

  // Holds the index for reading for its lifetime (the guard every reader takes).
  class Reading {
   public:
    explicit Reading(const TokenIndex& idx);
    // Gives up instead of raising when a writer stays inside past the patience: held()
    // is then false (a closed index still raises). For a step that can do without this
    // index for now (a cursor set's).
    Reading(const TokenIndex& idx, std::nothrow_t);
    ~Reading();
    Reading(const Reading&) = delete;
    Reading& operator=(const Reading&) = delete;
    bool held() const { return held_; }

   private:
    const TokenIndex& idx_;
    bool counted_;  // false for a frozen index, which no writer can enter
    bool held_ = true;
  };

 private:
  friend class MatchCursor;
  friend class BatchReads;  // enters and leaves reads for a whole batched call
  class Writing;

  struct Doc {
    int64_t id;
    LargeVector<Token> tokens;
    int32_t last_state;  // state of the document's indexed prefix (all tokens but the last)
    bool removed;
  };

  // --- used by MatchCursor, inside a Reading ----------------------------------------
  int32_t transition(int32_t state, Token t) const {
    if (st_[state].in_tok == t) return st_[state].in_tgt;
    return st_[state].edge_head == -1 ? -1 : edges_.get(state, t);
  }
  // Asks for the cache lines transition(state, t) reads (no effect on results).
  void prefetch_transition(int32_t state, Token t) const {
    __builtin_prefetch(st_.data() + state);
    edges_.prefetch(state, t);
  }
  int32_t state_len(int32_t s) const { return st_[s].len; }
  int32_t state_link(int32_t s) const { return st_[s].link; }
  uint64_t epoch() const { return epoch_; }
  size_t positions_size() const { return pos_doc_.size(); }
  // pos_tok_ when the index keeps it (a live index), else nullptr.
  const Token* position_tokens() const {
    return pos_tok_.size() == pos_doc_.size() ? pos_tok_.data() : nullptr;
  }
  Token position_token(uint32_t g) const {
    return g < pos_tok_.size() ? pos_tok_[g] : docs_[pos_doc_[g]].tokens[pos_off_[g]];
  }
  // Most recent first; at most max_count (any value: it is not used as a size).
  std::vector<uint32_t> recent_positions(int32_t state, size_t max_count) const;
  uint32_t first_position(int32_t state) const { return st_[state].first_pos; }
  uint32_t last_position(int32_t state) const { return st_[state].last_pos; }
  Occurrence occurrence(uint32_t pos) const;
  // Copies up to max_tokens tokens after position pos into out (no allocation).
  void next_tokens(uint32_t pos, Token* out, size_t max_tokens) const;
  // Cache hints for a batch of positions (no effect on results).
  void prefetch_position(uint32_t pos) const;

  void prefetch_next_tokens(uint32_t pos) const;
  // Tokens after position pos in its document, at most max_tokens (any value).
  std::vector<Token> tokens_after(uint32_t pos, size_t max_tokens) const;
  // Length of the common suffix of `tail` (last element = most recent) and the
  // document text ending at position pos, at most max_len.
  size_t common_suffix(uint32_t pos, const Token* tail, size_t tail_len, size_t max_len) const;

  // --- access control ---------------------------------------------------------------
  // access_: the number of readers inside, plus kWriting while a writer is inside.
  static constexpr uint32_t kWriting = uint32_t{1} << 31;
  void enter_read() const;
  bool try_enter_read() const;  // false: a writer stayed inside past the patience
  void exit_read() const;
  void enter_write();
  void exit_write();

  int32_t new_state(int32_t len);
  int32_t clone_state(int32_t q, int32_t len);
  void attach_front(int32_t child, int32_t parent);
  void move_to_front(int32_t child);
  int32_t sam_extend(int32_t last, Token c);
  void add_edge(int32_t s, Token t, int32_t target);
  void insert_position(uint32_t doc, uint32_t offset);
  void reset_automaton();
  // The slot of document doc_id, created when new (hint: where it was last time).
  uint32_t doc_for_write(int64_t doc_id, uint32_t hint);
  const Doc* live_doc(int64_t doc_id) const;
  void check_structure(const std::string& what) const;

  std::vector<Doc> docs_;
  std::unordered_map<int64_t, uint32_t> doc_slot_;
  size_t num_live_docs_ = 0;
  size_t num_tokens_ = 0;

  // Suffix automaton. State 0 is the root. One struct per state, so a step touches one
  // cache line. Invariants (check_structure verifies each of them):
  //  len          length of the longest string of the state; its strings have lengths
  //               (st_[link].len, len]. 0 only for the root.
  //  link         suffix link (-1 for the root); st_[link].len < len, so links form a
  //               tree rooted at 0.
  //  first_child, next_sib, prev_sib: link-tree children, sorted by last_pos descending.
  //  own_head     most recent position whose longest string (its document prefix) is in
  //               the state, and is the state's longest string; own_next_ chains a
  //               state's owned positions, most recent first (strictly decreasing).
  //  edge_head    first extra transition (see below), -1 when none.
  //  in_tok/in_tgt the first transition, inline (in_tok = -1 when none): most states have
  //               one; the others go to the hash table edges_, chained per state through
  //               edge_next_ for cloning (edge_token_ holds their tokens). Every
  //               transition s -t-> q has st_[q].len > st_[s].len.
  //  first_pos    earliest end position of the state's strings (never changes once set).
  //  last_pos     most recent end position of its strings = max over the link subtree.
  struct State {
    int32_t len, link, first_child, next_sib, prev_sib, own_head, edge_head;
    Token in_tok;
    int32_t in_tgt;
    uint32_t first_pos, last_pos;
  };
  LargeVector<State> st_;
  EdgeTable edges_;
  LargeVector<int32_t> edge_next_;
  LargeVector<Token> edge_token_;

  // Positions in insertion order (the global clock that "most recent" refers to). A
  // document's positions are its offsets 0, 1, ..., in this order.
  LargeVector<uint32_t> pos_doc_, pos_off_;
  // pos_tok_[g]: the token position g ends with, kept by a live index (empty once frozen,
  // and in a loaded one: neither grows), so that a cursor re-checking the positions
  // added since its last step reads one array instead of three (MatchCursor::sync).
  LargeVector<Token> pos_tok_;
  LargeVector<int32_t> own_next_;

  uint64_t epoch_ = 0;  // bumped when positions are renumbered (remove)

  // recent_positions() answers for states with large subtrees, each valid while its
  // state's last_pos is what it was (no new position in the subtree) and the epoch
  // holds; no effect on results, only on their cost.
  struct RecentEntry {
    std::vector<uint32_t> positions;  // most recent first
    uint32_t last_pos;                // the state's last_pos when they were read
    bool complete;                    // the subtree has no more positions than these
  };
  static constexpr size_t kRecentCacheEntries = 4096;
  mutable std::mutex recent_cache_mu_;
  mutable std::unordered_map<int32_t, RecentEntry> recent_cache_;
  mutable uint64_t recent_cache_epoch_ = ~uint64_t{0};
  // A frozen index never changes, so the occurrence the kFrequent rule picks for a state
  // is fixed. The rule reads up to 64 occurrences at random places of a large index (the
  // global corpus) each time, so a frozen index keeps every state's pick at the
  // drafter's kPickOccurrences (frequent_picks_[state], 4 bytes a state, built by freeze
  // and load in one pass over the suffix-link tree: build_frequent_picks), and remembers
  // the picks asked at other counts as they come (bounded; starts over when full).
  static constexpr size_t kPickOccurrences = 32;
  static constexpr size_t kPickDepth = 4096;         // levels of the walk (see the .cc)
  static constexpr uint32_t kNoPick = ~uint32_t{0};  // a state left to the lazy path
  LargeVector<uint32_t> frequent_picks_;             // empty until frozen
  void build_frequent_picks();
  void pick_subtree(int32_t top, uint32_t* picks) const;  // one root subtree's picks
  // The kFrequent rule's choice among positions (most recent first; 1 <= n <= 64).
  uint32_t frequent_choice(const uint32_t* positions, size_t n) const;
  struct FrequentEntry {
    uint32_t position;
    uint32_t max_occurrences;
  };
  static constexpr size_t kFrequentCacheEntries = size_t{1} << 16;
  mutable std::mutex frequent_cache_mu_;
  mutable std::unordered_map<int32_t, FrequentEntry> frequent_cache_;
  std::atomic<bool> frozen_{false};
  mutable std::atomic<uint32_t> access_{0};
  std::atomic<bool> closed_{false};
};

}  // namespace agspec
