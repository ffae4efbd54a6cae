// A request's match cursors over its corpora, moved and read together, so that one
// verification step crosses into C++ once instead of once per corpus.
//
// No policy lives here: the set reports every corpus's match length, and copies a
// continuation from the slot the caller picks. Which corpus wins, and how many tokens
// to draft, is decided in Python (agspec.policy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "token_index.h"

namespace agspec {

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

 private:
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
  };
  bool append(Append& a, const Token* tokens, size_t n);  // false: the index was closed
  std::vector<Append> appends_;
};

// advance() for many sets, sets[i] taking tokens[i] (lengths[i] of them), in order; a
// set that raises does not stop the others (the first error is raised once all have
// moved). Asking for the next sets' memory ahead was tried and measured slower.
void advance_batch(CursorSet* const* sets, const Token* const* tokens, const size_t* lengths,
                   size_t n);
// match_lengths() of many sets into out, set after set.
void match_lengths_batch(CursorSet* const* sets, size_t n, int32_t* out);

}  // namespace agspec
