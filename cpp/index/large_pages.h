// Large arrays of the index (8 MB or more) on 2 MB pages where the system allows it.
//
// A query walks the automaton and reads positions at random places of arrays that reach
// hundreds of MB (a 10M-token global corpus: about 470 MB). On 4 KB pages nearly every
// such read also misses the TLB, and the page walk itself misses the caches; on 2 MB pages
// the whole index fits the TLB. Linux backs a region with 2 MB pages when asked
// (madvise MADV_HUGEPAGE, with transparent huge pages in "madvise" or "always" mode), so
// arrays of at least kLargeArrayBytes are allocated 2 MB-aligned, rounded up to whole 2 MB
// pages, and advised before their first write. Smaller arrays and other systems use the
// ordinary allocation; with AGSPEC_LARGE_PAGES=0 (or set_large_pages(false)) large arrays
// are allocated the same way but not advised. Nothing else changes: the advice only moves
// where the memory lives, never what it holds. Measured gain: about 4 % per query of the
// replay's global corpus (docs/index.md, "Large pages").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace agspec {

inline constexpr std::size_t kLargePageBytes = std::size_t{2} << 20;
// Only arrays this large are advised: a 2 MB page becomes resident whole at its first
// write, so an array's last page may hold up to 2 MB it does not use yet, at most a
// quarter of an 8 MB one. Below that (a session's index up to ~90,000 tokens) the
// ordinary allocation keeps memory as tight as before; the gain measured is on the
// global corpus, whose arrays reach hundreds of MB.
inline constexpr std::size_t kLargeArrayBytes = std::size_t{8} << 20;

// Whether large arrays are advised: AGSPEC_LARGE_PAGES=0 in the environment turns it off
// (read at the first large allocation); set_large_pages changes it for the arrays
// allocated from then on (a benchmark comparing the two in one process). Allocation and
// release are the same either way, so the setting may change while arrays live.
inline std::atomic<int> g_large_pages{-1};  // -1: not read yet
inline bool large_pages_enabled() {
  int v = g_large_pages.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("AGSPEC_LARGE_PAGES");
    v = env == nullptr || std::strcmp(env, "0") != 0;
    g_large_pages.store(v, std::memory_order_relaxed);
  }
  return v != 0;
}
inline void set_large_pages(bool enabled) {
  g_large_pages.store(enabled, std::memory_order_relaxed);
}

template <class T>
struct LargePageAllocator {
  using value_type = T;

  LargePageAllocator() noexcept = default;
  template <class U>
  LargePageAllocator(const LargePageAllocator<U>&) noexcept {}  // NOLINT: rebinding

  T* allocate(std::size_t n) {
    if (n > (static_cast<std::size_t>(-1) - kLargePageBytes) / sizeof(T)) throw std::bad_alloc();
    const std::size_t bytes = n * sizeof(T);
    if (bytes < kLargeArrayBytes) return static_cast<T*>(::operator new(bytes));
    const std::size_t whole = rounded(bytes);
    void* p = ::operator new(whole, std::align_val_t{kLargePageBytes});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    // Advice only: where it is refused (no transparent huge pages), 4 KB pages it is.
    if (large_pages_enabled()) (void)madvise(p, whole, MADV_HUGEPAGE);
#endif
    return static_cast<T*>(p);
  }

  void deallocate(T* p, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < kLargeArrayBytes) {
      ::operator delete(p);
    } else {
      ::operator delete(p, std::align_val_t{kLargePageBytes});
    }
  }

  static std::size_t rounded(std::size_t bytes) {
    return (bytes + kLargePageBytes - 1) / kLargePageBytes * kLargePageBytes;
  }
};

template <class T, class U>
bool operator==(const LargePageAllocator<T>&, const LargePageAllocator<U>&) noexcept {
  return true;
}
template <class T, class U>
bool operator!=(const LargePageAllocator<T>&, const LargePageAllocator<U>&) noexcept {
  return false;
}

// The index's large arrays: the automaton's states and transitions, the positions, the
// documents' tokens and the frequent picks.
template <class T>
using LargeVector = std::vector<T, LargePageAllocator<T>>;

}  // namespace agspec
