// The token id type every part of the native index shares, and its one hash.
#pragma once

#include <cstdint>

namespace agspec {

using Token = int32_t;

// A 64-bit finalizer (the transition table's hash, and the file checksum's mixer).
inline uint64_t mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

}  // namespace agspec
