#include "match_cursor.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace agspec {

namespace {

// Bit j set when toks[j] == t, for j < 64.
uint64_t equal_mask64(const Token* toks, Token t) {
  uint64_t mask = 0;
#if defined(__SSE2__)
  const __m128i want = _mm_set1_epi32(t);
  for (unsigned j = 0; j < 64; j += 4) {
    const __m128i got = _mm_loadu_si128(reinterpret_cast<const __m128i*>(toks + j));
    const int bits = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(got, want)));
    mask |= uint64_t(unsigned(bits)) << j;
  }
#else
  for (unsigned j = 0; j < 64; ++j) mask |= uint64_t(toks[j] == t) << j;
#endif
  return mask;
}

}  // namespace

MatchCursor::MatchCursor(std::shared_ptr<TokenIndex> index, int32_t max_match)
    : index_(index), max_match_(max_match) {
  if (max_match < 1) throw ArgumentError("max_match_tokens must be >= 1");
  if (!index) throw StateError("the index was closed");
  TokenIndex::Reading reading(*index);
  epoch_ = index->epoch();
  synced_positions_ = index->positions_size();
}

std::shared_ptr<TokenIndex> MatchCursor::lock() const {
  auto idx = index_.lock();
  if (!idx || idx->closed()) {
    throw StateError("the index this cursor matches against was closed");
  }
  return idx;
}

void MatchCursor::push_tail(Token c) {
  tail_.push_back(c);
  ++num_fed_;
  const size_t keep = size_t(max_match_);
  if (tail_.size() > 2 * keep + 64) tail_.erase(tail_.begin(), tail_.end() - keep);
}

void MatchCursor::step(const TokenIndex& idx, Token c) {
  // state_ holds the match: sync() moved it if a split gave the string to a new state,
  // and a transition or a suffix link keeps it (the strings of a state all extend into
  // one state), so no step looks at the link's length first.
  while (true) {
    const int32_t t = idx.transition(state_, c);
    if (t != -1) {
      state_ = t;
      ++len_;
      break;
    }
    if (state_ == 0) {
      len_ = 0;
      break;
    }
    state_ = idx.state_link(state_);
    len_ = idx.state_len(state_);
  }
  if (len_ > max_match_) {
    len_ = max_match_;
    while (len_ <= idx.state_len(idx.state_link(state_))) state_ = idx.state_link(state_);
  }
}

void MatchCursor::rematch(const TokenIndex& idx, size_t length) {
  // Walks the last `length` fed tokens from the root: their string is in the index.
  state_ = 0;
  for (size_t i = tail_.size() - length; i < tail_.size(); ++i) {
    state_ = idx.transition(state_, tail_[i]);
    if (state_ == -1) throw std::logic_error("MatchCursor::rematch: string not in index");
  }
  len_ = int32_t(length);
}

void MatchCursor::sync(const TokenIndex& idx) {
  const size_t npos = idx.positions_size();
  if (epoch_ == idx.epoch() && synced_positions_ == npos) return;
  const size_t window = std::min(tail_.size(), size_t(max_match_));
  const size_t fresh = npos - std::min(npos, synced_positions_);
  // Scanning a new position is one or two sequential reads; walking the window from the
  // root is `window` transitions, each a likely cache miss in a large index. A corpus
  // that many requests append to at once (the history, at batch 64: about 240 new
  // positions per step) must not pay the walk every step, so the scan goes on far past
  // the window's length (benchmarks/bench_step_batch.py).
  constexpr size_t kScanPerWindowToken = 16;
  if (epoch_ != idx.epoch() ||
      fresh > kScanPerWindowToken * std::max<size_t>(64, size_t(max_match_))) {
    // Positions were renumbered, or very many are new: match the last window afresh.
    state_ = 0;
    len_ = 0;
    for (size_t i = tail_.size() - window; i < tail_.size(); ++i) step(idx, tail_[i]);
  } else {
    // Occurrences only grow: a longer match must end at one of the new positions.
    while (state_ != 0 && len_ <= idx.state_len(idx.state_link(state_))) {
      state_ = idx.state_link(state_);
    }
    size_t best = size_t(len_);
    if (window > 0) {
      // A match ends with the last fed token: most new positions fail that test, read
      // from one array, before any document is looked at.
      const Token last = tail_.back();
      auto check = [&](size_t g) {
        best = std::max(best, idx.common_suffix(uint32_t(g), tail_.data(), tail_.size(), window));
      };
      size_t g = synced_positions_;
      if (const Token* toks = idx.position_tokens()) {
        // 64 positions at a time into a bit mask (four ids per compare), then only the
        // set bits: at batch 64 the history has ~240 new positions per step.
        for (; g + 64 <= npos; g += 64) {
          const uint64_t mask = equal_mask64(toks + g, last);
          for (uint64_t m = mask; m != 0; m &= m - 1) check(g + size_t(__builtin_ctzll(m)));
        }
        for (; g < npos; ++g) {
          if (toks[g] == last) check(g);
        }
      } else {
        for (; g < npos; ++g) {
          if (idx.position_token(uint32_t(g)) == last) check(g);
        }
      }
    }
    if (best > size_t(len_)) rematch(idx, best);
  }
  epoch_ = idx.epoch();
  synced_positions_ = npos;
}

void MatchCursor::extend(const Token* tokens, size_t n) {
  auto idx = lock();
  check_tokens(tokens, n);
  TokenIndex::Reading reading(*idx);  // raises StateError when busy: nothing fed
  feed(*idx, tokens, n);
}

void MatchCursor::extend_held(const TokenIndex& idx, const Token* tokens, size_t n) {
  TokenIndex::Reading reading(idx, std::nothrow);  // raises StateError once closed
  extend_read(idx, reading.held(), tokens, n);
}

void MatchCursor::extend_read(const TokenIndex& idx, bool readable, const Token* tokens, size_t n) {
  if (!readable) {
    // Busy: keep the tokens; the match is found again from the window once readable.
    for (size_t i = 0; i < n; ++i) push_tail(tokens[i]);
    stale_ = true;
    return;
  }
  feed(idx, tokens, n);
}

bool MatchCursor::begin_feed(const TokenIndex& idx, bool readable, const Token* tokens, size_t n) {
  if (!readable || stale_) {
    extend_read(idx, readable, tokens, n);  // kept, or the window matched afresh
    return false;
  }
  sync(idx);
  return true;
}

void MatchCursor::feed(const TokenIndex& idx, const Token* tokens, size_t n) {
  if (stale_) {
    for (size_t i = 0; i < n; ++i) push_tail(tokens[i]);
    catch_up(idx);
    return;
  }
  sync(idx);
  for (size_t i = 0; i < n; ++i) {
    step(idx, tokens[i]);
    push_tail(tokens[i]);
  }
}

void MatchCursor::catch_up(const TokenIndex& idx) {
  if (!stale_) {
    sync(idx);
    return;
  }
  state_ = 0;
  len_ = 0;
  const size_t window = std::min(tail_.size(), size_t(max_match_));
  for (size_t i = tail_.size() - window; i < tail_.size(); ++i) step(idx, tail_[i]);
  epoch_ = idx.epoch();
  synced_positions_ = idx.positions_size();
  stale_ = false;
}

int32_t MatchCursor::match_length() {
  auto idx = lock();
  TokenIndex::Reading reading(*idx);
  catch_up(*idx);
  return len_;
}

int32_t MatchCursor::match_length_held(const TokenIndex& idx) {
  TokenIndex::Reading reading(idx, std::nothrow);  // raises StateError once closed
  return match_length_read(idx, reading.held());
}

int32_t MatchCursor::match_length_read(const TokenIndex& idx, bool readable) {
  if (!readable) return 0;  // busy: no match from this index this step
  catch_up(idx);
  return len_;
}

std::vector<Token> MatchCursor::continuation_held(const TokenIndex& idx, size_t max_tokens,
                                                  ContinuationRule rule, size_t max_occurrences) {
  TokenIndex::Reading reading(idx, std::nothrow);  // raises StateError once closed
  return continuation_read(idx, reading.held(), max_tokens, rule, max_occurrences);
}

std::vector<Token> MatchCursor::continuation_read(const TokenIndex& idx, bool readable,
                                                  size_t max_tokens, ContinuationRule rule,
                                                  size_t max_occurrences) {
  if (!readable) return {};  // busy: no draft from this index this step
  catch_up(idx);
  return continue_from(idx, max_tokens, rule, max_occurrences);
}

void MatchCursor::continuations_read(const TokenIndex& idx, bool readable,
                                     const ContinuationRule* rules, const int64_t* max_tokens,
                                     size_t n, size_t max_occurrences, std::vector<Token>* out) {
  if (!readable) {  // busy: no draft from this index this step
    for (size_t i = 0; i < n; ++i) out[i].clear();
    return;
  }
  catch_up(idx);
  size_t deepest = 0;  // the largest rank asked for
  for (size_t i = 0; i < n; ++i) deepest = std::max(deepest, recent_rank(rules[i]));
  std::vector<uint32_t> positions;  // most recent first
  if (deepest > 0 && len_ > 0) positions = idx.recent_positions(state_, deepest);
  for (size_t i = 0; i < n; ++i) {
    const size_t k = recent_rank(rules[i]), want = size_t(max_tokens[i]);
    if (k == 0) {
      out[i] = continue_from(idx, want, rules[i], max_occurrences);
    } else if (positions.size() >= k) {
      out[i] = idx.tokens_after(positions[k - 1], want);
    } else {
      out[i].clear();
    }
  }
}

std::vector<Occurrence> MatchCursor::occurrences(size_t max_count) {
  auto idx = lock();
  TokenIndex::Reading reading(*idx);
  catch_up(*idx);
  std::vector<Occurrence> out;
  if (len_ == 0) return out;
  for (uint32_t g : idx->recent_positions(state_, max_count)) out.push_back(idx->occurrence(g));
  return out;
}

std::vector<Token> MatchCursor::continuation(size_t max_tokens, ContinuationRule rule,
                                             size_t max_occurrences) {
  auto idx = lock();
  TokenIndex::Reading reading(*idx);
  catch_up(*idx);
  return continue_from(*idx, max_tokens, rule, max_occurrences);
}

std::vector<Token> MatchCursor::continue_from(const TokenIndex& index, size_t max_tokens,
                                              ContinuationRule rule, size_t max_occurrences) {
  const TokenIndex* idx = &index;
  if (len_ == 0 || max_tokens == 0) return {};
  switch (rule) {
    case ContinuationRule::kFirst:
      return idx->tokens_after(idx->first_position(state_), max_tokens);
    case ContinuationRule::kRecent:
      return idx->tokens_after(idx->last_position(state_), max_tokens);
    case ContinuationRule::kVote:
      return vote(*idx, max_tokens, max_occurrences);
    case ContinuationRule::kFrequent:
      break;
    default: {
      const size_t k = recent_rank(rule);
      if (k == 0) throw ArgumentError("unknown continuation rule");
      const auto positions = idx->recent_positions(state_, k);
      if (positions.size() < k) return {};
      return idx->tokens_after(positions[k - 1], max_tokens);
    }
  }
  if (idx->frozen()) {
    // Built before the index was marked frozen (freeze, load).
    if (max_occurrences == TokenIndex::kPickOccurrences &&
        idx->frequent_picks_[state_] != TokenIndex::kNoPick) {
      return idx->tokens_after(idx->frequent_picks_[state_], max_tokens);
    }
    std::lock_guard<std::mutex> guard(idx->frequent_cache_mu_);
    const auto hit = idx->frequent_cache_.find(state_);
    if (hit != idx->frequent_cache_.end() && hit->second.max_occurrences == max_occurrences) {
      return idx->tokens_after(hit->second.position, max_tokens);
    }
  }
  const auto positions = idx->recent_positions(state_, std::max<size_t>(1, max_occurrences));
  if (positions.empty()) return {};  // a state with no position (only in a broken file)
  const uint32_t chosen = idx->frequent_choice(positions.data(), positions.size());
  if (idx->frozen() && max_occurrences <= UINT32_MAX) {
    std::lock_guard<std::mutex> guard(idx->frequent_cache_mu_);
    if (idx->frequent_cache_.size() >= TokenIndex::kFrequentCacheEntries) {
      idx->frequent_cache_.clear();
    }
    idx->frequent_cache_[state_] = {chosen, uint32_t(max_occurrences)};
  }
  return idx->tokens_after(chosen, max_tokens);
}

std::vector<Token> MatchCursor::vote(const TokenIndex& idx, size_t max_tokens,
                                     size_t max_occurrences) const {
  // Token by token, the most frequent next token among the occurrences that agree
  // with the draft so far (ties: the most recent occurrence's token), as long as it
  // is backed by at least a tenth of the occurrences it started from.
  const auto positions = idx.recent_positions(state_, std::max<size_t>(1, max_occurrences));
  std::vector<std::vector<Token>> conts;
  conts.reserve(positions.size());
  for (uint32_t g : positions) conts.push_back(idx.tokens_after(g, max_tokens));
  std::vector<size_t> alive(conts.size());
  for (size_t i = 0; i < alive.size(); ++i) alive[i] = i;
  const size_t min_support = std::max<size_t>(1, (conts.size() + 9) / 10);
  std::vector<Token> out;
  std::vector<std::pair<Token, size_t>> counts;
  for (size_t j = 0; j < max_tokens; ++j) {
    counts.clear();
    for (size_t i : alive) {
      if (conts[i].size() <= j) continue;
      const Token t = conts[i][j];
      auto it = std::find_if(counts.begin(), counts.end(),
                             [t](const std::pair<Token, size_t>& c) { return c.first == t; });
      if (it == counts.end()) {
        counts.emplace_back(t, 1);
      } else {
        ++it->second;
      }
    }
    if (counts.empty()) break;
    // counts is in recency order of first appearance: strict > keeps ties on the recent.
    auto best = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    if (best->second < min_support) break;
    out.push_back(best->first);
    std::vector<size_t> next;
    for (size_t i : alive) {
      if (conts[i].size() > j && conts[i][j] == best->first) next.push_back(i);
    }
    alive.swap(next);
  }
  return out;
}

}  // namespace agspec
