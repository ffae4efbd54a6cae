// The frozen form of the token index (save, load) and the structural verification that
// makes a loaded file safe to query: a checksum proves the bytes are the ones written,
// not that whoever wrote them wrote a valid automaton.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "token_index.h"

namespace agspec {

namespace {

constexpr char kMagic[8] = {'A', 'G', 'S', 'P', 'E', 'C', 'I', 'X'};
// Version 5 appends the frozen index's frequent picks (TokenIndex::frequent_picks_);
// version 4 files (without them) still load, the picks built at load.
constexpr uint32_t kFormatVersion = 5;
constexpr uint32_t kOldestVersion = 4;
constexpr uint32_t kEndianMark = 0x01020304;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t endian;
  uint64_t payload_bytes;
  uint64_t checksum;
};

// A checksum over a stream of chunks, each zero-padded to 8 bytes (as the file is).
class Checksum {
 public:
  void update(const char* data, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) word(data + i);
    if (i < n) {
      char last[8] = {0};
      std::memcpy(last, data + i, n - i);
      word(last);
    }
  }
  uint64_t value() const { return mix64(h_ ^ mix64(words_)); }

 private:
  void word(const char* p) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h_ = (h_ ^ mix64(w)) * 0x100000001B3ULL;
    ++words_;
  }
  uint64_t h_ = 0x9E3779B97F4A7C15ULL;
  uint64_t words_ = 0;
};

size_t padding(size_t n) { return (8 - n % 8) % 8; }

// Writes sections (each padded to 8 bytes) straight to the file.
class Writer {
 public:
  explicit Writer(FILE* f) : f_(f) {}
  template <class T>
  void pod(const T& v) {
    chunk(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <class T, class A>
  void vec(const std::vector<T, A>& v) {
    pod<uint64_t>(v.size());
    chunk(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  bool ok() const { return ok_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t checksum() const { return sum_.value(); }

 private:
  void chunk(const char* data, size_t n) {
    static const char zeros[8] = {0};
    const size_t pad = padding(n);
    // An empty vector's data() may be null, which fwrite must not be given.
    ok_ = ok_ && (n == 0 || std::fwrite(data, 1, n, f_) == n) &&
          std::fwrite(zeros, 1, pad, f_) == pad;
    sum_.update(data, n);
    bytes_ += n + pad;
  }
  FILE* f_;
  Checksum sum_;
  uint64_t bytes_ = 0;
  bool ok_ = true;
};

// Reads sections straight into their vectors (no second copy of the file in memory).
class Reader {
 public:
  Reader(FILE* f, uint64_t payload_bytes) : f_(f), left_(payload_bytes) {}
  template <class T>
  T pod() {
    T v;
    chunk(reinterpret_cast<char*>(&v), sizeof(T));
    return v;
  }
  template <class T, class A>
  void vec(std::vector<T, A>* v) {
    const auto count = pod<uint64_t>();
    if (count > left_ / sizeof(T)) throw FormatError("index file is corrupt: bad array size");
    v->resize(count);
    chunk(reinterpret_cast<char*>(v->data()), count * sizeof(T));
  }
  bool done() const { return left_ == 0; }
  uint64_t checksum() const { return sum_.value(); }

 private:
  void chunk(char* data, size_t n) {
    const size_t pad = padding(n);
    if (left_ < n + pad) throw FormatError("index file is corrupt: payload ends early");
    char tail[8] = {0};
    if ((n != 0 && std::fread(data, 1, n, f_) != n) || std::fread(tail, 1, pad, f_) != pad) {
      throw FormatError("index file: short read");
    }
    for (size_t i = 0; i < pad; ++i) {
      if (tail[i] != 0) throw FormatError("index file is corrupt: bad padding");
    }
    sum_.update(data, n);
    left_ -= n + pad;
  }
  FILE* f_;
  uint64_t left_;
  Checksum sum_;
};

// Closes a FILE* on every path out.
struct FileCloser {
  FILE* f;
  ~FileCloser() {
    if (f) std::fclose(f);
  }
};

}  // namespace

namespace {

// Removes PATH.tmp.<pid>.<n> files that a save killed before its rename left behind
// (kill -9, a crash): those of a pid that no longer runs here and untouched for ten
// minutes (the name does not say the host: on a shared file system the pid may be
// another machine's, whose save in progress writes all the time). A live process's,
// this one's included, stays. Best effort: errors are ignored.
void remove_stale_temporaries(const std::string& path) noexcept {
  try {
    namespace fs = std::filesystem;
    const fs::path target(path);
    const std::string prefix = target.filename().string() + ".tmp.";
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      // <pid>.<n>, both all digits.
      const std::string rest = name.substr(prefix.size());
      const size_t dot = rest.find('.');
      auto digits = [](const std::string& x) {
        return !x.empty() && x.size() <= 12 &&
               x.find_first_not_of("0123456789") == std::string::npos;
      };
      if (dot == std::string::npos || !digits(rest.substr(0, dot)) ||
          !digits(rest.substr(dot + 1))) {
        continue;
      }
      const long long pid = std::stoll(rest.substr(0, dot));
      if (pid <= 0 || pid > std::numeric_limits<pid_t>::max() || pid == ::getpid()) continue;
      if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to know
      if (!it->is_regular_file(ec)) continue;
      const auto touched = fs::last_write_time(it->path(), ec);
      if (ec || fs::file_time_type::clock::now() - touched < std::chrono::minutes(10)) continue;
      fs::remove(it->path(), ec);
    }
  } catch (...) {
  }
}

}  // namespace

void TokenIndex::save(const std::string& path) const {
  Reading guard(*this);  // no writer can change the index while it is written out
  // A name no other save uses (another thread's, or another process's), created with
  // O_EXCL; the rename below replaces path atomically.
  static std::atomic<uint64_t> num_saves{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(num_saves.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  FILE* f = fd == -1 ? nullptr : ::fdopen(fd, "wb");
  if (!f) {
    if (fd != -1) ::close(fd);
    throw std::runtime_error("cannot open " + tmp + " for writing");
  }
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kFormatVersion;
  h.endian = kEndianMark;
  bool ok = std::fwrite(&h, sizeof(h), 1, f) == 1;  // placeholder, rewritten below
  Writer w(f);
  w.pod<uint64_t>(docs_.size());
  for (const auto& d : docs_) {
    w.pod<int64_t>(d.id);
    w.pod<uint8_t>(d.removed ? 1 : 0);
    w.pod<int32_t>(d.last_state);
    w.vec(d.tokens);
  }
  w.pod<uint64_t>(epoch_);
  w.vec(st_);
  w.vec(edge_next_);
  w.vec(own_next_);
  w.vec(edge_token_);
  w.vec(pos_doc_);
  w.vec(pos_off_);
  w.pod<uint64_t>(edges_.size_);
  w.vec(edges_.keys_);
  w.vec(edges_.vals_);
  // The picks' occurrence count, then the picks (none when the index is live).
  w.pod<uint64_t>(frequent_picks_.empty() ? 0 : kPickOccurrences);
  w.vec(frequent_picks_);
  h.payload_bytes = w.bytes();
  h.checksum = w.checksum();
  ok = ok && w.ok() && std::fseek(f, 0, SEEK_SET) == 0 && std::fwrite(&h, sizeof(h), 1, f) == 1;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    throw std::runtime_error("writing " + tmp + " failed (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot rename " + tmp + " to " + path);
  }
  remove_stale_temporaries(path);
}

std::shared_ptr<TokenIndex> TokenIndex::load(const std::string& path) {
  FileCloser file{std::fopen(path.c_str(), "rb")};
  FILE* f = file.f;
  if (!f) throw FormatError("cannot open index file " + path);
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  Header h{};
  if (size < long(sizeof(Header)) || std::fread(&h, sizeof(h), 1, f) != 1) {
    throw FormatError(path + " is not an AgSpec index file (too short for a header)");
  }
  if (std::memcmp(h.magic, kMagic, 8) != 0) {
    throw FormatError(path + " is not an AgSpec index file (bad magic)");
  }
  if (h.endian != kEndianMark) {
    throw FormatError(path + " was written on a machine of other byte order");
  }
  if (h.version < kOldestVersion || h.version > kFormatVersion) {
    throw FormatError(path + " has index format version " + std::to_string(h.version) +
                      "; this build reads versions " + std::to_string(kOldestVersion) + " to " +
                      std::to_string(kFormatVersion));
  }
  const uint64_t have = uint64_t(size) - sizeof(Header);
  if (have != h.payload_bytes) {
    throw FormatError(path + " is truncated or padded: header says " +
                      std::to_string(h.payload_bytes) + " payload bytes, file has " +
                      std::to_string(have));
  }
  auto idx = std::make_shared<TokenIndex>();
  Reader r(f, h.payload_bytes);
  const auto ndocs = r.pod<uint64_t>();
  if (ndocs > h.payload_bytes / 8) throw FormatError(path + " is corrupt: bad document count");
  idx->docs_.clear();
  for (uint64_t i = 0; i < ndocs; ++i) {
    Doc d{r.pod<int64_t>(), {}, 0, false};
    d.removed = r.pod<uint8_t>() != 0;
    d.last_state = r.pod<int32_t>();
    r.vec(&d.tokens);
    if (!d.removed) {
      ++idx->num_live_docs_;
      idx->num_tokens_ += d.tokens.size();
    }
    if (!idx->doc_slot_.emplace(d.id, uint32_t(i)).second) {
      throw FormatError(path + " is corrupt: duplicate document id");
    }
    idx->docs_.push_back(std::move(d));
  }
  idx->epoch_ = r.pod<uint64_t>();
  r.vec(&idx->st_);
  r.vec(&idx->edge_next_);
  r.vec(&idx->own_next_);
  r.vec(&idx->edge_token_);
  r.vec(&idx->pos_doc_);
  r.vec(&idx->pos_off_);
  idx->edges_.size_ = r.pod<uint64_t>();
  r.vec(&idx->edges_.keys_);
  r.vec(&idx->edges_.vals_);
  uint64_t pick_occurrences = 0;
  if (h.version >= 5) {
    pick_occurrences = r.pod<uint64_t>();
    r.vec(&idx->frequent_picks_);
  }
  if (!r.done()) throw FormatError(path + " is corrupt: trailing bytes");
  if (r.checksum() != h.checksum) throw FormatError(path + " is corrupt: checksum mismatch");

  idx->edges_.mask_ = idx->edges_.keys_.empty() ? 0 : idx->edges_.keys_.size() - 1;
  // The checksum only says the bytes are the ones written; a file edited on purpose and
  // given a new checksum must not reach a query unverified.
  idx->check_structure(path);
  // The picks a file holds are used when they are for this build's occurrence count: one
  // per state, each a position or kNoPick, so that a query stays in bounds (an edited
  // file's picks can only make drafts worse, never reach outside the index). A file
  // without them (version 4, a live index saved) or with another build's count gets them
  // built here.
  auto& picks = idx->frequent_picks_;
  if (pick_occurrences == 0 && !picks.empty()) {
    throw FormatError(path + " is corrupt: frequent picks without their occurrence count");
  }
  if (pick_occurrences == kPickOccurrences) {
    if (picks.size() != idx->st_.size()) {
      throw FormatError(path + " is corrupt: frequent picks for another number of states");
    }
    const size_t np = idx->pos_doc_.size();
    for (const uint32_t g : picks) {
      if (g != kNoPick && g >= np) {
        throw FormatError(path + " is corrupt: a frequent pick out of range");
      }
    }
  } else {
    idx->build_frequent_picks();
  }
  idx->frozen_.store(true);
  return idx;
}

void TokenIndex::verify() const {
  Reading guard(*this);
  check_structure("index");
}

// Checks, in O(size), every invariant a query relies on to stay in bounds and to finish
// (ranges; suffix links to strictly shorter states, so link walks end at the root;
// transitions to strictly longer states; link-tree child lists without cycles;
// own-position chains strictly decreasing; a transition table with free slots), and
// those that make its answers right (positions cover each document in order, owned
// positions sit in states of their length, the table finds every key it holds). `what`
// names the index in messages.
void TokenIndex::check_structure(const std::string& what) const {
  auto corrupt = [&what](const char* why) { return FormatError(what + " is corrupt: " + why); };
  const size_t ns = st_.size(), np = pos_doc_.size(), ne = edge_token_.size();
  const size_t nd = docs_.size();
  constexpr size_t kMax32 = std::numeric_limits<int32_t>::max();
  if (ns < 1 || ns > kMax32) throw corrupt("bad number of states");
  if (np >= kMax32 || ne > kMax32) throw corrupt("bad number of positions or transitions");
  if (pos_off_.size() != np || own_next_.size() != np || edge_next_.size() != ne) {
    throw corrupt("array sizes disagree");
  }

  // Documents, and the positions: a live document's offsets 0 .. n-2, in order.
  size_t max_len = 0, live = 0, tokens = 0;
  for (const Doc& d : docs_) {
    if (d.id < 0) throw corrupt("negative document id");
    if (d.removed && !d.tokens.empty()) throw corrupt("a removed document has tokens");
    if (d.tokens.size() > std::numeric_limits<uint32_t>::max()) {
      throw corrupt("document too long");
    }
    for (const Token t : d.tokens) {
      if (t < 0) throw corrupt("negative token id");
    }
    max_len = std::max(max_len, d.tokens.size());
    if (!d.removed) {
      ++live;
      tokens += d.tokens.size();
    }
  }
  if (doc_slot_.size() != nd || live != num_live_docs_ || tokens != num_tokens_) {
    throw corrupt("document counts disagree");
  }
  {
    std::vector<uint32_t> next_off(nd, 0);
    for (size_t g = 0; g < np; ++g) {
      const uint32_t doc = pos_doc_[g];
      if (doc >= nd || docs_[doc].removed) throw corrupt("a position outside the documents");
      if (pos_off_[g] != next_off[doc]) throw corrupt("positions out of order");
      ++next_off[doc];
    }
    for (size_t i = 0; i < nd; ++i) {
      const size_t n = docs_[i].tokens.size();
      if (next_off[i] != (n ? n - 1 : 0)) throw corrupt("positions do not cover a document");
    }
    // A live index's copy of each position's token (empty once frozen or loaded).
    if (!pos_tok_.empty()) {
      if (pos_tok_.size() != np) throw corrupt("array sizes disagree");
      for (size_t g = 0; g < np; ++g) {
        if (pos_tok_[g] != docs_[pos_doc_[g]].tokens[pos_off_[g]]) {
          throw corrupt("a position's token copy is wrong");
        }
      }
    }
  }

  // States, one pass: ranges, the root, lengths, inline transitions, and the link tree.
  // Every check here is local (a state against the few it points to) or a count, in one
  // sequential pass: walking lists or chains instead would be a chain of dependent cache
  // misses, which at 10M tokens costs seconds. They still prove the global shape:
  //  - len(link(s)) < len(s): link walks shorten strictly and end at the root;
  //  - prev(c) = p implies next(p) = c and link(p) = link(c), and as many states have a
  //    next as have a prev: prev and next are inverse, and siblings share their link;
  //  - last_pos falls strictly along next: sibling lists are paths, not cycles;
  //  - a list's head (prev = -1) is its parent's first_child, and as many states have a
  //    first_child as there are heads: each parent has one list, holding every state
  //    that links to it.
  auto in = [](int64_t x, int64_t lo, size_t hi) { return lo <= x && x < int64_t(hi); };
  const size_t npos = std::max<size_t>(np, 1);
  const State& root = st_[0];
  if (root.len != 0 || root.link != -1 || root.next_sib != -1 || root.prev_sib != -1 ||
      root.own_head != -1) {
    throw corrupt("bad root state");
  }
  size_t num_next = 0, num_prev = 0, num_first_child = 0, num_heads = 0;
  constexpr size_t kAhead = 32;  // prefetch distance, in states
  auto clamp = [ns](int32_t x) { return size_t(uint32_t(x)) < ns ? size_t(x) : size_t(0); };
  for (size_t s = 0; s < ns; ++s) {
    if (s + kAhead < ns) {  // the states this loop will compare with, kAhead from now
      const State& later = st_[s + kAhead];
      __builtin_prefetch(&st_[clamp(later.link)]);
      __builtin_prefetch(&st_[clamp(later.prev_sib)]);
      __builtin_prefetch(&st_[clamp(later.in_tgt)]);
    }
    const State& q = st_[s];
    if (!in(q.link, -1, ns) || !in(q.first_child, -1, ns) || !in(q.next_sib, -1, ns) ||
        !in(q.prev_sib, -1, ns) || !in(q.own_head, -1, np) || !in(q.edge_head, -1, ne) ||
        !in(q.in_tgt, -1, ns) || q.in_tok < -1 || q.first_pos >= npos || q.last_pos >= npos ||
        q.first_pos > q.last_pos) {
      throw corrupt("a state field out of range");
    }
    if (q.in_tok == -1 ? (q.in_tgt != -1 || q.edge_head != -1)
                       : (q.in_tgt == -1 || st_[q.in_tgt].len <= q.len)) {
      throw corrupt("a transition that does not lead to a longer state");
    }
    num_next += q.next_sib != -1;
    num_first_child += q.first_child != -1;
    if (s == 0) continue;
    const State& parent = st_[q.link == -1 ? 0 : q.link];
    if (q.link == -1 || parent.len >= q.len || size_t(q.len) > max_len) {
      throw corrupt("a suffix link that does not lead to a shorter state");
    }
    if (q.prev_sib == -1) {
      if (parent.first_child != int32_t(s)) {
        throw corrupt("the suffix-link tree's child lists are broken");
      }
      ++num_heads;
    } else {
      const State& prev = st_[q.prev_sib];
      if (prev.next_sib != int32_t(s) || prev.link != q.link) {
        throw corrupt("the suffix-link tree's child lists are broken");
      }
      if (prev.last_pos <= q.last_pos) {
        throw corrupt("the suffix-link tree is out of recency order");
      }
      ++num_prev;
    }
    if (q.last_pos > parent.last_pos) {
      throw corrupt("the suffix-link tree is out of recency order");
    }
  }
  if (num_next != num_prev || num_first_child != num_heads) {
    throw corrupt("the suffix-link tree's child lists are broken");
  }

  // Owned positions, locally too: chains fall strictly (no cycles); each position has one
  // predecessor or heads one state's chain (so chains partition the positions, one per
  // state); a chain keeps its offset and its head has the state's length (so every owned
  // position is a prefix of its state's length).
  {
    std::vector<uint8_t> entered(np, 0);
    for (size_t g = 0; g < np; ++g) {
      const int32_t n = own_next_[g];
      if (n == -1) continue;
      if (n < 0 || size_t(n) >= g || entered[n]) throw corrupt("a broken position chain");
      if (pos_off_[n] != pos_off_[g]) throw corrupt("a position chain mixes lengths");
      entered[n] = 1;
    }
    for (size_t s = 0; s < ns; ++s) {
      const int32_t h = st_[s].own_head;
      if (h == -1) continue;
      if (entered[h]) throw corrupt("a broken position chain");
      if (int64_t(pos_off_[h]) + 1 != st_[s].len) {
        throw corrupt("a position owned by a state of another length");
      }
      entered[h] = 1;
    }
    for (size_t g = 0; g < np; ++g) {
      if (!entered[g]) throw corrupt("a position owned by no state");
    }
  }

  // Extra transitions' chains (used when a state is cloned), the same way.
  {
    std::vector<uint8_t> entered(ne, 0);
    for (size_t e = 0; e < ne; ++e) {
      const int32_t n = edge_next_[e];
      if (edge_token_[e] < 0) throw corrupt("a bad transition token");
      if (n == -1) continue;
      if (n < 0 || size_t(n) >= e || entered[n]) throw corrupt("a broken transition chain");
      entered[n] = 1;
    }
    for (size_t s = 0; s < ns; ++s) {
      const int32_t h = st_[s].edge_head;
      if (h == -1) continue;
      if (entered[h] || edge_token_[h] == st_[s].in_tok) {
        throw corrupt("a broken transition chain");
      }
      entered[h] = 1;
    }
    for (size_t e = 0; e < ne; ++e) {
      if (!entered[e]) throw corrupt("a transition in no state's chain");
    }
  }
  const auto& keys = edges_.keys_;
  const auto& vals = edges_.vals_;
  const size_t cap = keys.size();
  // The writer grows the table before it is 70% full; a lookup stops at a free slot.
  if (cap < 16 || (cap & (cap - 1)) != 0 || vals.size() != cap || edges_.mask_ != cap - 1 ||
      edges_.size_ != ne || edges_.size_ * 10 > cap * 7) {
    throw corrupt("bad transition table size");
  }
  size_t first_free = cap, occupied = 0;
  for (size_t i = 0; i < cap; ++i) {
    const uint64_t k = keys[i];
    if (k == EdgeTable::kEmpty) {
      if (first_free == cap) first_free = i;
      continue;
    }
    ++occupied;
    const auto s = int64_t(k >> 32);
    const auto t = int32_t(uint32_t(k));
    if (!in(s, 0, ns) || t < 0 || !in(vals[i], 0, ns) || st_[vals[i]].len <= st_[s].len) {
      throw corrupt("a transition that does not lead to a longer state");
    }
  }
  if (occupied != edges_.size_) throw corrupt("the transition table's count is wrong");
  // Linear probing finds a key only if no free slot lies between its home slot and it:
  // walking from a free slot, the run of occupied slots ending at each key must reach
  // back to the key's home.
  size_t run = 0;
  for (size_t j = 1; j <= cap; ++j) {
    const size_t i = (first_free + j) & edges_.mask_;
    if (keys[i] == EdgeTable::kEmpty) {
      run = 0;
      continue;
    }
    ++run;
    const size_t home = mix64(keys[i]) & edges_.mask_;
    if (((i - home) & edges_.mask_) >= run) throw corrupt("a transition lookups cannot reach");
  }

  // A live document's state is that of its indexed prefix (all tokens but the last).
  for (const Doc& d : docs_) {
    if (!in(d.last_state, 0, ns)) throw corrupt("a document state out of range");
    const size_t prefix = d.tokens.empty() ? 0 : d.tokens.size() - 1;
    if (!d.removed && size_t(st_[d.last_state].len) != prefix) {
      throw corrupt("a document state of the wrong length");
    }
  }
}

}  // namespace agspec
