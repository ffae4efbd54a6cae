#include "workers.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace agspec {

namespace {

constexpr size_t kMaxThreads = 64;
// How long a helper that has finished its tasks keeps looking for the next call before it
// sleeps: the batched calls of one engine step come microseconds apart (advance_batch's
// two phases, then match_lengths_batch), and waking a sleeping thread takes longer.
constexpr auto kSpin = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

size_t default_threads() {
  if (const char* env = std::getenv("AGSPEC_BATCH_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= long(kMaxThreads)) return size_t(v);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return std::clamp<size_t>(hw, 1, 4);
}

// The helpers of one thread count. Never freed: a helper can still be inside one when it
// is replaced (set_batch_threads), and a forked child leaves its parent's behind.
class Pool {
 public:
  explicit Pool(size_t helpers) : num_helpers_(helpers) {
    for (size_t i = 0; i < helpers; ++i) std::thread([this] { loop(); }).detach();
  }
  size_t helpers() const { return num_helpers_; }

  // Helpers stop once they see it (after the call they may be in).
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      published_.store(~uint64_t{0}, std::memory_order_release);
    }
    work_cv_.notify_all();
  }

  // Sleeping helpers get up and spin for kSpin (a batched call is about to come).
  void wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++nudges_;
    }
    work_cv_.notify_all();
  }

  // false (nothing run): another call has the helpers.
  bool run(size_t n, const std::function<void(size_t)>& task) {
    if (!begin(n, task)) return false;
    end(n, task);
    return true;
  }

  // The helpers start on task(0) .. task(n - 1); false (nothing handed out): another call
  // has them (another thread's, or this thread's own between begin and end).
  bool begin(size_t n, const std::function<void(size_t)>& task) {
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Helpers still inside the previous call only fail to claim a task, but they read
      // its counters: wait until they have let go before resetting them.
      idle_cv_.wait(lock, [this] { return active_ == 0; });
      task_ = &task;
      num_tasks_ = n;
      next_.store(0, std::memory_order_relaxed);
      done_.store(0, std::memory_order_relaxed);
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    work_cv_.notify_all();
    return true;
  }

  // After begin(n, task): the tasks no helper claimed, on the caller; returns once all are done.
  void end(size_t n, const std::function<void(size_t)>& task) {
    claim(task, n);
    // Tasks a helper claimed may still run: the outputs are whole once all are counted.
    while (done_.load(std::memory_order_acquire) < n) std::this_thread::yield();
    busy_.store(false, std::memory_order_release);
  }

 private:
  void claim(const std::function<void(size_t)>& task, size_t n) {
    for (;;) {
      const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      task(i);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void loop() {
    uint64_t seen = 0, seen_nudges = 0;
    for (;;) {
      // Spin without system calls (a yielding loop costs the caller's core time too);
      // the clock is read once every few hundred looks.
      const auto until = std::chrono::steady_clock::now() + kSpin;
      for (unsigned k = 1; published_.load(std::memory_order_acquire) == seen; ++k) {
        cpu_relax();
        if (k % 256 == 0 && std::chrono::steady_clock::now() >= until) break;
      }
      const std::function<void(size_t)>* task;
      size_t n;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || generation_ != seen || nudges_ != seen_nudges; });
        if (stop_) return;
        seen_nudges = nudges_;
        if (generation_ == seen) continue;  // woken ahead of a call: spin for it
        seen = generation_;
        task = task_;
        n = num_tasks_;
        ++active_;
      }
      claim(*task, n);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--active_ == 0) idle_cv_.notify_all();
      }
    }
  }

  const size_t num_helpers_;
  std::atomic<bool> busy_{false};  // held by the one call that uses the helpers
  std::mutex mu_;                  // guards the fields below up to active_
  std::condition_variable work_cv_, idle_cv_;
  const std::function<void(size_t)>* task_ = nullptr;
  size_t num_tasks_ = 0;
  uint64_t generation_ = 0;  // one per call; helpers run each call's tasks at most once
  size_t active_ = 0;        // helpers inside the current call
  uint64_t nudges_ = 0;      // wake() calls
  bool stop_ = false;
  std::atomic<uint64_t> published_{0};  // generation_, for the helpers' spin
  std::atomic<size_t> next_{0};         // the next task to claim
  std::atomic<size_t> done_{0};         // tasks finished
};

std::mutex g_mu;       // guards g_threads and g_pool
size_t g_threads = 0;  // 0: not read yet
Pool* g_pool = nullptr;
// Stopped pools, kept reachable (never freed: see Pool; nor is the list, which a static
// destructor would free before the leak checker looks).
std::vector<Pool*>* g_retired = new std::vector<Pool*>;

void before_fork() { g_mu.lock(); }
void after_fork_parent() { g_mu.unlock(); }
void after_fork_child() {
  // The helpers did not come along: the child starts its own when it needs them.
  g_pool = nullptr;
  g_mu.unlock();
}

size_t threads_locked() {
  if (g_threads == 0) {
    g_threads = default_threads();
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
  }
  return g_threads;
}

Pool* pool() {
  std::lock_guard<std::mutex> lock(g_mu);
  const size_t helpers = threads_locked() - 1;
  if (helpers == 0) return nullptr;
  if (g_pool == nullptr || g_pool->helpers() != helpers) {
    if (g_pool != nullptr) {
      g_pool->stop();
      g_retired->push_back(g_pool);  // its helpers may still be on their way out
    }
    g_pool = new Pool(helpers);
  }
  return g_pool;
}

}  // namespace

void run_tasks(size_t n, const std::function<void(size_t)>& task) {
  Pool* p = n > 1 ? pool() : nullptr;
  if (p != nullptr && p->run(n, task)) return;
  for (size_t i = 0; i < n; ++i) task(i);
}

void TaskRun::start(size_t n, std::function<void(size_t)> task) {
  finish();
  task_ = std::move(task);
  n_ = n;
  pending_ = true;
  Pool* p = n > 1 ? pool() : nullptr;
  pool_ = p != nullptr && p->begin(n, task_) ? p : nullptr;
}

void TaskRun::finish() {
  if (!pending_) return;
  pending_ = false;
  if (pool_ != nullptr) {
    static_cast<Pool*>(pool_)->end(n_, task_);
    pool_ = nullptr;
  } else {
    for (size_t i = 0; i < n_; ++i) task_(i);
  }
  task_ = nullptr;
}

void wake_batch_threads() {
  Pool* p = pool();
  if (p != nullptr) p->wake();
}

size_t batch_threads() {
  std::lock_guard<std::mutex> lock(g_mu);
  return threads_locked();
}

void set_batch_threads(size_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  threads_locked();  // registers the fork handlers
  g_threads = n == 0 ? default_threads() : std::min(n, kMaxThreads);
}

}  // namespace agspec
