// A cursor over one TokenIndex: the longest suffix of a request's tokens that occurs in
// the index, kept incrementally, and the continuations after its occurrences.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "token_index.h"

namespace agspec {

// Tracks the longest suffix (at most max_match tokens) of the fed tokens that occurs in
// the index with at least one token after it. Amortized O(1) per fed token. Holds the
// index weakly: after the index is closed every call raises StateError. Each call holds
// the index for reading (TokenIndex::Reading), so it raises StateError while a writer
// is inside, and a writer raises StateError while it runs.
class MatchCursor {
 public:
  MatchCursor(std::shared_ptr<TokenIndex> index, int32_t max_match);

  void extend(const Token* tokens, size_t n);
  int32_t match_length();
  // For a caller that holds `idx`, this cursor's index, alive (CursorSet): the same
  // without taking the weak reference; the tokens are checked (>= 0). These never raise
  // for a busy index (a writer inside past the patience): extend_held keeps the tokens
  // and matches them once it can read again, match_length_held then answers 0 and
  // continuation_held nothing. A closed index still raises StateError.
  void extend_held(const TokenIndex& idx, const Token* tokens, size_t n);
  int32_t match_length_held(const TokenIndex& idx);
  std::vector<Token> continuation_held(const TokenIndex& idx, size_t max_tokens,
                                       ContinuationRule rule, size_t max_occurrences);
  // The same for a caller that holds idx for reading itself (a batched call, once for
  // all its cursors over idx); readable false: it found idx busy, as above.
  void extend_read(const TokenIndex& idx, bool readable, const Token* tokens, size_t n);
  int32_t match_length_read(const TokenIndex& idx, bool readable);
  std::vector<Token> continuation_read(const TokenIndex& idx, bool readable, size_t max_tokens,
                                       ContinuationRule rule, size_t max_occurrences);
  // continuation_read of n entries, rules[i] and max_tokens[i] (>= 1) each, into out[i]:
  // the same tokens, with one walk of the occurrence list for all of kRecent2 .. kRecent8.
  void continuations_read(const TokenIndex& idx, bool readable, const ContinuationRule* rules,
                          const int64_t* max_tokens, size_t n, size_t max_occurrences,
                          std::vector<Token>* out);
  // extend_read in parts, for a caller that steps several cursors by turns so that their
  // cache misses overlap (CursorSet): begin_feed does what extend_read does before its
  // steps and returns whether the tokens remain to be stepped (false: kept for later, or
  // matched already); then, for each token c in order, prefetch_step(idx, c) for every
  // such cursor and feed_one(idx, c) for each. The same state as extend_read.
  bool begin_feed(const TokenIndex& idx, bool readable, const Token* tokens, size_t n);
  void prefetch_step(const TokenIndex& idx, Token c) const { idx.prefetch_transition(state_, c); }
  void feed_one(const TokenIndex& idx, Token c) {
    step(idx, c);
    push_tail(c);
  }
  std::vector<Occurrence> occurrences(size_t max_count);
  // Tokens after the chosen occurrence of the current match (see ContinuationRule).
  std::vector<Token> continuation(size_t max_tokens, ContinuationRule rule, size_t max_occurrences);
  size_t num_fed() const { return num_fed_; }
  int32_t max_match() const { return max_match_; }

 private:
  std::shared_ptr<TokenIndex> lock() const;  // raises StateError once closed
  void sync(const TokenIndex& idx);
  // Steps through tokens (inside a Reading).
  void feed(const TokenIndex& idx, const Token* tokens, size_t n);
  // sync(), or, after tokens were kept unmatched (stale_), the window matched afresh.
  void catch_up(const TokenIndex& idx);
  std::vector<Token> continue_from(const TokenIndex& idx, size_t max_tokens, ContinuationRule rule,
                                   size_t max_occurrences);
  void step(const TokenIndex& idx, Token c);
  void rematch(const TokenIndex& idx, size_t length);
  void push_tail(Token c);
  std::vector<Token> vote(const TokenIndex& idx, size_t max_tokens, size_t max_occurrences) const;

  std::weak_ptr<TokenIndex> index_;
  int32_t max_match_;
  std::vector<Token> tail_;  // the last fed tokens (at least max_match_ of them)
  size_t num_fed_ = 0;
  int32_t state_ = 0;
  int32_t len_ = 0;
  uint64_t epoch_ = 0;
  size_t synced_positions_ = 0;
  bool stale_ = false;  // tokens were fed while the index was busy: state_ is behind
};

}  // namespace agspec
