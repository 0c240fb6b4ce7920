#include "executors.h"

#include "health.h"
#include "timeline.h"

#include <chrono>
#include <cstring>

namespace mxnet_mpi {

// ---------------------------------------------------------------- chained
namespace {

// Signature check (if enabled), then the collective itself.
std::string CheckAndRun(const Request& r) {
  if (Options().check_signatures && r.error.empty()) {
    std::string err = CheckSignature(r);
    if (!err.empty()) return err;
  }
  return RunBlocking(r);
}

}  // namespace

void ChainedExecutor::Ready(uint64_t, Request r) {
  thread_.Post([r]() mutable {
    r.t_start = NowUs();
    Complete(r, CheckAndRun(r));
  });
}

// ---------------------------------------------------------------- loop base
void LoopExecutor::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

// ---------------------------------------------------------------- funneled
FunneledExecutor::FunneledExecutor(MPI_Comm negotiation, size_t fusion_bytes, int cycle_us)
    : negotiation_(negotiation), fusion_bytes_(fusion_bytes), cycle_us_(cycle_us) {
  StartLoop();
}

void FunneledExecutor::Ready(uint64_t ticket, Request r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.emplace(ticket, std::move(r));
  }
  cv_.notify_one();
}

void FunneledExecutor::Loop() {
  constexpr int kWords = kWindow / 64;
  std::vector<uint64_t> mine(kWords), agreed(kWords);
  std::vector<uint64_t> done;  // tickets run beyond base_, to advance base_
  for (;;) {
    size_t seen;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Only a rank with something ready starts a cycle; peers block in the
      // agreement until every rank has something ready, then all advance.
      cv_.wait(lock, [this] { return stop_ || !ready_.empty(); });
      if (ready_.empty()) return;  // stopped and drained
      std::fill(mine.begin(), mine.end(), 0);
      for (auto it = ready_.lower_bound(base_); it != ready_.end(); ++it) {
        const uint64_t bit = it->first - base_;
        if (bit >= static_cast<uint64_t>(kWindow)) break;
        mine[bit / 64] |= uint64_t{1} << (bit % 64);
      }
      seen = ready_.size();
    }
    MPI_Allreduce(mine.data(), agreed.data(), kWords, MPI_UINT64_T, MPI_BAND, negotiation_);
    std::vector<Request> run;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int bit = 0; bit < kWindow; ++bit) {
        if (!(agreed[bit / 64] >> (bit % 64) & 1)) continue;
        auto it = ready_.find(base_ + bit);
        run.push_back(std::move(it->second));
        ready_.erase(it);
        done.push_back(base_ + bit);
      }
    }
    if (run.empty()) {
      // Peers are not ready for what we have: wait for news, or a cycle.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::microseconds(cycle_us_),
                   [&] { return stop_ || ready_.size() != seen; });
      continue;
    }
    RunAgreed(&run);
    std::sort(done.begin(), done.end());
    size_t i = 0;
    while (i < done.size() && done[i] == base_) ++base_, ++i;
    done.erase(done.begin(), done.begin() + i);
  }
}

void FunneledExecutor::RunAgreed(std::vector<Request>* agreed) {
  const int64_t now = NowUs();
  for (Request& r : *agreed) r.t_start = now;
  std::vector<Request*> group;
  size_t group_bytes = 0;
  auto flush = [&] {
    if (group.size() == 1) {
      Complete(*group[0], RunBlocking(*group[0]));
    } else if (!group.empty()) {
      RunFused(group);
    }
    group.clear();
    group_bytes = 0;
  };
  // Every rank runs the same agreed tickets in the same order; check that they
  // are the same collectives before any data moves.
  if (Options().check_signatures) {
    std::vector<Request> ok;
    for (Request& r : *agreed) {
      std::string err = r.error.empty() ? CheckSignature(r) : r.error;
      if (err.empty()) {
        ok.push_back(std::move(r));
      } else {
        Complete(r, err);
      }
    }
    agreed->swap(ok);
  }
  for (Request& r : *agreed) {
    const size_t bytes = static_cast<size_t>(r.count) * DTypeSize(r.dtype);
    const bool fusable = r.op == OpKind::kAllreduce && bytes > 0 && bytes <= fusion_bytes_ &&
                         r.error.empty();  // no data to pack: RunBlocking reports it
    if (!fusable) {
      flush();
      Complete(r, RunBlocking(r));
      continue;
    }
    if (!group.empty() &&
        (group[0]->dtype != r.dtype || group[0]->comm != r.comm ||
         group_bytes + bytes > fusion_bytes_)) {
      flush();
    }
    group.push_back(&r);
    group_bytes += bytes;
  }
  flush();
}

// Packs the group into one buffer, allreduces it once, unpacks the sums.
void FunneledExecutor::RunFused(std::vector<Request*>& group) {
  const int esize = DTypeSize(group[0]->dtype);
  int64_t total = 0;
  for (Request* r : group) total += r->count;
  if (fusion_.size() < static_cast<size_t>(total * esize)) fusion_.resize(total * esize);
  char* buf = fusion_.data();
  for (Request* r : group) {
    std::memcpy(buf, r->in, r->count * esize);
    buf += r->count * esize;
  }
  Request fused = *group[0];
  fused.in = fused.out = fusion_.data();
  fused.count = total;
  fused.name = "fused(" + std::to_string(group.size()) + ")";
  const std::string err = RunBlocking(fused);
  buf = fusion_.data();
  for (Request* r : group) {
    if (err.empty()) std::memcpy(r->out, buf, r->count * esize);
    buf += r->count * esize;
    Complete(*r, err);
  }
}

// ---------------------------------------------------------------- concurrent
void ConcurrentExecutor::Ready(uint64_t, Request r) {
  InFlight f;
  f.r = std::move(r);
  f.r.t_start = NowUs();
  const std::string err = StartNonBlocking(f.r, &f.reqs);
  if (!err.empty() || f.reqs.empty()) {
    Complete(f.r, err);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(std::move(f));
  }
  cv_.notify_one();
}

void ConcurrentExecutor::Loop() {
  std::vector<InFlight> active;
  int idle_passes = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (active.empty()) {
        cv_.wait(lock, [this] { return stop_ || !incoming_.empty(); });
        if (incoming_.empty()) return;  // stopped and drained
      }
      while (!incoming_.empty()) {
        active.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
    }
    bool progressed = false;
    for (size_t i = 0; i < active.size();) {
      int flag = 0;
      int rc = MPI_Testall(static_cast<int>(active[i].reqs.size()), active[i].reqs.data(), &flag,
                           MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS || flag) {
        Complete(active[i].r, rc == MPI_SUCCESS ? "" : "mxnet_mpi: non-blocking collective '" +
                                                           active[i].r.name + "' failed");
        active[i] = std::move(active.back());
        active.pop_back();
        progressed = true;
      } else {
        ++i;
      }
    }
    // Open MPI's non-blocking collectives advance only while tested: poll
    // while any is in flight (as a blocking collective would), yielding the
    // core to compute threads between tests.
    idle_passes = progressed ? 0 : idle_passes + 1;
    if (idle_passes > 0) std::this_thread::yield();
  }
}

}  // namespace mxnet_mpi
