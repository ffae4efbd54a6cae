#include "cursor_set.h"

#include <string>

namespace agspec {

size_t CursorSet::add_cursor(std::shared_ptr<TokenIndex> index, int32_t max_match,
                             const Token* tail, size_t n) {
  MatchCursor cursor(std::move(index), max_match);
  if (n > 0) cursor.extend(tail, n);
  cursors_.push_back(std::move(cursor));
  return cursors_.size() - 1;
}

void CursorSet::add_append(std::shared_ptr<TokenIndex> index, int64_t doc_id) {
  if (!index) throw ArgumentError("add_append: no index");
  if (doc_id < 0) throw ArgumentError("add_append: doc_id must be >= 0");
  appends_.emplace_back(std::move(index), doc_id);
}

void CursorSet::remove_append(const TokenIndex* index) {
  std::vector<std::pair<std::shared_ptr<TokenIndex>, int64_t>> kept;
  for (auto& a : appends_) {
    if (a.first.get() != index) kept.push_back(std::move(a));
  }
  appends_ = std::move(kept);
}

void CursorSet::advance(const Token* tokens, size_t n) {
  if (n == 0) return;
  // Checked before anything moves: a bad id leaves every cursor and document as it was.
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0) throw ArgumentError("advance: token ids must be >= 0");
  }
  for (auto& c : cursors_) c.extend(tokens, n);
  for (auto& [index, doc] : appends_) index->extend(doc, tokens, n);
}

void CursorSet::match_lengths(int32_t* out) {
  for (size_t i = 0; i < cursors_.size(); ++i) out[i] = cursors_[i].match_length();
}

std::vector<Token> CursorSet::continuation(size_t slot, size_t max_tokens, ContinuationRule rule,
                                           size_t max_occurrences) {
  if (slot >= cursors_.size()) {
    throw ArgumentError("continuation: slot " + std::to_string(slot) + " out of range (" +
                        std::to_string(cursors_.size()) + " cursors)");
  }
  return cursors_[slot].continuation(max_tokens, rule, max_occurrences);
}

}  // namespace agspec
