// A request's match cursors over its corpora, moved and read together, so that one
// verification step crosses into C++ once instead of once per corpus.
//
// No policy lives here: the set reports every corpus's match length, and copies a
// continuation from the slot the caller picks. Which corpus wins, and how many tokens
// to draft, is decided in Python (agspec.policy).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "match_cursor.h"
#include "token_index.h"
#include "workers.h"

namespace agspec {

class CursorSet;

// The read guards of one batched call: the calling thread enters each index once for
// all the batch's cursors over it (one per cursor and call would cost two atomic
// operations each, on counters that bounce between cores once helpers read too), and
// leaves them when this goes. Helpers read under them.
class BatchReads {
 public:
  BatchReads(CursorSet* const* sets, size_t n);
  ~BatchReads();
  BatchReads(const BatchReads&) = delete;
  BatchReads& operator=(const BatchReads&) = delete;
  // Whether cursor k of set i may read its index now (false: another thread's writer
  // stayed inside past the patience); raises StateError when the index was closed.
  bool readable(size_t set, size_t cursor) const;

 private:
  enum class Access : uint8_t { kHeld, kBusy, kClosed };
  std::vector<uint32_t> first_;             // first_[i]: set i's first entry in access_
  std::vector<Access> access_;              // one per (set, cursor), in order
  std::vector<const TokenIndex*> entered_;  // live indexes entered (each once)
};

class CursorSet {
 public:
  // A cursor over `index`, fed `tail` (the request's last tokens); returns its slot.
  size_t add_cursor(std::shared_ptr<TokenIndex> index, int32_t max_match, const Token* tail,
                    size_t n);
  // A document that every advance() appends the committed tokens to, after the cursors
  // have moved (so a cursor never matches the tokens it was just fed).
  void add_append(std::shared_ptr<TokenIndex> index, int64_t doc_id);
  // Stops appending to `index` (a session that stopped indexing new tokens).
  void remove_append(const TokenIndex* index);

  // One verification step: every cursor is fed `tokens`, then every append target grows.
  // Never raises for a busy index (another thread's writer inside past the patience): a
  // busy cursor matches the tokens once it can read again (answering 0 and copying
  // nothing until then), and a busy document gets them at the next advance or flush, in
  // order. A closed append target is dropped; a closed cursor index raises StateError.
  void advance(const Token* tokens, size_t n);
  // Appends what a busy document still waits for (once, without raising for a busy one).
  void flush();
  // The current match length of every slot, in slot order, into out[0 .. size()).
  void match_lengths(int32_t* out);
  std::vector<Token> continuation(size_t slot, size_t max_tokens, ContinuationRule rule,
                                  size_t max_occurrences);
  size_t size() const { return cursors_.size(); }
  // The source preference over the slots, least preferred first: (slot, margin) pairs.
  // A slot wins over every slot before it when its match is longer than theirs by more
  // than its margin; the last winner is picked (agspec.corpora.corpus_set.CorpusSet.pick,
  // the reference). Slots outside [0, size()) raise ArgumentError.
  void set_order(std::vector<std::pair<int32_t, int32_t>> order);
  // The slot that order picks for these match lengths (one per slot), or -1.
  int32_t pick(const int32_t* lengths) const;
  // pick() of these lengths as (slot, its length), (-1, 0) when none was picked or its
  // match is shorter than min_match.
  std::pair<int32_t, int32_t> pick_at_least(const int32_t* lengths, int32_t min_match) const;
  // match_lengths(), then pick_at_least(): one request's step in one call.
  std::pair<int32_t, int32_t> match_pick(int32_t min_match);

 private:
  friend class BatchReads;
  friend class AdvanceBatch;
  friend class ContinuationGroupsRun;
  friend void match_lengths_batch(CursorSet* const*, size_t, int32_t*);
  friend void continuation_batch(CursorSet* const*, const int64_t*, const int64_t*,
                                 const ContinuationRule*, size_t, size_t, std::vector<Token>*);
  friend void continuation_groups(CursorSet* const*, const int64_t*, size_t, const int64_t*,
                                  const int64_t*, const ContinuationRule*, size_t,
                                  std::vector<Token>*, const std::function<void(size_t)>&);
  // advance() in its parts, for advance_batch's phases: the ids checked (ArgumentError),
  // every cursor fed, then each append target extended (closed ones marked, then dropped).
  // With `reads`, the cursors read under the batch's guards instead of their own.
  static void check_ids(const Token* tokens, size_t n);
  // With `reads`, set `self` of the batch it was taken for.
  void advance_cursors(const Token* tokens, size_t n, const BatchReads* reads = nullptr,
                       size_t self = 0);
  // A set of up to this many cursors is fed by turns (advance_interleaved), each cursor's
  // index held for reading (readable[i]: not busy) for the whole call.
  static constexpr size_t kInterleaved = 8;
  bool readable_all(const BatchReads& reads, size_t self, bool* readable) const;
  void advance_interleaved(const Token* tokens, size_t n, const bool* readable);
  void match_lengths_in(int32_t* out, const BatchReads& reads, size_t self);
  std::vector<Token> continuation_in(size_t slot, size_t max_tokens, ContinuationRule rule,
                                     size_t max_occurrences, const BatchReads& reads, size_t self);
  // Entries from .. to - 1 of one group (slots[j] < 0 or max_tokens[j] <= 0: nothing to
  // copy, out[j] left), copied into out[j] as continuation() / continuation_in() would,
  // each run of entries of one slot by one MatchCursor::continuations_read.
  void copy_entries(size_t from, size_t to, const int64_t* slots, const int64_t* max_tokens,
                    const ContinuationRule* rules, size_t max_occurrences, const BatchReads* reads,
                    size_t self, std::vector<Token>* out);
  void append_at(size_t k, const Token* tokens, size_t n);
  void drop_closed_appends();
  std::vector<std::pair<int32_t, int32_t>> order_;
  std::vector<MatchCursor> cursors_;
  // indexes_[i] is cursors_[i]'s index. The set holds it (the cursor alone holds it
  // weakly), so a step need not take a weak reference per cursor: the memory of a
  // closed index goes when the request's set does; a closed index still raises.
  std::vector<std::shared_ptr<TokenIndex>> indexes_;
  struct Append {
    std::shared_ptr<TokenIndex> index;
    int64_t doc_id;
    std::vector<Token> pending;           // committed tokens not appended yet (the index was busy)
    uint32_t slot = TokenIndex::kNoSlot;  // where the document lives in the index
    bool closed = false;                  // the index was closed: drop_closed_appends drops it
  };
  bool append(Append& a, const Token* tokens, size_t n);  // false: the index was closed
  std::vector<Append> appends_;
};

// advance() for many sets, sets[i] taking tokens[i] (lengths[i] of them); a set that
// raises does not stop the others (the first error, in set order, is raised once all
// have moved). The result is the same as advance() of each set in turn:
//  - A large batch of distinct sets runs in two phases on batch_threads() threads
//    (workers.h): every set's cursors (they only read), then every append, one task per
//    index taking its documents' tokens in set order, so the positions are numbered as
//    in turn. A cursor that moved before another set's append finds that match when it
//    is next read (MatchCursor::sync checks the new positions), so every match length
//    and continuation is the one the turn-by-turn order gives.
//  - One difference: an append that raises (not StateError: a removed document, a full
//    index) does not stop the set's other appends.
// Asking for the next sets' memory ahead was tried and measured slower.
void advance_batch(CursorSet* const* sets, const Token* const* tokens, const size_t* lengths,
                   size_t n);

// advance_batch in two halves, for a caller with other work to do meanwhile (an engine
// step's policy update): the constructor enters the indexes and hands the cursors' phase
// to the helpers; finish() runs what is left of it on the caller, then the appends, and
// raises the first error, as advance_batch. Where advance_batch runs on the caller alone,
// everything happens in finish(). Until finish() the arrays must stay valid and nothing
// may touch these sets, and their indexes are held for reading (a writer in another
// thread waits, then gives up as it does for any reader). The destructor finishes
// (dropping the error) when finish() was not called.
class AdvanceBatch {
 public:
  AdvanceBatch(CursorSet* const* sets, const Token* const* tokens, const size_t* lengths, size_t n);
  AdvanceBatch(const AdvanceBatch&) = delete;
  AdvanceBatch& operator=(const AdvanceBatch&) = delete;
  ~AdvanceBatch();
  void finish();

 private:
  void appends();  // the second phase, once every cursor moved
  CursorSet* const* sets_;
  const Token* const* tokens_;
  const size_t* lengths_;
  size_t n_;
  bool parallel_;
  bool finished_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<char> moved_;  // the set's cursors moved: its appends follow
  std::unique_ptr<BatchReads> reads_;
  TaskRun cursors_;
};
// A caller about to step num_sets sets in batches (an engine step, before its own work on
// the committed tokens): gets the helper threads up when the batch will use them.
void prepare_batch(size_t num_sets);
// match_lengths() of many sets into out, set after set (on batch_threads() threads for a
// large batch; the first error, in set order, is raised).
void match_lengths_batch(CursorSet* const* sets, size_t n, int32_t* out);
// match_lengths_batch, then each set's pick (CursorSet::pick) of its lengths: picks[2i] is
// set i's slot (-1: none picked, or a match shorter than min_match) and picks[2i + 1] that
// slot's match length (0 with -1).
void match_picks_batch(CursorSet* const* sets, size_t n, int32_t min_match, int32_t* picks);
// continuation() of many sets: out[i] gets sets[i]'s continuation from slots[i], at most
// max_tokens[i] tokens (nothing when slots[i] < 0 or max_tokens[i] <= 0). Threads and
// errors as match_lengths_batch.
void continuation_batch(CursorSet* const* sets, const int64_t* slots, const int64_t* max_tokens,
                        const ContinuationRule* rules, size_t max_occurrences, size_t n,
                        std::vector<Token>* out);

// continuation_batch() of entries that come in groups, each of one set: group g is the
// next counts[g] (slot, length, rule) entries, all copied from sets[g] into out. When the
// sets are distinct the groups are copied on the helper threads (as continuation_batch's
// requests), and done(g) runs right after group g, on the thread that copied it (its
// caller's work on that group's copies: merging them). Errors as continuation_batch.
void continuation_groups(CursorSet* const* sets, const int64_t* counts, size_t num_groups,
                         const int64_t* slots, const int64_t* max_tokens,
                         const ContinuationRule* rules, size_t max_occurrences,
                         std::vector<Token>* out, const std::function<void(size_t)>& done);

// continuation_groups in parts, for a caller with other work to do while the helpers
// copy (a batch step's tree candidates, copied while Python plans the chains):
//  - the constructor enters the sets' indexes for reading, as one batched call does, and
//    stays inside until finish(), so that no writer changes them meanwhile;
//  - match_lengths() reads every set's match lengths (match_lengths_batch's layout) under
//    those reads, bringing every cursor up to date;
//  - start() hands the groups (continuation_groups' arrays) to the helpers;
//  - finish(wanted) skips the groups not wanted (wanted[g] == 0) that no helper has begun,
//    copies on the caller the wanted ones no helper has taken, and returns once every
//    group begun is done, raising the first error of a wanted group (in group order).
//    out[] of an unwanted group is left as it is or copied.
// Where continuation_groups would run on the caller alone (a small batch, a set listed
// twice, no helpers), nothing is entered and finish() copies the wanted groups.
// Between start() and finish() the arrays must stay valid and nothing may move the sets;
// their continuations may be copied (a cursor changes only when its index did, and none
// can), though a writer of another thread that comes meanwhile makes such a copy wait out
// the patience and find its index busy. The destructor finishes wanting none.
class ContinuationGroupsRun {
 public:
  ContinuationGroupsRun(CursorSet* const* sets, size_t num_groups);
  ContinuationGroupsRun(const ContinuationGroupsRun&) = delete;
  ContinuationGroupsRun& operator=(const ContinuationGroupsRun&) = delete;
  ~ContinuationGroupsRun();
  void match_lengths(int32_t* out);
  void start(const int64_t* counts, const int64_t* slots, const int64_t* max_tokens,
             const ContinuationRule* rules, size_t max_occurrences, std::vector<Token>* out);
  void finish(const char* wanted);

 private:
  void group(size_t g);  // group g's copies, unless it was skipped
  CursorSet* const* sets_;
  size_t n_;
  bool parallel_;
  bool started_ = false;
  bool finished_ = false;
  const int64_t* slots_ = nullptr;
  const int64_t* max_tokens_ = nullptr;
  const ContinuationRule* rules_ = nullptr;
  size_t max_occurrences_ = 0;
  std::vector<Token>* out_ = nullptr;
  std::vector<size_t> start_;  // group g is entries start_[g] .. start_[g + 1]
  std::unique_ptr<std::atomic<bool>[]> skip_;
  std::vector<std::exception_ptr> errors_;
  std::unique_ptr<BatchReads> reads_;
  TaskRun run_;  // last: it finishes before what its tasks read goes
};

}  // namespace agspec
