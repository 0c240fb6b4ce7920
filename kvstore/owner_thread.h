// The thread that owns MPI: it initialises and finalises MPI and runs every
// task handed to it in FIFO order. Engine ops never block on a peer; they only
// enqueue work here.
#ifndef MXNET_MPI_OWNER_THREAD_H_
#define MXNET_MPI_OWNER_THREAD_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace mxnet_mpi {

class OwnerThread {
 public:
  using Task = std::function<void()>;

  void Start();
  // Enqueues a task; returns immediately.
  void Post(Task task);
  // Runs a task on the owner thread and waits for it.
  void Call(const Task& task);
  // Drains the queue, then joins the thread.
  void Stop();
  bool running() const { return running_; }

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::thread thread_;
  bool stop_ = false;
  bool running_ = false;
};

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_OWNER_THREAD_H_
