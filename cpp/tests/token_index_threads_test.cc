// Threads racing on one index, as a server shares it: a writer (small and large extends,
// one remove), a saver (save, load the file back, query the snapshot), two readers
// (cursors, document(), the counters), and close() while the writer is inside a large
// extend. Built without Python so CI runs it under ThreadSanitizer and under
// AddressSanitizer + UBSan. What it checks besides the sanitizers: every call either
// works or raises StateError (or DocumentError for a document not there yet); every
// saved file loads (load verifies it) and holds a state the index really had; after
// close() every call raises StateError. Then freeze() racing a writer and two readers
// of the remembered "frequent" answers, cursor sets of two threads stepping in batches
// over a frozen corpus and a history both append to, and a large batch on the helper
// threads against the same batch on one.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cursor_set.h"
#include "match_cursor.h"
#include "token_index.h"
#include "workers.h"

using agspec::ArgumentError;
using agspec::CursorSet;
using agspec::MatchCursor;
using agspec::StateError;
using agspec::Token;
using agspec::TokenIndex;
using Docs = std::map<int64_t, std::vector<Token>>;

namespace {

std::atomic<int> failures{0};
std::mutex report_mu;

void fail(const std::string& what) {
  std::lock_guard<std::mutex> lock(report_mu);
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  ++failures;
}

bool is_prefix(const std::vector<Token>& a, const std::vector<Token>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Runs fn; a StateError counts as refused (and says whether the index was closed).
template <class Fn>
bool attempt(Fn fn, std::atomic<long>& refused, bool* closed = nullptr) {
  try {
    fn();
    return true;
  } catch (const StateError& e) {
    ++refused;
    if (closed && std::string(e.what()).find("closed") != std::string::npos) *closed = true;
    std::this_thread::yield();
    return false;
  } catch (const agspec::DocumentError&) {
    return false;  // a document that is not (or no longer) there
  } catch (const std::exception& e) {
    fail(std::string("unexpected exception: ") + e.what());
    return false;
  }
}

// A writer extends until freeze() lands; two readers ask for "frequent" continuations
// (remembered per state once frozen) meanwhile. After the freeze no extend succeeds, and
// the text is what the writer wrote before it.
void freeze_scenario() {
  auto index = std::make_shared<TokenIndex>();
  std::atomic<long> refused{0};
  std::atomic<bool> frozen_seen{false};
  std::vector<Token> written;
  std::thread writer([&] {
    std::mt19937 rng(7);
    for (int i = 0; i < 4000 && !frozen_seen; ++i) {
      std::vector<Token> toks(1 + rng() % 30);
      for (auto& t : toks) t = Token(rng() % 6);
      try {
        index->extend(0, toks.data(), toks.size());
        written.insert(written.end(), toks.begin(), toks.end());
      } catch (const StateError&) {
        ++refused;
      } catch (const ArgumentError&) {
        frozen_seen = true;  // read-only now
      }
    }
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937 rng(50 + r);
      for (int op = 0; op < 3000; ++op) {
        std::vector<Token> q(4);
        for (auto& t : q) t = Token(rng() % 6);
        attempt(
            [&] {
              MatchCursor cur(index, 6);
              cur.extend(q.data(), q.size());
              (void)cur.continuation(8, agspec::ContinuationRule::kFrequent, 1 + op % 32);
            },
            refused);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  while (!attempt([&] { index->freeze(); }, refused)) {
  }
  writer.join();
  for (auto& t : readers) t.join();
  if (!index->frozen()) fail("freeze() did not make the index read-only");
  if (index->document(0) != written) fail("the frozen text is not what was written");
  const Token one = 1;
  try {
    index->extend(0, &one, 1);
    fail("an extend after freeze() succeeded");
  } catch (const ArgumentError&) {
  }
}

// Two threads, each with its own cursor sets over a frozen corpus and a shared history
// that both append to, step in batches (advance_batch), as two engine threads would.
void cursor_set_scenario() {
  auto global = std::make_shared<TokenIndex>();
  std::mt19937 rng(3);
  for (int d = 0; d < 8; ++d) {
    std::vector<Token> toks(500);
    for (auto& t : toks) t = Token(rng() % 8);
    global->extend(d, toks.data(), toks.size());
  }
  global->freeze();
  auto history = std::make_shared<TokenIndex>();
  std::atomic<long> refused{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 r(20 + w);
      std::vector<std::unique_ptr<CursorSet>> sets;
      for (int k = 0; k < 8; ++k) {
        auto s = std::make_unique<CursorSet>();
        const Token tail[2] = {Token(r() % 8), Token(r() % 8)};
        s->add_cursor(global, 16, tail, 2);
        s->add_cursor(history, 16, tail, 2);
        s->add_append(history, 100 * w + k);
        sets.push_back(std::move(s));
      }
      std::vector<CursorSet*> raw;
      for (auto& s : sets) raw.push_back(s.get());
      for (int step = 0; step < 300; ++step) {
        std::vector<std::vector<Token>> toks(raw.size());
        std::vector<const Token*> data;
        std::vector<size_t> lengths;
        for (auto& t : toks) {
          t.resize(1 + r() % 4);
          for (auto& x : t) x = Token(r() % 8);
          data.push_back(t.data());
          lengths.push_back(t.size());
        }
        attempt([&] { agspec::advance_batch(raw.data(), data.data(), lengths.data(), raw.size()); },
                refused);
        std::vector<int32_t> out(2 * raw.size());
        attempt([&] { agspec::match_lengths_batch(raw.data(), raw.size(), out.data()); }, refused);
        for (int32_t m : out) {
          if (m < 0 || m > 16) fail("a match length out of range");
        }
      }
    });
  }
  for (auto& t : threads) t.join();
}

// A large batch on the helper threads (workers.h) against the same batch on the caller
// alone: two identical worlds (a frozen corpus, a history and session corpora that many
// sets append to, one set appending twice to its session), stepped alike; every match
// length, every rule's continuation and every document must be equal.
void batch_threads_scenario() {
  struct World {
    std::shared_ptr<TokenIndex> global, history;
    std::vector<std::shared_ptr<TokenIndex>> sessions;
    std::vector<std::unique_ptr<CursorSet>> sets;
    std::vector<CursorSet*> raw;
  };
  constexpr int kSets = 40;
  auto make = [] {
    World w;
    std::mt19937 rng(5);
    w.global = std::make_shared<TokenIndex>();
    for (int d = 0; d < 6; ++d) {
      std::vector<Token> toks(400);
      for (auto& t : toks) t = Token(rng() % 6);
      w.global->extend(d, toks.data(), toks.size());
    }
    w.global->freeze();
    w.history = std::make_shared<TokenIndex>();
    for (int k = 0; k < 5; ++k) w.sessions.push_back(std::make_shared<TokenIndex>());
    for (int i = 0; i < kSets; ++i) {
      auto s = std::make_unique<CursorSet>();
      const Token tail[2] = {Token(i % 6), Token((i / 6) % 6)};
      auto& session = w.sessions[i % 5];
      s->add_cursor(session, 12, tail, 2);
      s->add_cursor(w.history, 12, tail, 2);
      s->add_cursor(w.global, 12, tail, 2);
      s->add_append(session, i);
      s->add_append(w.history, i);
      if (i % 7 == 0) s->add_append(session, 1000 + i);
      w.raw.push_back(s.get());
      w.sets.push_back(std::move(s));
    }
    return w;
  };
  World a = make(), b = make();
  std::mt19937 rng(9);
  for (int step = 0; step < 120; ++step) {
    std::vector<std::vector<Token>> toks(kSets);
    std::vector<const Token*> data;
    std::vector<size_t> lengths;
    for (auto& t : toks) {
      t.resize(rng() % 5);  // some sets commit nothing this step
      for (auto& x : t) x = Token(rng() % 6);
      data.push_back(t.data());
      lengths.push_back(t.size());
    }
    std::vector<int32_t> la(3 * kSets), lb(3 * kSets);
    agspec::prepare_batch(kSets);  // the helpers woken ahead (or not, in world a)
    agspec::set_batch_threads(1);
    agspec::advance_batch(a.raw.data(), data.data(), lengths.data(), kSets);
    agspec::match_lengths_batch(a.raw.data(), kSets, la.data());
    agspec::set_batch_threads(4);
    if (step % 2 == 0) {
      agspec::advance_batch(b.raw.data(), data.data(), lengths.data(), kSets);
    } else {
      // Begun, the caller busy with its own work while the helpers move the cursors.
      agspec::AdvanceBatch job(b.raw.data(), data.data(), lengths.data(), kSets);
      volatile uint64_t busy = 0;
      for (int k = 0; k < 20000; ++k) busy = busy + uint64_t(k);
      job.finish();
    }
    agspec::match_lengths_batch(b.raw.data(), kSets, lb.data());
    if (la != lb) fail("batch threads: match lengths differ at step " + std::to_string(step));
    std::vector<int64_t> slots(kSets), max_tokens(kSets);
    std::vector<agspec::ContinuationRule> rules(kSets);
    for (int i = 0; i < kSets; ++i) {
      slots[i] = (step + i) % 4 - 1;  // -1: no draft for this set
      max_tokens[i] = 1 + (i % 8);
      rules[i] = agspec::ContinuationRule((step + 3 * i) % 4);
    }
    std::vector<std::vector<Token>> ca(kSets), cb(kSets);
    agspec::set_batch_threads(1);
    agspec::continuation_batch(a.raw.data(), slots.data(), max_tokens.data(), rules.data(), 16,
                               kSets, ca.data());
    agspec::set_batch_threads(4);
    agspec::continuation_batch(b.raw.data(), slots.data(), max_tokens.data(), rules.data(), 16,
                               kSets, cb.data());
    if (ca != cb) fail("batch threads: continuations differ at step " + std::to_string(step));
  }
  for (int i = 0; i < kSets; ++i) {
    if (a.history->document(i) != b.history->document(i)) fail("batch threads: history differs");
    if (a.sessions[i % 5]->document(i) != b.sessions[i % 5]->document(i)) {
      fail("batch threads: a session document differs");
    }
  }
  if (a.history->num_positions() != b.history->num_positions()) {
    fail("batch threads: history positions differ");
  }
  agspec::set_batch_threads(0);
}

}  // namespace

int main() {
  freeze_scenario();
  cursor_set_scenario();
  batch_threads_scenario();
  constexpr int kRemoveAt = 90;  // the writer's iteration that removes document 10
  constexpr int kCloseAt = 180;  // close() once the writer is past this iteration
  auto index = std::make_shared<TokenIndex>();
  Docs truth;                    // the writer's record; read by others only after join
  std::atomic<int> progress{0};  // writer iterations done
  std::atomic<long> refused{0};

  std::thread writer([idx = index, &truth, &progress, &refused] {
    std::mt19937 rng(1);
    bool closed = false;
    for (int i = 0; !closed; ++i) {
      const int64_t doc = (i == 0) ? 10 : i % 4;
      const size_t n = (i % 5 == 4) ? 3000 + rng() % 6000 : rng() % 40;
      std::vector<Token> toks(n);
      for (auto& t : toks) t = Token(rng() % 20);
      if (attempt([&] { idx->extend(doc, toks.data(), toks.size()); }, refused, &closed)) {
        truth[doc].insert(truth[doc].end(), toks.begin(), toks.end());
      }
      if (i == kRemoveAt) {
        while (!closed && !attempt([&] { idx->remove(10); }, refused, &closed)) {
        }
      }
      progress = i + 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // let the others in
    }
  });

  std::vector<Docs> snapshots;
  std::thread saver([idx = index, &snapshots, &refused] {
    bool closed = false;
    for (int k = 0; !closed; ++k) {
      const std::string path = "token_index_threads_test." + std::to_string(k % 2) + ".agidx";
      if (!attempt([&] { idx->save(path); }, refused, &closed)) continue;
      try {
        auto loaded = TokenIndex::load(path);  // verifies the structure
        Docs snap;
        for (int64_t id : loaded->document_ids()) snap[id] = loaded->document(id);
        MatchCursor cur(loaded, 8);
        const std::vector<Token> q = {1, 2, 3, 4};
        cur.extend(q.data(), q.size());
        (void)cur.continuation(16, agspec::ContinuationRule::kFrequent, 32);
        snapshots.push_back(std::move(snap));
      } catch (const std::exception& e) {
        fail(std::string("a saved file does not load: ") + e.what());
      }
      std::remove(path.c_str());
    }
  });

  std::vector<Docs> reads(2);
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([idx = index, r, &reads, &refused] {
      std::mt19937 rng(100 + r);
      std::unique_ptr<MatchCursor> cur;
      bool closed = false;
      while (!closed && !cur) {
        attempt([&] { cur = std::make_unique<MatchCursor>(idx, 16); }, refused, &closed);
      }
      for (long op = 0; !closed; ++op) {
        std::vector<Token> toks(1 + rng() % 4);
        for (auto& t : toks) t = Token(rng() % 20);
        switch (op % 6) {
          case 0:
            attempt([&] { cur->extend(toks.data(), toks.size()); }, refused, &closed);
            break;
          case 1:
            attempt([&] { (void)cur->occurrences(8); }, refused, &closed);
            break;
          case 2:
            attempt([&] { (void)cur->continuation(16, agspec::ContinuationRule(rng() % 4), 32); },
                    refused, &closed);
            break;
          case 3:
            attempt(
                [&] {
                  const int64_t id = rng() % 4;
                  auto doc = idx->document(id);
                  auto& longest = reads[r][id];
                  if (doc.size() > longest.size()) longest = std::move(doc);
                },
                refused, &closed);
            break;
          case 4:
            attempt(
                [&] {
                  (void)idx->document_ids();
                  (void)idx->contains(10);
                  (void)idx->num_documents();
                },
                refused, &closed);
            break;
          default:
            attempt(
                [&] {
                  (void)idx->num_tokens();
                  (void)idx->num_positions();
                  (void)idx->num_bytes();
                  (void)cur->match_length();
                },
                refused, &closed);
        }
      }
      // Closed: the cursor must say so too.
      try {
        (void)cur->match_length();
        fail("a cursor call after close() succeeded");
      } catch (const StateError&) {
      }
    });
  }

  while (progress < kCloseAt) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  index->close();  // the writer is somewhere in its loop, often inside a large extend
  bool refused_after_close = false;
  try {
    (void)index->num_tokens();
  } catch (const StateError&) {
    refused_after_close = true;
  }
  if (!refused_after_close) fail("a call after close() succeeded");
  index.reset();  // the threads hold the last references, as calls in flight do

  writer.join();
  saver.join();
  for (auto& t : readers) t.join();

  for (const auto& snap : snapshots) {
    for (const auto& [id, toks] : snap) {
      if (!is_prefix(toks, truth[id])) fail("a saved file holds a state the index never had");
    }
  }
  for (const auto& docs : reads) {
    for (const auto& [id, toks] : docs) {
      if (!is_prefix(toks, truth[id])) fail("document() returned tokens never written");
    }
  }
  if (snapshots.size() < 3) fail("fewer than 3 saves succeeded");
  std::printf("token_index_threads_test: %zu saves checked, %ld calls refused, %s\n",
              snapshots.size(), refused.load(), failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
