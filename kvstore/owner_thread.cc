#include <pthread.h>
#include "owner_thread.h"

#include <future>

namespace mxnet_mpi {

void OwnerThread::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) return;
  stop_ = false;
  running_ = true;
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "mxmpi-owner");
    Loop();
  });
}

void OwnerThread::Post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void OwnerThread::Call(const Task& task) {
  std::promise<void> done;
  Post([&task, &done] {
    task();
    done.set_value();
  });
  done.get_future().wait();
}

void OwnerThread::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) return;
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
}

void OwnerThread::Loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace mxnet_mpi
