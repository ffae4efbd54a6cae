// Splitting a token sequence into messages and keying each message by a hash of its ids,
// for a corpus that indexes each message of a growing prompt once (the session corpus of
// agspec.corpora.session). A sequence utility: which messages are new, and where they go,
// is decided in Python.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "token_index.h"

namespace agspec {

struct MessageKeys {
  // Where the messages start: `first`, then every separator after it. Message i is
  // tokens[starts[i] .. starts[i + 1]) (the last one runs to the end); empty ones are
  // left out.
  std::vector<size_t> starts;
  std::vector<uint64_t> keys;  // a 64-bit hash of each message's ids and length
  size_t first = 0;
};

// The messages of tokens[first(known) ..), where first(0) = 0 and, for known > 0, the
// first separator at or after `known` (the end when there is none, or no separator):
// the text before it belongs to a message whose start the caller already holds. A
// separator < 0 means none: everything from `first` on is one message.
MessageKeys message_keys(const Token* tokens, size_t n, int64_t separator, size_t known);

// The key message_keys gives tokens[0 .. n).
uint64_t message_key(const Token* tokens, size_t n);

}  // namespace agspec
