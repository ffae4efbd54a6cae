#include "edge_table.h"

namespace agspec {

EdgeTable::EdgeTable() { clear(); }

void EdgeTable::clear() {
  keys_.assign(16, kEmpty);
  vals_.assign(16, -1);
  size_ = 0;
  mask_ = 15;
}

size_t EdgeTable::slot_of(uint64_t k) const {
  size_t i = mix64(k) & mask_;
  while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & mask_;
  return i;
}

int32_t EdgeTable::get(int32_t state, Token token) const {
  const uint64_t k = key(state, token);
  size_t i = mix64(k) & mask_;
  // Keys and targets are two arrays. The target's read is issued speculatively once the
  // key compare is predicted to match, so its cache miss overlaps the key's (a prefetch
  // of the home slot's target measured no faster: eba7136).
  while (true) {
    const uint64_t cur = keys_[i];
    if (cur == k) return vals_[i];
    if (cur == kEmpty) return -1;
    i = (i + 1) & mask_;
  }
}

int32_t* EdgeTable::find(int32_t state, Token token) {
  const uint64_t k = key(state, token);
  for (size_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
    if (keys_[i] == k) return &vals_[i];
    if (keys_[i] == kEmpty) return nullptr;
  }
}

void EdgeTable::insert(int32_t state, Token token, int32_t target) {
  if ((size_ + 1) * 10 > keys_.size() * 7) grow();
  const uint64_t k = key(state, token);
  const size_t i = slot_of(k);
  keys_[i] = k;
  vals_[i] = target;
  ++size_;
}

void EdgeTable::grow() {
  LargeVector<uint64_t> old_keys;
  LargeVector<int32_t> old_vals;
  old_keys.swap(keys_);
  old_vals.swap(vals_);
  const size_t cap = old_keys.size() * 2;
  keys_.assign(cap, kEmpty);
  vals_.assign(cap, -1);
  mask_ = cap - 1;
  for (size_t j = 0; j < old_keys.size(); ++j) {
    if (old_keys[j] == kEmpty) continue;
    const size_t i = slot_of(old_keys[j]);
    keys_[i] = old_keys[j];
    vals_[i] = old_vals[j];
  }
}

size_t EdgeTable::num_bytes() const {
  return keys_.capacity() * sizeof(uint64_t) + vals_.capacity() * sizeof(int32_t);
}

}  // namespace agspec
