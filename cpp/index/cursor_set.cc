#include "cursor_set.h"

#include <exception>
#include <string>

namespace agspec {

size_t CursorSet::add_cursor(std::shared_ptr<TokenIndex> index, int32_t max_match,
                             const Token* tail, size_t n) {
  MatchCursor cursor(index, max_match);
  if (n > 0) cursor.extend(tail, n);
  cursors_.push_back(std::move(cursor));
  indexes_.push_back(std::move(index));
  return cursors_.size() - 1;
}

void CursorSet::add_append(std::shared_ptr<TokenIndex> index, int64_t doc_id) {
  if (!index) throw ArgumentError("add_append: no index");
  if (doc_id < 0) throw ArgumentError("add_append: doc_id must be >= 0");
  appends_.push_back(Append{std::move(index), doc_id, {}, TokenIndex::kNoSlot});
}

void CursorSet::remove_append(const TokenIndex* index) {
  std::vector<Append> kept;
  for (auto& a : appends_) {
    if (a.index.get() != index) kept.push_back(std::move(a));
  }
  appends_ = std::move(kept);
}

bool CursorSet::append(Append& a, const Token* tokens, size_t n) {
  if (a.index->closed()) return false;
  if (!a.pending.empty()) {
    a.pending.insert(a.pending.end(), tokens, tokens + n);
    tokens = a.pending.data();
    n = a.pending.size();
  }
  if (n == 0) return true;
  try {
    a.index->extend(a.doc_id, tokens, n, &a.slot);
  } catch (const StateError&) {
    if (a.index->closed()) return false;
    // Busy: nothing was appended; keep the tokens (in order) for the next try.
    if (a.pending.empty()) a.pending.assign(tokens, tokens + n);
    return true;
  }
  a.pending.clear();
  return true;
}

void CursorSet::flush() {
  std::vector<Append> kept;
  for (auto& a : appends_) {
    if (append(a, nullptr, 0)) kept.push_back(std::move(a));
  }
  appends_ = std::move(kept);
}

void CursorSet::advance(const Token* tokens, size_t n) {
  if (n == 0) return;
  // Checked before anything moves: a bad id leaves every cursor and document as it was.
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0) throw ArgumentError("advance: token ids must be >= 0");
  }
  for (size_t i = 0; i < cursors_.size(); ++i) cursors_[i].extend_held(*indexes_[i], tokens, n);
  bool dropped = false;
  for (auto& a : appends_) dropped |= !append(a, tokens, n);
  if (dropped) {
    std::vector<Append> kept;
    for (auto& a : appends_) {
      if (!a.index->closed()) kept.push_back(std::move(a));
    }
    appends_ = std::move(kept);
  }
}

void CursorSet::match_lengths(int32_t* out) {
  for (size_t i = 0; i < cursors_.size(); ++i) out[i] = cursors_[i].match_length_held(*indexes_[i]);
}

void advance_batch(CursorSet* const* sets, const Token* const* tokens, const size_t* lengths,
                   size_t n) {
  std::exception_ptr first_error;
  for (size_t i = 0; i < n; ++i) {
    try {
      sets[i]->advance(tokens[i], lengths[i]);
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

void match_lengths_batch(CursorSet* const* sets, size_t n, int32_t* out) {
  for (size_t i = 0; i < n; ++i) {
    sets[i]->match_lengths(out);
    out += sets[i]->size();
  }
}

std::vector<Token> CursorSet::continuation(size_t slot, size_t max_tokens, ContinuationRule rule,
                                           size_t max_occurrences) {
  if (slot >= cursors_.size()) {
    throw ArgumentError("continuation: slot " + std::to_string(slot) + " out of range (" +
                        std::to_string(cursors_.size()) + " cursors)");
  }
  return cursors_[slot].continuation_held(*indexes_[slot], max_tokens, rule, max_occurrences);
}

}  // namespace agspec
