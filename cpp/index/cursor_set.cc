#include "cursor_set.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "workers.h"

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

void CursorSet::set_order(std::vector<std::pair<int32_t, int32_t>> order) {
  for (const auto& [slot, margin] : order) {
    if (slot < 0 || size_t(slot) >= cursors_.size()) {
      throw ArgumentError("set_order: slot " + std::to_string(slot) + " out of range (" +
                          std::to_string(cursors_.size()) + " cursors)");
    }
  }
  order_ = std::move(order);
}

int32_t CursorSet::pick(const int32_t* lengths) const {
  int32_t best_after = 0, winner = -1;
  for (const auto& [slot, margin] : order_) {
    const int32_t m = lengths[slot];
    if (int64_t(m) > int64_t(best_after) + margin) winner = slot;
    if (m > best_after) best_after = m;
  }
  return winner;
}

std::pair<int32_t, int32_t> CursorSet::pick_at_least(const int32_t* lengths,
                                                     int32_t min_match) const {
  const int32_t slot = pick(lengths);
  if (slot < 0 || lengths[slot] < min_match) return {-1, 0};
  return {slot, lengths[slot]};
}

std::pair<int32_t, int32_t> CursorSet::match_pick(int32_t min_match) {
  std::vector<int32_t> lengths(cursors_.size());
  match_lengths(lengths.data());
  return pick_at_least(lengths.data(), min_match);
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

void CursorSet::check_ids(const Token* tokens, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0) throw ArgumentError("advance: token ids must be >= 0");
  }
}

BatchReads::BatchReads(CursorSet* const* sets, size_t n) {
  size_t entries = 0;
  for (size_t i = 0; i < n; ++i) entries += sets[i]->indexes_.size();
  first_.reserve(n);
  access_.reserve(entries);
  // The distinct indexes met so far and their access: open addressing, at most half full.
  size_t slots = 16;
  while (slots < 2 * entries) slots *= 2;
  std::vector<std::pair<const TokenIndex*, Access>> seen(slots, {nullptr, Access::kHeld});
  try {
    for (size_t i = 0; i < n; ++i) {
      first_.push_back(uint32_t(access_.size()));
      for (const auto& held : sets[i]->indexes_) {
        const TokenIndex* idx = held.get();
        size_t h = size_t(mix64(uint64_t(reinterpret_cast<uintptr_t>(idx)))) & (slots - 1);
        while (seen[h].first != nullptr && seen[h].first != idx) h = (h + 1) & (slots - 1);
        if (seen[h].first == nullptr) {
          Access a = Access::kHeld;
          if (idx->closed()) {
            a = Access::kClosed;
          } else if (!idx->frozen()) {  // a frozen index has no writer: nothing to enter
            try {
              if (idx->try_enter_read()) {
                entered_.push_back(idx);
              } else {
                a = Access::kBusy;
              }
            } catch (const StateError&) {
              a = Access::kClosed;
            }
          }
          seen[h] = {idx, a};
        }
        access_.push_back(seen[h].second);
      }
    }
  } catch (...) {
    for (const TokenIndex* idx : entered_) idx->exit_read();
    throw;
  }
}

BatchReads::~BatchReads() {
  for (const TokenIndex* idx : entered_) idx->exit_read();
}

bool BatchReads::readable(size_t set, size_t cursor) const {
  const Access a = access_[first_[set] + cursor];
  if (a == Access::kClosed) throw StateError("the index was closed");
  return a == Access::kHeld;
}

void CursorSet::advance_cursors(const Token* tokens, size_t n, const BatchReads* reads,
                                size_t self) {
  const size_t k = cursors_.size();
  if (n > 0 && k > 1 && k <= kInterleaved) {
    bool readable[kInterleaved];
    if (reads != nullptr) {
      if (readable_all(*reads, self, readable)) return advance_interleaved(tokens, n, readable);
    } else {
      // Every cursor's index held for reading at once (as extend_held would, one by one).
      std::optional<TokenIndex::Reading> guards[kInterleaved];
      bool all_open = true;
      for (size_t i = 0; i < k && all_open; ++i) {
        try {
          guards[i].emplace(*indexes_[i], std::nothrow);
          readable[i] = guards[i]->held();
        } catch (const StateError&) {
          all_open = false;
        }
      }
      if (all_open) return advance_interleaved(tokens, n, readable);
    }
    // A closed index: the plain loop below raises where it always did.
  }
  for (size_t i = 0; i < k; ++i) {
    const TokenIndex& idx = *indexes_[i];
    if (reads) {
      cursors_[i].extend_read(idx, reads->readable(self, i), tokens, n);
    } else {
      cursors_[i].extend_held(idx, tokens, n);
    }
  }
}

bool CursorSet::readable_all(const BatchReads& reads, size_t self, bool* readable) const {
  try {
    for (size_t i = 0; i < cursors_.size(); ++i) readable[i] = reads.readable(self, i);
  } catch (const StateError&) {
    return false;
  }
  return true;
}

void CursorSet::advance_interleaved(const Token* tokens, size_t n, const bool* readable) {
  // The cursors step by turns, token by token, each asking for the memory of its next
  // step before any of them takes it: they are over different indexes, so their cache
  // misses overlap instead of following each other (-4.5 % per request-step of a B = 64
  // step_batch: benchmarks/ab_step_batch.py). Every cursor ends as if fed alone.
  size_t active[kInterleaved];
  size_t num_active = 0;
  for (size_t i = 0; i < cursors_.size(); ++i) {
    if (cursors_[i].begin_feed(*indexes_[i], readable[i], tokens, n)) active[num_active++] = i;
  }
  for (size_t j = 0; j < n; ++j) {
    for (size_t a = 0; a < num_active; ++a) {
      cursors_[active[a]].prefetch_step(*indexes_[active[a]], tokens[j]);
    }
    for (size_t a = 0; a < num_active; ++a) {
      cursors_[active[a]].feed_one(*indexes_[active[a]], tokens[j]);
    }
  }
}

void CursorSet::match_lengths_in(int32_t* out, const BatchReads& reads, size_t self) {
  for (size_t i = 0; i < cursors_.size(); ++i) {
    out[i] = cursors_[i].match_length_read(*indexes_[i], reads.readable(self, i));
  }
}

void CursorSet::append_at(size_t k, const Token* tokens, size_t n) {
  Append& a = appends_[k];
  if (!append(a, tokens, n)) a.closed = true;
}

void CursorSet::drop_closed_appends() {
  bool any = false;
  for (const auto& a : appends_) any |= a.closed;
  if (!any) return;
  std::vector<Append> kept;
  for (auto& a : appends_) {
    if (!a.closed) kept.push_back(std::move(a));
  }
  appends_ = std::move(kept);
}

void CursorSet::advance(const Token* tokens, size_t n) {
  if (n == 0) return;
  // Checked before anything moves: a bad id leaves every cursor and document as it was.
  check_ids(tokens, n);
  advance_cursors(tokens, n);
  for (size_t k = 0; k < appends_.size(); ++k) append_at(k, tokens, n);
  drop_closed_appends();
}

void CursorSet::match_lengths(int32_t* out) {
  for (size_t i = 0; i < cursors_.size(); ++i) out[i] = cursors_[i].match_length_held(*indexes_[i]);
}

namespace {

// Below this many sets a batched call runs on the caller alone: handing tasks to the
// helpers costs more than it saves.
constexpr size_t kParallelMinSets = 16;
constexpr size_t kSetsPerTask = 4;

bool parallel(CursorSet* const* sets, size_t n) {
  if (n < kParallelMinSets || batch_threads() < 2) return false;
  // A set listed twice is moved twice, in order: only one thread may hold it.
  std::vector<CursorSet*> sorted(sets, sets + n);
  std::sort(sorted.begin(), sorted.end());
  return std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
}

size_t num_set_tasks(size_t n) { return (n + kSetsPerTask - 1) / kSetsPerTask; }

// The task of run_tasks / TaskRun that runs fn(i) for a few sets of n (task t: sets
// t * kSetsPerTask onwards); errors[i] keeps what fn(i) raised.
template <class Fn>
auto set_task(size_t n, std::exception_ptr* errors, Fn fn) {
  return [n, errors, fn](size_t t) {
    for (size_t i = t * kSetsPerTask; i < std::min(n, (t + 1) * kSetsPerTask); ++i) {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
}

// fn(i) for every set, on the helpers; errors[i] keeps what fn(i) raised.
template <class Fn>
void each_set(size_t n, std::vector<std::exception_ptr>& errors, Fn fn) {
  run_tasks(num_set_tasks(n), set_task(n, errors.data(), fn));
}

void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace

void prepare_batch(size_t num_sets) {
  if (num_sets >= kParallelMinSets) wake_batch_threads();
}

void advance_batch(CursorSet* const* sets, const Token* const* tokens, const size_t* lengths,
                   size_t n) {
  AdvanceBatch(sets, tokens, lengths, n).finish();
}

AdvanceBatch::AdvanceBatch(CursorSet* const* sets, const Token* const* tokens,
                           const size_t* lengths, size_t n)
    : sets_(sets), tokens_(tokens), lengths_(lengths), n_(n), parallel_(parallel(sets, n)) {
  if (!parallel_) return;
  errors_.resize(n);
  moved_.assign(n, 0);
  reads_ = std::make_unique<BatchReads>(sets, n);  // dropped before the appends, which write
  cursors_.start(num_set_tasks(n), set_task(n, errors_.data(), [this](size_t i) {
                   if (lengths_[i] == 0) return;
                   CursorSet::check_ids(tokens_[i], lengths_[i]);
                   sets_[i]->advance_cursors(tokens_[i], lengths_[i], reads_.get(), i);
                   moved_[i] = 1;
                 }));
}

AdvanceBatch::~AdvanceBatch() {
  try {
    finish();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor cannot raise it
  }
}

void AdvanceBatch::finish() {
  if (finished_) return;
  finished_ = true;
  if (!parallel_) {
    std::exception_ptr first_error;
    for (size_t i = 0; i < n_; ++i) {
      try {
        sets_[i]->advance(tokens_[i], lengths_[i]);
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    if (first_error) std::rethrow_exception(first_error);
    return;
  }
  cursors_.finish();
  reads_.reset();
  appends();
  rethrow_first(errors_);
}

void AdvanceBatch::appends() {
  CursorSet* const* sets = sets_;
  // The appends, grouped by index: (index, set, append), in set order within an index.
  struct Job {
    const TokenIndex* index;
    uint32_t set, append;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < n_; ++i) {
    if (!moved_[i]) continue;
    const auto& appends = sets[i]->appends_;
    for (size_t k = 0; k < appends.size(); ++k) {
      jobs.push_back(Job{appends[k].index.get(), uint32_t(i), uint32_t(k)});
    }
  }
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const Job& a, const Job& b) { return a.index < b.index; });
  std::vector<std::pair<size_t, size_t>> groups;  // [begin, end) in jobs
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (j == 0 || jobs[j].index != jobs[j - 1].index) groups.emplace_back(j, j);
    groups.back().second = j + 1;
  }
  // Longest first, so that the last task to start is a short one.
  std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    return a.second - a.first > b.second - b.first;
  });
  std::vector<std::exception_ptr> append_errors(jobs.size());
  run_tasks(groups.size(), [&](size_t g) {
    for (size_t j = groups[g].first; j < groups[g].second; ++j) {
      const Job& job = jobs[j];
      try {
        sets[job.set]->append_at(job.append, tokens_[job.set], lengths_[job.set]);
      } catch (...) {
        append_errors[j] = std::current_exception();
      }
    }
  });
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (append_errors[j] && !errors_[jobs[j].set]) errors_[jobs[j].set] = append_errors[j];
  }
  for (size_t i = 0; i < n_; ++i) {
    if (moved_[i]) sets[i]->drop_closed_appends();
  }
}

void match_lengths_batch(CursorSet* const* sets, size_t n, int32_t* out) {
  if (!parallel(sets, n)) {
    for (size_t i = 0; i < n; ++i) {
      sets[i]->match_lengths(out);
      out += sets[i]->size();
    }
    return;
  }
  std::vector<size_t> offsets(n + 1, 0);
  for (size_t i = 0; i < n; ++i) offsets[i + 1] = offsets[i] + sets[i]->size();
  std::vector<std::exception_ptr> errors(n);
  const BatchReads reads(sets, n);
  each_set(n, errors, [&](size_t i) { sets[i]->match_lengths_in(out + offsets[i], reads, i); });
  rethrow_first(errors);
}

void match_picks_batch(CursorSet* const* sets, size_t n, int32_t min_match, int32_t* picks) {
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) total += sets[i]->size();
  std::vector<int32_t> lengths(total);
  match_lengths_batch(sets, n, lengths.data());
  const int32_t* at = lengths.data();
  for (size_t i = 0; i < n; ++i) {
    const auto [slot, m] = sets[i]->pick_at_least(at, min_match);
    picks[2 * i] = slot;
    picks[2 * i + 1] = m;
    at += sets[i]->size();
  }
}

void continuation_batch(CursorSet* const* sets, const int64_t* slots, const int64_t* max_tokens,
                        const ContinuationRule* rules, size_t max_occurrences, size_t n,
                        std::vector<Token>* out) {
  // One request's draft, under the batch's read guards when given (else its own).
  auto one = [&](size_t i, const BatchReads* reads) {
    if (slots[i] < 0 || max_tokens[i] <= 0) return;  // no draft for this request
    const size_t slot = size_t(slots[i]), k = size_t(max_tokens[i]);
    out[i] = reads ? sets[i]->continuation_in(slot, k, rules[i], max_occurrences, *reads, i)
                   : sets[i]->continuation(slot, k, rules[i], max_occurrences);
  };
  if (!parallel(sets, n)) {
    for (size_t i = 0; i < n; ++i) one(i, nullptr);
    return;
  }
  const BatchReads reads(sets, n);
  std::vector<std::exception_ptr> errors(n);
  each_set(n, errors, [&](size_t i) { one(i, &reads); });
  rethrow_first(errors);
}

void continuation_groups(CursorSet* const* sets, const int64_t* counts, size_t num_groups,
                         const int64_t* slots, const int64_t* max_tokens,
                         const ContinuationRule* rules, size_t max_occurrences,
                         std::vector<Token>* out, const std::function<void(size_t)>& done) {
  std::vector<size_t> start(num_groups + 1, 0);
  for (size_t g = 0; g < num_groups; ++g) start[g + 1] = start[g] + size_t(counts[g]);
  // One group's copies, under the batch's read guards when given (else each its own).
  auto group = [&](size_t g, const BatchReads* reads) {
    sets[g]->copy_entries(start[g], start[g + 1], slots, max_tokens, rules, max_occurrences, reads,
                          g, out);
    done(g);
  };
  if (!parallel(sets, num_groups)) {
    for (size_t g = 0; g < num_groups; ++g) group(g, nullptr);
    return;
  }
  const BatchReads reads(sets, num_groups);
  std::vector<std::exception_ptr> errors(num_groups);
  each_set(num_groups, errors, [&](size_t g) { group(g, &reads); });
  rethrow_first(errors);
}

ContinuationGroupsRun::ContinuationGroupsRun(CursorSet* const* sets, size_t num_groups)
    : sets_(sets), n_(num_groups), parallel_(parallel(sets, num_groups)) {
  if (parallel_) reads_ = std::make_unique<BatchReads>(sets, num_groups);
}

ContinuationGroupsRun::~ContinuationGroupsRun() {
  try {
    finish(nullptr);
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor cannot raise it
  }
}

void ContinuationGroupsRun::match_lengths(int32_t* out) {
  if (started_ || finished_) {
    throw ArgumentError("ContinuationGroupsRun: match_lengths after start or finish");
  }
  if (!parallel_) return match_lengths_batch(sets_, n_, out);
  std::vector<size_t> offsets(n_ + 1, 0);
  for (size_t i = 0; i < n_; ++i) offsets[i + 1] = offsets[i] + sets_[i]->size();
  std::vector<std::exception_ptr> errors(n_);
  each_set(n_, errors, [&](size_t i) { sets_[i]->match_lengths_in(out + offsets[i], *reads_, i); });
  rethrow_first(errors);
}

void ContinuationGroupsRun::start(const int64_t* counts, const int64_t* slots,
                                  const int64_t* max_tokens, const ContinuationRule* rules,
                                  size_t max_occurrences, std::vector<Token>* out) {
  if (started_ || finished_) throw ArgumentError("ContinuationGroupsRun: started twice");
  start_.assign(n_ + 1, 0);
  for (size_t g = 0; g < n_; ++g) {
    if (counts[g] < 0) throw ArgumentError("ContinuationGroupsRun: a negative count");
    start_[g + 1] = start_[g] + size_t(counts[g]);
  }
  skip_ = std::make_unique<std::atomic<bool>[]>(n_);
  started_ = true;
  slots_ = slots;
  max_tokens_ = max_tokens;
  rules_ = rules;
  max_occurrences_ = max_occurrences;
  out_ = out;
  errors_.resize(n_);
  if (!parallel_) return;  // finish() copies
  run_.start(num_set_tasks(n_), set_task(n_, errors_.data(), [this](size_t g) { group(g); }));
}

void ContinuationGroupsRun::group(size_t g) {
  if (skip_[g].load(std::memory_order_relaxed)) return;
  sets_[g]->copy_entries(start_[g], start_[g + 1], slots_, max_tokens_, rules_, max_occurrences_,
                         reads_.get(), g, out_);
}

void ContinuationGroupsRun::finish(const char* wanted) {
  if (finished_) return;
  finished_ = true;
  if (!started_) {
    reads_.reset();
    return;
  }
  for (size_t g = 0; g < n_; ++g) {
    if (wanted == nullptr || !wanted[g]) skip_[g].store(true, std::memory_order_relaxed);
  }
  if (parallel_) {
    run_.finish();
  } else {
    for (size_t g = 0; g < n_; ++g) {
      try {
        group(g);
      } catch (...) {
        errors_[g] = std::current_exception();
      }
    }
  }
  reads_.reset();
  for (size_t g = 0; g < n_; ++g) {
    if (wanted != nullptr && wanted[g] && errors_[g]) std::rethrow_exception(errors_[g]);
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

void CursorSet::copy_entries(size_t from, size_t to, const int64_t* slots,
                             const int64_t* max_tokens, const ContinuationRule* rules,
                             size_t max_occurrences, const BatchReads* reads, size_t self,
                             std::vector<Token>* out) {
  size_t j = from;
  while (j < to) {
    if (slots[j] < 0 || max_tokens[j] <= 0) {  // nothing to copy
      ++j;
      continue;
    }
    size_t end = j + 1;  // the run of entries of this slot with something to copy
    while (end < to && slots[end] == slots[j] && max_tokens[end] > 0) ++end;
    const size_t slot = size_t(slots[j]);
    if (slot >= cursors_.size()) {
      throw ArgumentError("continuation: slot " + std::to_string(slot) + " out of range (" +
                          std::to_string(cursors_.size()) + " cursors)");
    }
    const TokenIndex& idx = *indexes_[slot];
    if (reads != nullptr) {
      cursors_[slot].continuations_read(idx, reads->readable(self, slot), rules + j, max_tokens + j,
                                        end - j, max_occurrences, out + j);
    } else {
      TokenIndex::Reading reading(idx, std::nothrow);  // raises StateError once closed
      cursors_[slot].continuations_read(idx, reading.held(), rules + j, max_tokens + j, end - j,
                                        max_occurrences, out + j);
    }
    j = end;
  }
}

std::vector<Token> CursorSet::continuation_in(size_t slot, size_t max_tokens, ContinuationRule rule,
                                              size_t max_occurrences, const BatchReads& reads,
                                              size_t self) {
  if (slot >= cursors_.size()) return continuation(slot, max_tokens, rule, max_occurrences);
  return cursors_[slot].continuation_read(*indexes_[slot], reads.readable(self, slot), max_tokens,
                                          rule, max_occurrences);
}

}  // namespace agspec
