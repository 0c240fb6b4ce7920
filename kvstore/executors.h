// Executors: how a ready collective (its engine op has run) gets to MPI.
// Each executor owns its thread(s) and one communicator's traffic ordering.
#ifndef MXNET_MPI_EXECUTORS_H_
#define MXNET_MPI_EXECUTORS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "owner_thread.h"
#include "request.h"

namespace mxnet_mpi {

enum class ExecKind : int { kChained = 0, kFunneled = 1, kConcurrent = 2 };

class Executor {
 public:
  virtual ~Executor() = default;
  // Called on the Python thread at push time, in program order.
  virtual uint64_t Ticket() { return 0; }
  // Called on an engine thread when the op's dependencies are ready.
  virtual void Ready(uint64_t ticket, Request r) = 0;
  virtual void Stop() = 0;
};

// Requests arrive already ordered (the engine's chain variable releases them
// one at a time, in push order); run them FIFO on one thread.
class ChainedExecutor : public Executor {
 public:
  ChainedExecutor() { thread_.Start(); }
  void Ready(uint64_t, Request r) override;
  void Stop() override { thread_.Stop(); }

 private:
  OwnerThread thread_;
};

// An executor with one thread running Loop(); Stop() asks it to drain and
// joins it. Subclasses start the thread at the end of their constructor.
class LoopExecutor : public Executor {
 public:
  // Derived destructors call Stop() first: Loop() must not outlive them.
  void Stop() override;

 protected:
  virtual void Loop() = 0;
  void StartLoop() { thread_ = std::thread([this] { Loop(); }); }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;

 private:
  std::thread thread_;
};

// One thread owns the communicator. Each cycle it agrees with its peers on
// which tickets are ready everywhere (a bitwise-AND allreduce of a bitmask
// over a window of tickets), then runs exactly those, in ticket order, fusing
// consecutive allreduces of one dtype into one buffer.
class FunneledExecutor : public LoopExecutor {
 public:
  FunneledExecutor(MPI_Comm negotiation, size_t fusion_bytes, int cycle_us);
  ~FunneledExecutor() override { Stop(); }
  uint64_t Ticket() override { return next_ticket_++; }
  void Ready(uint64_t ticket, Request r) override;

  static constexpr int kWindow = 4096;  // tickets per negotiation

 private:
  void Loop() override;
  void RunAgreed(std::vector<Request>* agreed);
  void RunFused(std::vector<Request*>& group);

  MPI_Comm negotiation_;
  size_t fusion_bytes_;
  int cycle_us_;
  std::atomic<uint64_t> next_ticket_{0};
  uint64_t base_ = 0;                  // lowest ticket not yet run (same on all ranks)
  std::map<uint64_t, Request> ready_;  // ticket -> request, ready locally
  std::vector<char> fusion_;
};

// Non-blocking collectives issued straight from engine threads (needs
// MPI_THREAD_MULTIPLE); each key has its own communicator, so collectives of
// different keys never match each other whatever order ranks issue them in.
// A progress thread tests outstanding requests and signals the engine.
class ConcurrentExecutor : public LoopExecutor {
 public:
  ConcurrentExecutor() { StartLoop(); }
  ~ConcurrentExecutor() override { Stop(); }
  void Ready(uint64_t, Request r) override;

 private:
  struct InFlight {
    std::vector<MPI_Request> reqs;
    Request r;
  };
  void Loop() override;

  std::deque<InFlight> incoming_;
};

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_EXECUTORS_H_
