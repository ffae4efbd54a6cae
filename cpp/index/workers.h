// A few helper threads for the batched calls of cursor_set.h (advance_batch and the
// others), so that a step of many requests uses more than the caller's core.
//
// Results never depend on the number of threads: the caller splits a call into tasks
// that each write only their own outputs, and run_tasks returns once every task is done.
// No policy lives here, and no index: it only runs task(0) .. task(n - 1).
#pragma once

#include <cstddef>
#include <functional>

namespace agspec {

// Runs task(i) for every i in [0, n), on the calling thread and on up to
// batch_threads() - 1 helpers, and returns when all have finished. The tasks must not
// throw (each keeps its own error). Tasks are claimed in order. A call made while
// another thread's call is using the helpers, or in a child process after fork (until
// the helpers are started again), runs every task on the caller.
void run_tasks(size_t n, const std::function<void(size_t)>& task);

// run_tasks in two halves, for a caller with other work to do while the helpers start:
// start() hands task(0) .. task(n - 1) to the helpers and returns at once; finish() runs
// the tasks no helper has claimed on the caller and returns when every task is done.
// Where run_tasks would run everything on the caller (no helpers, another call holding
// them, a forked child), start() hands out nothing and finish() runs every task. The
// task, and all it reads, must stay valid until finish(); the destructor finishes.
class TaskRun {
 public:
  TaskRun() = default;
  TaskRun(const TaskRun&) = delete;
  TaskRun& operator=(const TaskRun&) = delete;
  ~TaskRun() { finish(); }
  void start(size_t n, std::function<void(size_t)> task);
  void finish();

 private:
  std::function<void(size_t)> task_;
  size_t n_ = 0;
  void* pool_ = nullptr;  // the pool that holds the tasks, between start() and finish()
  bool pending_ = false;  // started and not finished
};

// Gets sleeping helpers spinning for the next call (a caller about to make batched calls
// after other work: an engine step's first call would otherwise wait for them to wake).
void wake_batch_threads();

// How many threads run_tasks uses, the caller included (1: no helpers). The default is
// AGSPEC_BATCH_THREADS when set (1 to 64), else min(4, the hardware's threads).
size_t batch_threads();
// Sets it (1 to 64; 0 restores the default). Helpers start on the next call that needs them.
void set_batch_threads(size_t n);

}  // namespace agspec
