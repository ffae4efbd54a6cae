#include "messages.h"

#include <stdexcept>

namespace agspec {

namespace {

// 64x64 -> 128-bit multiply, folded: the mixing step of the key (one multiply per two
// tokens, so hashing costs well under a nanosecond a token; the prompt's conversion from
// Python costs more).
inline uint64_t fold_mul(uint64_t a, uint64_t b) {
  const unsigned __int128 r = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}

constexpr uint64_t kSeed = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kMul = 0xd6e8feb86659fd93ULL;

}  // namespace

uint64_t message_key(const Token* tokens, size_t n) {
  uint64_t h = kSeed ^ (uint64_t(n) * kMul);
  size_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const uint64_t w = (uint64_t(uint32_t(tokens[i])) << 32) | uint32_t(tokens[i + 1]);
    h = fold_mul(h ^ w, kMul);
  }
  if (i < n) h = fold_mul(h ^ (uint64_t(uint32_t(tokens[i])) << 32 | 0xffffffffULL), kMul);
  return mix64(h);
}

MessageKeys message_keys(const Token* tokens, size_t n, int64_t separator, size_t known) {
  if (known > n) throw ArgumentError("message_keys: known exceeds the sequence's length");
  MessageKeys out;
  size_t start = 0;
  if (known > 0) {
    start = n;
    if (separator >= 0) {
      for (size_t i = known; i < n; ++i) {
        if (tokens[i] == separator) {
          start = i;
          break;
        }
      }
    }
  }
  out.first = start;
  if (start >= n) return out;
  auto add = [&](size_t a, size_t b) {
    if (b <= a) return;
    out.starts.push_back(a);
    out.keys.push_back(message_key(tokens + a, b - a));
  };
  size_t a = start;
  if (separator >= 0) {
    for (size_t i = start + 1; i < n; ++i) {
      if (tokens[i] == separator) {
        add(a, i);
        a = i;
      }
    }
  }
  add(a, n);
  return out;
}

}  // namespace agspec
