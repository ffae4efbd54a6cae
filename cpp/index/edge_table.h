// The suffix automaton's transitions beyond each state's first (TokenIndex keeps that
// one inline): an open-addressing hash map from (state, token) to the target state.
#pragma once

#include <cstddef>
#include <cstdint>

#include "large_pages.h"
#include "token.h"

namespace agspec {

// Open-addressing map (state, token) -> state for the automaton's transitions.
class EdgeTable {
 public:
  EdgeTable();
  int32_t get(int32_t state, Token token) const;
  // Asks for the cache lines get(state, token) reads first (no effect on results).
  void prefetch(int32_t state, Token token) const {
    if (keys_.empty()) return;
    const size_t i = mix64(key(state, token)) & mask_;
    __builtin_prefetch(keys_.data() + i);
    __builtin_prefetch(vals_.data() + i);
  }
  // The target of a present key, to read or overwrite in place; nullptr when absent.
  int32_t* find(int32_t state, Token token);
  // Inserts a key that is not present.
  void insert(int32_t state, Token token, int32_t target);
  size_t size() const { return size_; }
  size_t num_bytes() const;
  void clear();

 private:
  friend class TokenIndex;
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t key(int32_t s, Token t) { return (uint64_t(uint32_t(s)) << 32) | uint32_t(t); }
  size_t slot_of(uint64_t k) const;
  void grow();
  LargeVector<uint64_t> keys_;  // kEmpty marks a free slot
  LargeVector<int32_t> vals_;
  size_t size_ = 0;
  size_t mask_ = 0;
};

}  // namespace agspec
