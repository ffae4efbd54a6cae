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
  void advance(const Token* tokens, size_t n);
  // The current match length of every slot, in slot order, into out[0 .. size()).
  void match_lengths(int32_t* out);
  std::vector<Token> continuation(size_t slot, size_t max_tokens, ContinuationRule rule,
                                  size_t max_occurrences);
  size_t size() const { return cursors_.size(); }

 private:
  std::vector<MatchCursor> cursors_;
  std::vector<std::pair<std::shared_ptr<TokenIndex>, int64_t>> appends_;
};

}  // namespace agspec
