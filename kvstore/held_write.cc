#include "held_write.h"

#include <mxnet/engine.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "health.h"
#include "ndarray_glue.h"

namespace mxnet_mpi {
namespace {

using Done = mxnet::engine::CallbackOnComplete;

// Both ops must have started before the copy: the held op owns `out`, the
// release op holds `src` readable. Whichever starts second copies and ends both.
struct Held {
  std::mutex mu;
  NDArrayHandle out = nullptr;
  NDArrayHandle src = nullptr;
  std::unique_ptr<Done> hold_done, release_done;
  uint64_t flight = 0;
  bool arrived = false;
  std::string desc;
};

// What a stall names after the layer: before the release is pushed (not every
// device has pushed its part), and after (the parts or the sum over the ranks
// not yet computed).
const char* const kWaiting = ": not every device of this rank has run it yet";
const char* const kComputing = ": every device pushed its part; waiting for the parts and the "
                               "sum over the ranks to be computed";

std::mutex g_held_mu;
std::map<int64_t, std::shared_ptr<Held>> g_held;
int64_t g_next = 1;

std::shared_ptr<Held> Find(int64_t ticket, bool erase) {
  std::lock_guard<std::mutex> lock(g_held_mu);
  auto it = g_held.find(ticket);
  if (it == g_held.end()) return nullptr;
  auto h = it->second;
  if (erase) g_held.erase(it);
  return h;
}

// Both ops have started (their callbacks taken out of `h` under its lock):
// copy, then end them. Ending an op may delete it, and with it the last
// reference to `h` but the caller's.
void CopyAndFinish(Held* h, Done release_done, Done hold_done) {
  const size_t bytes = static_cast<size_t>(SizeOf(h->out)) * 8;  // float64 (checked at hold)
  PlainData d = GetPlainData(h->src, h->out, bytes);
  if (!d.error.empty()) AbortJob(d.error);  // never leave the array unwritten
  std::memcpy(d.out, d.in, bytes);
  MXNDArrayFree(h->src);
  MXNDArrayFree(h->out);
  release_done();
  hold_done();
}

struct Param {
  std::shared_ptr<Held> held;
  bool release;
};

void Run(void*, void* on_complete, void* p) {
  auto* param = static_cast<Param*>(p);
  const std::shared_ptr<Held> h = param->held;  // outlives both ops' deletion
  std::unique_ptr<Done> release_done, hold_done;
  {
    std::lock_guard<std::mutex> lock(h->mu);
    auto done = std::make_unique<Done>(*static_cast<Done*>(on_complete));
    if (param->release) {
      h->release_done = std::move(done);
    } else {
      h->hold_done = std::move(done);
      const char* state = h->arrived ? kComputing : kWaiting;
      h->flight = FlightBegin(FlightKind::kLocal, -1, 0, h->desc + state);
    }
    if (!h->hold_done || !h->release_done) return;
    FlightEnd(h->flight);
    h->flight = 0;
    release_done = std::move(h->release_done);
    hold_done = std::move(h->hold_done);
  }
  CopyAndFinish(h.get(), *release_done, *hold_done);
}

void Free(void* p) { delete static_cast<Param*>(p); }

const mxnet::Context kCpu = mxnet::Context::CPU(0);
mxnet::FnProperty kAsync = mxnet::FnProperty::kAsync;

}  // namespace

std::string HoldWrite(NDArrayHandle out, const std::string& desc, int64_t* ticket) {
  std::string err = CheckArray(out, 1 /* float64 */, nullptr, kAnyShape, 0, "held array");
  if (!err.empty()) return err;
  auto h = std::make_shared<Held>();
  h->desc = desc;
  if (MXShallowCopyNDArray(out, &h->out) != 0) return MXGetLastError();
  {
    std::lock_guard<std::mutex> lock(g_held_mu);
    *ticket = g_next++;
    g_held[*ticket] = h;
  }
  auto* param = new Param{h, false};
  if (MXEnginePushAsyncND(&Run, param, &Free, &kCpu, nullptr, 0, &h->out, 1, &kAsync, 0,
                          "mxnet_mpi held write", false) != 0) {
    Find(*ticket, true);
    MXNDArrayFree(h->out);
    return std::string("mxnet_mpi: engine push failed: ") + MXGetLastError();
  }
  return "";
}

std::string ReleaseWrite(int64_t ticket, NDArrayHandle src) {
  auto h = Find(ticket, false);
  if (!h) return "mxnet_mpi: no held write with ticket " + std::to_string(ticket);
  std::string err = CheckArray(src, 1, nullptr, -1, SizeOf(h->out), "released value");
  if (!err.empty()) return err;
  Find(ticket, true);
  {
    // Every part is in: a stall from now on is their computing, or the ranks.
    std::lock_guard<std::mutex> lock(h->mu);
    h->arrived = true;
    if (h->flight) {  // else the held op, when it starts, names this state itself
      FlightEnd(h->flight);
      h->flight = FlightBegin(FlightKind::kLocal, -1, 0, h->desc + kComputing);
    }
  }
  if (MXShallowCopyNDArray(src, &h->src) != 0) return MXGetLastError();
  auto* param = new Param{h, true};
  if (MXEnginePushAsyncND(&Run, param, &Free, &kCpu, &h->src, 1, nullptr, 0, &kAsync, 0,
                          "mxnet_mpi release held write", false) != 0)
    return std::string("mxnet_mpi: engine push failed: ") + MXGetLastError();
  return "";
}

}  // namespace mxnet_mpi
