#include "token_index.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>

#include "workers.h"

namespace agspec {

void check_tokens(const Token* tokens, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0) {
      throw ArgumentError("token ids must be >= 0, got " + std::to_string(tokens[i]) +
                          " at position " + std::to_string(i));
    }
  }
}

// ------------------------------------------------------------ access control

// A call that finds the index held by the other kind of call waits a little for it to
// end (a query or a small extend takes microseconds), and raises StateError if it has
// not: it never waits for a long extend, remove or save, and two calls cannot wait on
// each other for longer than that. Acquire on entry and release on exit order a
// writer's changes before every later reader's reads, and readers' reads before a later
// writer's changes.
namespace {

constexpr auto kShortWait = std::chrono::milliseconds(10);

// How long a caller keeps trying: kShortWait, then kLatePolls more looks. The late looks
// matter on a loaded machine: a thread can lose the CPU for longer than kShortWait, and a
// caller that wakes up past the deadline must not give up on the one look that happened
// to meet another small extend.
class Patience {
 public:
  Patience() : deadline_(std::chrono::steady_clock::now() + kShortWait) {}
  // Yields until done(); false once the patience is used up.
  template <class Done>
  bool wait(Done done) {
    while (!done()) {
      if (!retry()) return false;
      std::this_thread::yield();
    }
    return true;
  }
  // Counts one more look; false once the patience is used up.
  bool retry() {
    return std::chrono::steady_clock::now() < deadline_ || ++late_polls_ <= kLatePolls;
  }

 private:
  static constexpr int kLatePolls = 16;
  std::chrono::steady_clock::time_point deadline_;
  int late_polls_ = 0;
};

}  // namespace

void TokenIndex::enter_read() const {
  if (!try_enter_read()) throw StateError("the index is being changed by another thread");
}

bool TokenIndex::try_enter_read() const {
  if (closed_.load(std::memory_order_acquire)) throw StateError("the index was closed");
  if (!(access_.fetch_add(1, std::memory_order_acquire) & kWriting)) return true;  // fast path
  access_.fetch_sub(1, std::memory_order_release);  // never hold a writer up while waiting
  Patience patience;
  auto no_writer = [this] { return !(access_.load(std::memory_order_relaxed) & kWriting); };
  for (;;) {
    if (!patience.wait(no_writer)) return false;
    if (closed_.load(std::memory_order_acquire)) throw StateError("the index was closed");
    if (!(access_.fetch_add(1, std::memory_order_acquire) & kWriting)) return true;
    access_.fetch_sub(1, std::memory_order_release);  // another writer came first
    if (!patience.retry()) return false;
  }
}

void TokenIndex::exit_read() const { access_.fetch_sub(1, std::memory_order_release); }

void TokenIndex::enter_write() {
  if (closed_.load(std::memory_order_acquire)) throw StateError("the index was closed");
  uint32_t idle = 0;  // the usual case: nobody inside, so no clock is read
  if (access_.compare_exchange_strong(idle, kWriting, std::memory_order_acquire)) {
    if (!closed_.load(std::memory_order_acquire)) return;
    access_.fetch_sub(kWriting, std::memory_order_release);
    throw StateError("the index was closed");
  }
  // Claim the writer's bit (at most one writer), then let the readers inside finish:
  // new readers see the bit and stay out.
  Patience patience;
  auto no_writer = [this] { return !(access_.load(std::memory_order_relaxed) & kWriting); };
  uint32_t seen = access_.load(std::memory_order_relaxed);
  for (;;) {
    if (seen & kWriting) {
      if (!patience.wait(no_writer)) {
        throw StateError("the index is being changed by another thread");
      }
      seen = access_.load(std::memory_order_relaxed);
      continue;
    }
    if (access_.compare_exchange_weak(seen, seen | kWriting, std::memory_order_acquire)) break;
    if (!patience.retry()) throw StateError("the index is being read by another thread");
  }
  auto readers_gone = [this] { return access_.load(std::memory_order_acquire) == kWriting; };
  if (!patience.wait(readers_gone)) {
    access_.fetch_sub(kWriting, std::memory_order_release);
    throw StateError("the index is being read by another thread (a save or a query)");
  }
  if (closed_.load(std::memory_order_acquire)) {
    access_.fetch_sub(kWriting, std::memory_order_release);
    throw StateError("the index was closed");
  }
}

void TokenIndex::exit_write() { access_.fetch_sub(kWriting, std::memory_order_release); }

// A frozen index has no writer, ever (freeze() waits for the last one, and extend and
// remove look again inside their guard), so its readers need not count themselves in:
// that saves two atomic operations on a cache line every thread shares (the global
// corpus's), a large part of a cursor step.
TokenIndex::Reading::Reading(const TokenIndex& idx) : idx_(idx), counted_(!idx.frozen()) {
  if (counted_) {
    idx_.enter_read();
  } else if (idx_.closed()) {
    throw StateError("the index was closed");
  }
}
TokenIndex::Reading::Reading(const TokenIndex& idx, std::nothrow_t)
    : idx_(idx), counted_(!idx.frozen()) {
  if (counted_) {
    held_ = idx_.try_enter_read();
    counted_ = held_;
  } else if (idx_.closed()) {
    throw StateError("the index was closed");
  }
}
TokenIndex::Reading::~Reading() {
  if (counted_) idx_.exit_read();
}

class TokenIndex::Writing {
 public:
  explicit Writing(TokenIndex& idx) : idx_(idx) { idx_.enter_write(); }
  ~Writing() { idx_.exit_write(); }
  Writing(const Writing&) = delete;
  Writing& operator=(const Writing&) = delete;

 private:
  TokenIndex& idx_;
};

void TokenIndex::hold_for_writing(const std::function<void()>& fn) {
  Writing guard(*this);
  fn();
}

// ----------------------------------------------------------------- TokenIndex

TokenIndex::TokenIndex() { reset_automaton(); }

void TokenIndex::reset_automaton() {
  st_.clear();
  edge_next_.clear();
  own_next_.clear();
  edge_token_.clear();
  pos_doc_.clear();
  pos_off_.clear();
  pos_tok_.clear();
  edges_.clear();
  new_state(0);  // the root
}

int32_t TokenIndex::new_state(int32_t len) {
  const auto id = static_cast<int32_t>(st_.size());
  const auto pos = static_cast<uint32_t>(pos_doc_.size());  // the position being inserted
  st_.push_back(State{len, -1, -1, -1, -1, -1, -1, -1, -1, pos, pos});
  return id;
}

void TokenIndex::add_edge(int32_t s, Token t, int32_t target) {
  if (st_[s].in_tok == -1) {
    st_[s].in_tok = t;
    st_[s].in_tgt = target;
    return;
  }
  edges_.insert(s, t, target);
  edge_token_.push_back(t);
  edge_next_.push_back(st_[s].edge_head);
  st_[s].edge_head = static_cast<int32_t>(edge_token_.size() - 1);
}

void TokenIndex::attach_front(int32_t child, int32_t parent) {
  st_[child].link = parent;
  st_[child].prev_sib = -1;
  st_[child].next_sib = st_[parent].first_child;
  if (st_[parent].first_child != -1) st_[st_[parent].first_child].prev_sib = child;
  st_[parent].first_child = child;
}

void TokenIndex::move_to_front(int32_t u) {
  const int32_t parent = st_[u].link;
  if (parent == -1 || st_[parent].first_child == u) return;
  const int32_t prev = st_[u].prev_sib;
  const int32_t next = st_[u].next_sib;
  st_[prev].next_sib = next;  // u is not first, so prev exists
  if (next != -1) st_[next].prev_sib = prev;
  st_[u].prev_sib = -1;
  st_[u].next_sib = st_[parent].first_child;
  st_[st_[parent].first_child].prev_sib = u;
  st_[parent].first_child = u;
}

int32_t TokenIndex::clone_state(int32_t q, int32_t len) {
  const int32_t cl = new_state(len);
  st_[cl].first_pos = st_[q].first_pos;
  st_[cl].last_pos = st_[q].last_pos;
  st_[cl].in_tok = st_[q].in_tok;
  st_[cl].in_tgt = st_[q].in_tgt;
  for (int32_t e = st_[q].edge_head; e != -1; e = edge_next_[e]) {
    const Token t = edge_token_[e];
    const int32_t target = edges_.get(q, t);
    edges_.insert(cl, t, target);
    edge_token_.push_back(t);
    edge_next_.push_back(st_[cl].edge_head);
    st_[cl].edge_head = static_cast<int32_t>(edge_token_.size() - 1);
  }
  // cl takes q's place among its parent's children (same last_pos_, so order holds),
  // and q becomes cl's only child.
  const int32_t parent = st_[q].link;
  st_[cl].link = parent;
  st_[cl].prev_sib = st_[q].prev_sib;
  st_[cl].next_sib = st_[q].next_sib;
  if (st_[q].prev_sib != -1) {
    st_[st_[q].prev_sib].next_sib = cl;
  } else {
    st_[parent].first_child = cl;
  }
  if (st_[q].next_sib != -1) st_[st_[q].next_sib].prev_sib = cl;
  st_[q].link = cl;
  st_[q].prev_sib = -1;
  st_[q].next_sib = -1;
  st_[cl].first_child = q;
  return cl;
}

// Generalized online suffix-automaton step: appends token c to the string whose state
// is `last`; returns the state of the longer string.
int32_t TokenIndex::sam_extend(int32_t last, Token c) {
  // Each loop below looks a transition up once per state (a lookup in a large table is
  // a likely cache miss): the redirect overwrites the target it read, in place.
  auto redirect = [this, c](int32_t p, int32_t from, int32_t to) {
    for (; p != -1; p = st_[p].link) {
      int32_t* target = st_[p].in_tok == c       ? &st_[p].in_tgt
                        : st_[p].edge_head == -1 ? nullptr
                                                 : edges_.find(p, c);
      if (target == nullptr || *target != from) return;
      *target = to;
    }
  };
  int32_t q = transition(last, c);
  if (q != -1) {  // the string already occurs (another document has it)
    if (st_[q].len == st_[last].len + 1) return q;
    const int32_t cl = clone_state(q, st_[last].len + 1);
    redirect(last, q, cl);
    return cl;
  }
  const int32_t cur = new_state(st_[last].len + 1);
  add_edge(last, c, cur);  // `last` has no c-transition: just looked
  int32_t p = st_[last].link;
  while (p != -1 && (q = transition(p, c)) == -1) {
    add_edge(p, c, cur);
    p = st_[p].link;
  }
  if (p == -1) {
    attach_front(cur, 0);
    return cur;
  }
  if (st_[p].len + 1 == st_[q].len) {
    attach_front(cur, q);
    return cur;
  }
  const int32_t cl = clone_state(q, st_[p].len + 1);
  redirect(p, q, cl);
  attach_front(cur, cl);
  return cur;
}

void TokenIndex::insert_position(uint32_t doc, uint32_t offset) {
  if (pos_doc_.size() >= std::numeric_limits<int32_t>::max() - 1) {
    throw ArgumentError("the index is full (2^31 positions)");
  }
  Doc& d = docs_[doc];
  const auto g = static_cast<uint32_t>(pos_doc_.size());
  const int32_t s = sam_extend(d.last_state, d.tokens[offset]);
  d.last_state = s;
  pos_doc_.push_back(doc);
  pos_off_.push_back(offset);
  pos_tok_.push_back(d.tokens[offset]);
  own_next_.push_back(st_[s].own_head);
  st_[s].own_head = static_cast<int32_t>(g);
  // g is the newest position: it ends a string of every state on s's suffix-link path.
  for (int32_t u = s; u != -1; u = st_[u].link) {
    st_[u].last_pos = g;
    move_to_front(u);
  }
}

uint32_t TokenIndex::doc_for_write(int64_t doc_id, uint32_t hint) {
  if (doc_id < 0) throw ArgumentError("doc_id must be >= 0, got " + std::to_string(doc_id));
  uint32_t slot = hint;
  // A document keeps its slot for good (ids are never reused), so a slot holding the id
  // is the document's.
  if (slot >= docs_.size() || docs_[slot].id != doc_id) {
    auto it = doc_slot_.find(doc_id);
    if (it == doc_slot_.end()) {
      slot = static_cast<uint32_t>(docs_.size());
      doc_slot_.emplace(doc_id, slot);
      docs_.push_back(Doc{doc_id, {}, 0, false});
      ++num_live_docs_;
      return slot;
    }
    slot = it->second;
  }
  if (docs_[slot].removed) {
    throw DocumentError("document " + std::to_string(doc_id) + " was removed; ids are not reused");
  }
  return slot;
}

namespace {
constexpr const char* kReadOnly =
    "the index is read-only (loaded from a file, or a built global corpus)";
}  // namespace

void TokenIndex::extend(int64_t doc_id, const Token* tokens, size_t n, uint32_t* slot_hint) {
  if (frozen()) throw ArgumentError(kReadOnly);
  check_tokens(tokens, n);
  Writing guard(*this);
  // Again inside: a freeze() may have run between the first look and the guard.
  if (frozen()) throw ArgumentError(kReadOnly);
  const uint32_t slot = doc_for_write(doc_id, slot_hint ? *slot_hint : kNoSlot);
  if (slot_hint) *slot_hint = slot;
  Doc& d = docs_[slot];
  if (n >= 4096) {
    // A bulk append: make room once (at most two states and one position per token).
    auto grow = [](auto& v, size_t need) {
      if (v.capacity() < need) v.reserve(std::max(need, v.capacity() + v.capacity() / 2));
    };
    grow(st_, st_.size() + 2 * n);
    grow(pos_doc_, pos_doc_.size() + n);
    grow(pos_off_, pos_off_.size() + n);
    grow(pos_tok_, pos_tok_.size() + n);
    grow(own_next_, own_next_.size() + n);
    grow(d.tokens, d.tokens.size() + n);
  }
  for (size_t i = 0; i < n; ++i) {
    // The previous last token now has a successor: it becomes a position.
    if (!d.tokens.empty()) insert_position(slot, static_cast<uint32_t>(d.tokens.size() - 1));
    d.tokens.push_back(tokens[i]);
    ++num_tokens_;  // per token: a throw part-way leaves the count true
  }
}

void TokenIndex::freeze() {
  if (frozen()) return;
  Writing guard(*this);                 // waits for an extend in flight (or raises StateError)
  if (frozen()) return;                 // another thread's freeze got in first
  LargeVector<Token>().swap(pos_tok_);  // no cursor re-checks new positions of a frozen index
  build_frequent_picks();               // before frozen_: a reader that sees it finds them
  frozen_.store(true, std::memory_order_release);
}

uint32_t TokenIndex::frequent_choice(const uint32_t* positions, size_t n) const {
  // Group by the next 3 tokens; most frequent group wins, ties to the most recent.
  struct Group {
    Token key[3];
    uint32_t count;
    uint32_t first;  // index in `positions` of its most recent occurrence
  };
  Group groups[64];
  size_t num_groups = 0;
  n = std::min<size_t>(n, 64);
  // The occurrences are random places in a large index: fetch their (document, offset)
  // entries, then their tokens, all at once, so the cache misses overlap instead of
  // queueing one behind the other.
  for (size_t i = 0; i < n; ++i) prefetch_position(positions[i]);
  for (size_t i = 0; i < n; ++i) prefetch_next_tokens(positions[i]);
  for (size_t i = 0; i < n; ++i) {
    Token key[3] = {-1, -1, -1};
    next_tokens(positions[i], key, 3);
    size_t k = 0;
    while (k < num_groups && !std::equal(key, key + 3, groups[k].key)) ++k;
    if (k < num_groups) {
      ++groups[k].count;
    } else {
      groups[num_groups++] = Group{{key[0], key[1], key[2]}, 1, uint32_t(i)};
    }
  }
  const Group* best = &groups[0];
  for (size_t k = 1; k < num_groups; ++k) {
    if (groups[k].count > best->count) best = &groups[k];  // strict: recent wins ties
  }
  return positions[best->first];
}

// Every state's kFrequent pick at kPickOccurrences, in one post-order walk of the
// suffix-link tree: a state's kPickOccurrences most recent positions are the most
// recent of its own positions and of its children's lists (the subtree's positions are
// those), so each list is merged from the lists below it, kept per level of the walk's
// stack (no recursion). A state with one child and no own positions has that child's
// list, hence its pick. O(states x kPickOccurrences) merging, plus the reads of the next
// tokens of each list's positions. The tree is as deep as the longest repeated string:
// below kPickDepth levels the walk takes a subtree's list from recent_positions instead
// of walking it, and those states keep kNoPick (their continuation reads them as before).
void TokenIndex::build_frequent_picks() {
  LargeVector<uint32_t> picks(st_.size(), kNoPick);
  // The root's subtrees are independent: one task each, on the batch threads (each writes
  // the picks of its own states only). A task that fails (memory) leaves its states lazy.
  std::vector<int32_t> tops;
  for (int32_t c = st_[0].first_child; c != -1; c = st_[c].next_sib) tops.push_back(c);
  run_tasks(tops.size(), [&](size_t i) {
    try {
      pick_subtree(tops[i], picks.data());
    } catch (...) {
    }
  });
  frequent_picks_ = std::move(picks);
}

void TokenIndex::pick_subtree(int32_t top, uint32_t* picks) const {
  constexpr size_t K = kPickOccurrences;
  struct Level {
    int32_t state;
    int32_t next_child;  // the next child to walk, -1 when all were
    uint32_t size;       // positions in this level's list
  };
  std::vector<Level> stack;
  std::vector<uint32_t> lists;  // K per level: the state's list, most recent first
  uint32_t merged[K];
  // Merges list b (most recent first) into level d's list, keeping the K most recent.
  auto merge_into = [&](size_t d, const uint32_t* b, size_t nb) {
    const uint32_t* a = lists.data() + d * K;
    const size_t na = stack[d].size;
    size_t i = 0, j = 0, n = 0;
    while (n < K && (i < na || j < nb)) {
      merged[n++] = (j >= nb || (i < na && a[i] > b[j])) ? a[i++] : b[j++];
    }
    std::copy(merged, merged + n, lists.data() + d * K);
    stack[d].size = uint32_t(n);
  };
  stack.push_back({top, st_[top].first_child, 0});
  lists.resize(K);
  while (!stack.empty()) {
    const size_t d = stack.size() - 1;
    const int32_t child = stack[d].next_child;
    if (child != -1) {
      stack[d].next_child = st_[child].next_sib;
      if (stack.size() >= kPickDepth) {  // too deep: the child's subtree is left lazy
        const auto below = recent_positions(child, K);
        merge_into(d, below.data(), below.size());
        continue;
      }
      stack.push_back({child, st_[child].first_child, 0});
      if (lists.size() < stack.size() * K) lists.resize(2 * stack.size() * K);
      continue;
    }
    const int32_t v = stack[d].state;
    const State& s = st_[v];
    if (s.own_head != -1) {  // own positions: a chain, most recent first
      uint32_t own[K];
      size_t n = 0;
      for (int32_t g = s.own_head; g != -1 && n < K; g = own_next_[g]) own[n++] = uint32_t(g);
      merge_into(d, own, n);
    }
    const uint32_t* list = lists.data() + d * K;
    const size_t n = stack[d].size;
    const int32_t only =
        s.first_child != -1 && st_[s.first_child].next_sib == -1 ? s.first_child : -1;
    if (n > 0) {
      if (s.own_head == -1 && only != -1 && picks[only] != kNoPick) {
        picks[v] = picks[only];  // the same list as its one child's
      } else {
        picks[v] = n == 1 ? list[0] : frequent_choice(list, n);
      }
    }
    if (d > 0) merge_into(d - 1, list, n);
    stack.pop_back();
  }
}

void TokenIndex::remove(int64_t doc_id) {
  if (frozen()) throw ArgumentError(kReadOnly);
  Writing guard(*this);
  if (frozen()) throw ArgumentError(kReadOnly);
  auto it = doc_slot_.find(doc_id);
  if (it == doc_slot_.end() || docs_[it->second].removed) {
    throw DocumentError("no document " + std::to_string(doc_id) + " in the index");
  }
  Doc& d = docs_[it->second];
  num_tokens_ -= d.tokens.size();
  d.tokens.clear();
  d.tokens.shrink_to_fit();
  d.removed = true;
  --num_live_docs_;
  // Replay the surviving positions in their original order, so recency is kept.
  LargeVector<uint32_t> old_doc, old_off;
  old_doc.swap(pos_doc_);
  old_off.swap(pos_off_);
  reset_automaton();
  for (auto& doc : docs_) doc.last_state = 0;
  for (size_t g = 0; g < old_doc.size(); ++g) {
    if (!docs_[old_doc[g]].removed) insert_position(old_doc[g], old_off[g]);
  }
  ++epoch_;
}

const TokenIndex::Doc* TokenIndex::live_doc(int64_t doc_id) const {
  auto it = doc_slot_.find(doc_id);
  if (it == doc_slot_.end() || docs_[it->second].removed) return nullptr;
  return &docs_[it->second];
}

bool TokenIndex::contains(int64_t doc_id) const {
  Reading guard(*this);
  return live_doc(doc_id) != nullptr;
}

std::vector<Token> TokenIndex::document(int64_t doc_id) const {
  Reading guard(*this);
  const Doc* d = live_doc(doc_id);
  if (!d) throw DocumentError("no document " + std::to_string(doc_id) + " in the index");
  return std::vector<Token>(d->tokens.begin(), d->tokens.end());
}

size_t TokenIndex::num_documents() const {
  Reading guard(*this);
  return num_live_docs_;
}

size_t TokenIndex::num_tokens() const {
  Reading guard(*this);
  return num_tokens_;
}

size_t TokenIndex::num_positions() const {
  Reading guard(*this);
  return pos_doc_.size();
}

size_t TokenIndex::num_states() const {
  Reading guard(*this);
  return st_.size();
}

std::vector<int64_t> TokenIndex::document_ids() const {
  Reading guard(*this);
  std::vector<int64_t> ids;
  for (const auto& d : docs_) {
    if (!d.removed) ids.push_back(d.id);
  }
  return ids;
}

size_t TokenIndex::num_bytes() const {
  Reading guard(*this);
  size_t b = edges_.num_bytes();
  b += st_.capacity() * sizeof(State);
  b += (edge_next_.capacity() + own_next_.capacity() + edge_token_.capacity()) * sizeof(int32_t);
  b += (pos_doc_.capacity() + pos_off_.capacity() + pos_tok_.capacity() +
        frequent_picks_.capacity()) *
       sizeof(uint32_t);
  for (const auto& d : docs_) b += sizeof(Doc) + d.tokens.capacity() * sizeof(Token);
  b += doc_slot_.size() * (sizeof(int64_t) + sizeof(uint32_t) + 2 * sizeof(void*));
  return b;
}

std::vector<uint32_t> TokenIndex::recent_positions(int32_t v, size_t max_count) const {
  // Lazy k-way merge over the link subtree of v. Children are sorted by last_pos_
  // (descending), so a node's next sibling is pushed only when the node is popped.
  struct Item {
    uint32_t key;
    int32_t node;  // a state (subtree item) or -1 for an owned-position item
    bool operator<(const Item& o) const { return key < o.key; }
  };
  std::vector<uint32_t> out;
  // There are no more positions than pos_doc_ holds: a larger max_count means "all".
  max_count = std::min(max_count, pos_doc_.size());
  if (max_count == 0) return out;
  // An earlier answer for v, when there is one that can serve: v's subtree only ever
  // gains positions, each newer than every position before, and each moves
  // st_[v].last_pos. So the answer stands while last_pos is what it recorded, and
  // otherwise the positions above that last_pos, merged in front of it, are the answer
  // (a live index's session text adds a few positions under the state a draft matches
  // at every step). A rebuild renumbers (epoch).
  std::vector<uint32_t> earlier;
  bool earlier_complete = false;
  int64_t floor = -1;  // walk only positions above this one (-1: all)
  {
    std::lock_guard<std::mutex> guard(recent_cache_mu_);
    if (recent_cache_epoch_ != epoch_) {
      recent_cache_.clear();
      recent_cache_epoch_ = epoch_;
    }
    const auto hit = recent_cache_.find(v);
    if (hit != recent_cache_.end() &&
        (hit->second.positions.size() >= max_count || hit->second.complete)) {
      const auto& p = hit->second.positions;
      if (hit->second.last_pos == st_[v].last_pos) {
        return std::vector<uint32_t>(p.begin(), p.begin() + std::min(max_count, p.size()));
      }
      earlier.assign(p.begin(), p.begin() + std::min(max_count, p.size()));
      earlier_complete = hit->second.complete && p.size() <= max_count;
      floor = hit->second.last_pos;
    }
  }
  std::vector<Item> heap;
  heap.reserve(std::min<size_t>(4 * max_count + 4, 4096));
  out.reserve(std::min<size_t>(max_count, 1024));
  heap.push_back({st_[v].last_pos, v});
  size_t pops = 0;
  while (!heap.empty() && out.size() < max_count) {
    std::pop_heap(heap.begin(), heap.end());
    const Item it = heap.back();
    heap.pop_back();
    ++pops;
    // A pushed item is popped a few pops later: ask for what its pop will read now (a
    // large index's states are cache misses), so that those misses overlap. Items at or
    // below the floor are the earlier answer's.
    auto push = [&heap, floor, this](uint32_t key, int32_t node) {
      if (int64_t{key} <= floor) return;
      if (node == -1) {
        __builtin_prefetch(own_next_.data() + key);
      } else {
        const State& s = st_[node];
        if (s.first_child != -1) __builtin_prefetch(st_.data() + s.first_child);
        if (s.next_sib != -1) __builtin_prefetch(st_.data() + s.next_sib);
        if (s.own_head != -1) __builtin_prefetch(own_next_.data() + s.own_head);
      }
      heap.push_back({key, node});
      std::push_heap(heap.begin(), heap.end());
    };
    if (it.node == -1) {
      out.push_back(it.key);
      const int32_t nxt = own_next_[it.key];
      if (nxt != -1) push(static_cast<uint32_t>(nxt), -1);
      continue;
    }
    const int32_t u = it.node;
    if (st_[u].own_head != -1) push(static_cast<uint32_t>(st_[u].own_head), -1);
    if (st_[u].first_child != -1) push(st_[st_[u].first_child].last_pos, st_[u].first_child);
    if (u != v && st_[u].next_sib != -1) push(st_[st_[u].next_sib].last_pos, st_[u].next_sib);
  }
  bool complete = heap.empty() && out.size() < max_count;
  if (floor >= 0) {
    // Every position above the floor is in out (or out is full): the earlier ones follow.
    complete = complete && earlier_complete && out.size() + earlier.size() < max_count;
    for (size_t k = 0; k < earlier.size() && out.size() < max_count; ++k) {
      out.push_back(earlier[k]);
    }
  }
  // Keep the expensive answers (a large subtree: short, frequent matches), which are
  // also the ones asked again, and every answer that updated a kept one; the cache is
  // bounded and starts over when full.
  if (floor >= 0 || pops > 2 * max_count + 8) {
    std::lock_guard<std::mutex> guard(recent_cache_mu_);
    if (recent_cache_epoch_ == epoch_) {
      if (recent_cache_.size() >= kRecentCacheEntries) recent_cache_.clear();
      recent_cache_[v] = RecentEntry{out, st_[v].last_pos, complete};
    }
  }
  return out;
}

Occurrence TokenIndex::occurrence(uint32_t pos) const {
  return Occurrence{docs_[pos_doc_[pos]].id, static_cast<int64_t>(pos_off_[pos])};
}

std::vector<Token> TokenIndex::tokens_after(uint32_t pos, size_t max_tokens) const {
  const auto& toks = docs_[pos_doc_[pos]].tokens;
  const size_t begin = pos_off_[pos] + 1;  // <= toks.size(): positions have a successor
  const size_t end = begin + std::min(max_tokens, toks.size() - begin);
  return std::vector<Token>(toks.begin() + begin, toks.begin() + end);
}

void TokenIndex::prefetch_position(uint32_t pos) const {
  __builtin_prefetch(pos_doc_.data() + pos);
  __builtin_prefetch(pos_off_.data() + pos);
}

void TokenIndex::prefetch_next_tokens(uint32_t pos) const {
  const auto& toks = docs_[pos_doc_[pos]].tokens;
  const size_t begin = pos_off_[pos] + 1;
  if (begin < toks.size()) __builtin_prefetch(toks.data() + begin);
}

void TokenIndex::next_tokens(uint32_t pos, Token* out, size_t max_tokens) const {
  const auto& toks = docs_[pos_doc_[pos]].tokens;
  const size_t begin = pos_off_[pos] + 1;
  const size_t end = begin + std::min(max_tokens, toks.size() - begin);
  for (size_t i = begin; i < end; ++i) out[i - begin] = toks[i];
}

size_t TokenIndex::common_suffix(uint32_t pos, const Token* tail, size_t tail_len,
                                 size_t max_len) const {
  const auto& toks = docs_[pos_doc_[pos]].tokens;
  const size_t off = pos_off_[pos];
  const size_t limit = std::min({max_len, tail_len, off + 1});
  size_t k = 0;
  while (k < limit && tail[tail_len - 1 - k] == toks[off - k]) ++k;
  return k;
}

}  // namespace agspec
