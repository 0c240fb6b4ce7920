#include "engine_ops.h"

#include <mxnet/engine.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <set>
#include <vector>

#include "health.h"
#include "ndarray_glue.h"
#include "timeline.h"

namespace mxnet_mpi {

namespace {

std::atomic<bool> g_finalizing{false};
std::mutex g_chain_mu;
NDArrayHandle g_chain = nullptr;

// The process-wide chain variable of mode 'chained': every chained collective
// writes it, so the engine releases them one at a time, in push order.
NDArrayHandle ChainVar(std::string* err) {
  std::lock_guard<std::mutex> lock(g_chain_mu);
  if (!g_chain) {
    const uint32_t shape[1] = {1};
    if (MXNDArrayCreateEx(shape, 1, /*cpu*/ 1, 0, 0, /*float32*/ 0, &g_chain) != 0) {
      *err = std::string("mxnet_mpi: cannot create the chain variable: ") + MXGetLastError();
      g_chain = nullptr;
    }
  }
  return g_chain;
}

// What the engine op carries: private shallow copies of the arrays (so the
// Python objects may die before the op runs) and the request to hand over.
struct OpParam {
  std::shared_ptr<Store> store;
  Lane* lane = nullptr;
  Request proto;                          // everything but the data pointers
  std::vector<NDArrayHandle> ins, outs;   // ins[i] == outs[i] when in place
  NDArrayHandle aux = nullptr;
  bool ran = false;
  bool sync = false;
  std::shared_ptr<std::string> relay;     // chained: the error, reported by the relay op
  // A synchronous engine (NaiveEngine) drops errors given to the completion
  // callback: the push itself reports them (see PushCalls).
  std::shared_ptr<std::string> sync_error;
};

void SubmitToken(const std::shared_ptr<Store>& store, Lane* lane, Request r) {
  r.flight = FlightBegin(FlightKind::kCollective, store->id(), r.seq, r.desc, Where(r));
  r.done = nullptr;
  store->Ready(lane, std::move(r));
}

void FreeParam(void* p) {
  auto* param = static_cast<OpParam*>(p);
  if (!param->ran && !g_finalizing) {
    // The engine skipped the op: an input carries an earlier error. Peers
    // still run this collective: take part as a token, so they fail with a
    // reason instead of waiting, and later collectives stay paired.
    Request r = param->proto;
    r.token = "MXNet skipped it because one of its inputs carries the error of an earlier "
              "failed operation on that rank (the error is raised there)";
    SubmitToken(param->store, param->lane, std::move(r));
  }
  std::set<NDArrayHandle> owned(param->ins.begin(), param->ins.end());
  owned.insert(param->outs.begin(), param->outs.end());
  if (param->aux) owned.insert(param->aux);
  for (NDArrayHandle h : owned) MXNDArrayFree(h);
  delete param;
}

// A failed collective's completion, run as an engine op of its own. MXNet
// 1.9's threaded engine keeps errors in a list without a lock
// (ThreadedEngine::global_exception_refs_) that every op finishing or
// starting with an error appends to; an error handed to the completion
// callback on a store's own thread (the funneled negotiator, a concurrent
// lane) raced with the engine's workers passing earlier errors on, and
// corrupted the heap. So a store thread never completes an op with an error:
// this op, with no variables, does it on the engine's normal CPU worker, where
// the ops that read the failed op's arrays learn of the error too.
struct FailParam {
  mxnet::engine::CallbackOnComplete cb;
  std::string error;
};

void RunFail(void* /*rctx*/, void* on_complete, void* p) {
  auto* fail = static_cast<FailParam*>(p);
  dmlc::Error e(fail->error);
  fail->cb(&e);
  (*static_cast<mxnet::engine::CallbackOnComplete*>(on_complete))();
}

void FreeFail(void* p) { delete static_cast<FailParam*>(p); }

void CompleteWithError(const mxnet::engine::CallbackOnComplete& cb, const std::string& err) {
  static const mxnet::Context ctx = mxnet::Context::CPU(0);
  static mxnet::FnProperty normal = mxnet::FnProperty::kNormal;
  auto* fail = new FailParam{cb, err};
  if (!g_finalizing &&
      MXEnginePushAsync(&RunFail, fail, &FreeFail, const_cast<mxnet::Context*>(&ctx), nullptr,
                        0, nullptr, 0, &normal, 0, "mxnet_mpi failed collective", false) == 0)
    return;
  // no engine to push to (it is shutting down): complete here
  delete fail;
  dmlc::Error e(err);
  cb(&e);
}

void RunOp(void* /*rctx*/, void* on_complete, void* p) {
  OpParam& param = *static_cast<OpParam*>(p);
  param.ran = true;
  Request r = param.proto;
  if (g_timeline_on) r.t_ready = NowUs();
  auto keep = std::make_shared<std::vector<std::shared_ptr<void>>>();
  const int esize = DTypeSize(r.dtype);
  for (size_t i = 0; i < param.ins.size(); ++i) {
    Part& part = r.parts[i];
    if (part.count == 0 && part.out_count <= 0) continue;
    PlainData d = GetPlainData(param.ins[i], param.outs[i], part.count * esize);
    if (!d.error.empty()) r.token = d.error;  // still take part: peers learn why
    part.in = d.in;
    part.out = d.out;
    if (d.keep) keep->push_back(d.keep);
  }
  if (param.aux) {
    void* data = nullptr;
    MXNDArrayGetData(param.aux, &data);
    r.parts.back().out = data;
  }
  r.keep = keep;
  r.flight = FlightBegin(FlightKind::kCollective, param.store->id(), r.seq, r.desc, Where(r));
  auto cb = *static_cast<mxnet::engine::CallbackOnComplete*>(on_complete);
  std::shared_ptr<std::promise<void>> done;
  if (param.sync) done = std::make_shared<std::promise<void>>();
  auto relay = param.relay;
  auto sync_error = param.sync_error;
  r.done = [cb, relay, done, sync_error](const std::string& err) {
    if (sync_error) *sync_error = err;
    if (relay) {
      *relay = err;  // the relay op, next on the same arrays, raises it
      cb();
    } else if (err.empty()) {
      cb();
    } else if (done) {
      // a synchronous engine (NaiveEngine): one thread, and the push waits
      dmlc::Error e(err);
      cb(&e);
    } else {
      CompleteWithError(cb, err);
    }
    if (done) done->set_value();
  };
  param.store->Ready(param.lane, std::move(r));
  // A synchronous engine (NaiveEngine) requires completion before return.
  if (done) done->get_future().wait();
}

struct RelayParam {
  std::shared_ptr<std::string> error;
};

void RunRelay(void* /*rctx*/, void* on_complete, void* p) {
  auto cb = *static_cast<mxnet::engine::CallbackOnComplete*>(on_complete);
  const std::string& err = *static_cast<RelayParam*>(p)->error;
  if (err.empty()) {
    cb();
  } else {
    dmlc::Error e(err);
    cb(&e);
  }
}

void FreeRelay(void* p) { delete static_cast<RelayParam*>(p); }

bool Overlap(NDArrayHandle a, NDArrayHandle b) {
  int64_t a0, a1, b0, b1;
  ByteRange(a, &a0, &a1);
  ByteRange(b, &b0, &b1);
  return a0 < b1 && b0 < a1;
}

bool SameRegion(NDArrayHandle a, NDArrayHandle b) {
  int64_t a0, a1, b0, b1;
  ByteRange(a, &a0, &a1);
  ByteRange(b, &b0, &b1);
  return a0 == b0 && a1 == b1;
}

// Checks one call; fills which parts are in place and the engine's variables.
struct Plan {
  std::vector<bool> in_place;
  std::vector<NDArrayHandle> reads, writes;  // one handle per engine variable
};

std::string Validate(const Store& store, const CallDesc& c,
                     const std::vector<std::vector<int64_t>>& shapes, Plan* plan) {
  if (c.op < 0 || c.op >= kNumOpKinds) return "mxnet_mpi: unknown collective " + std::to_string(c.op);
  const OpKind op = static_cast<OpKind>(c.op);
  if (DTypeSize(c.dtype) == 0) return "mxnet_mpi: unsupported dtype code " + std::to_string(c.dtype);
  if (c.nparts < 1) return "mxnet_mpi: a collective needs at least one array";
  // The arrays as errors name them: the parameter too when Python knows it.
  std::string label = c.label ? c.label : "array";
  if (c.name && *c.name) label = std::string(c.name) + " (" + label + ")";
  if ((c.flags & kAverage) && !IsFloat(c.dtype))
    return label + ": averaging needs floating-point arrays, got " + DTypeName(c.dtype);
  const int kinds = c.flags & (kAverage | kNotSum);
  if (kinds & (kinds - 1))
    return label + ": give one reduction (average, min, max or product)";
  if ((c.flags & kNotSum) && (op != OpKind::kAllreduce || (c.flags & kCompressFp16)))
    return label + ": min, max and product are for uncompressed allreduces";
  const bool many = c.nparts > 1;
  std::set<const void*> write_vars;
  plan->in_place.assign(c.nparts, false);
  for (int i = 0; i < c.nparts; ++i) {
    const std::string idx = many ? " " + std::to_string(i) : " 0";
    const std::vector<int64_t>& shape = shapes[i];
    std::string err = CheckArray(c.ins[i], c.dtype, shape.data(), static_cast<int>(shape.size()),
                                 0, "value" + idx + " of " + label);
    if (!err.empty()) return err;
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    const int64_t rows = shape.empty() ? 1 : shape[0];
    switch (op) {
      case OpKind::kAllreduce:
      case OpKind::kBroadcast:
        err = CheckArray(c.outs[i], c.dtype, shape.data(), static_cast<int>(shape.size()), 0,
                         "out" + idx + " of " + label);
        break;
      case OpKind::kReduceScatter: {
        const int p = store.size(), me = store.rank();
        const int64_t mine = (rows / p + (me < rows % p ? 1 : 0)) * (rows ? count / rows : 0);
        err = CheckArray(c.outs[i], c.dtype, nullptr, -1, mine, "out" + idx + " of " + label);
        break;
      }
      default:  // allgather/alltoall: its size is checked against what ranks send
        err = CheckArray(c.outs[i], c.dtype, nullptr, kAnyShape, 0, "out" + idx + " of " + label);
        break;
    }
    if (!err.empty()) return err;
    if (c.ins[i] == c.outs[i]) {
      plan->in_place[i] = true;
    } else if (VarOf(c.ins[i]) == VarOf(c.outs[i])) {
      if (SameRegion(c.ins[i], c.outs[i])) {
        plan->in_place[i] = true;  // two views of the same memory: in place
      } else if (Overlap(c.ins[i], c.outs[i])) {
        return "out" + idx + " of " + label + " overlaps the memory of its value without " +
               "being the same region; pass the same array (in place) or a separate one";
      }
    }
    if (plan->in_place[i] && (op == OpKind::kAllgather || op == OpKind::kAlltoall ||
                              op == OpKind::kReduceScatter))
      return std::string("out") + idx + " of " + label + " must be a separate array for " +
             OpName(op);
    for (int j = 0; j < i; ++j) {
      if (VarOf(c.outs[j]) == VarOf(c.outs[i]) && Overlap(c.outs[j], c.outs[i]))
        return "out " + std::to_string(j) + " and out " + std::to_string(i) + " of " + label +
               " overlap";
    }
    if (write_vars.insert(VarOf(c.outs[i])).second) plan->writes.push_back(c.outs[i]);
  }
  if (op == OpKind::kAlltoall) {
    if (c.nsplits != store.size())
      return label + ": alltoall needs one split per rank (" + std::to_string(store.size()) +
             "), got " + std::to_string(c.nsplits);
    int64_t sum = 0;
    for (int64_t k = 0; k < c.nsplits; ++k) {
      if (c.splits[k] < 0) return label + ": alltoall splits must be >= 0";
      sum += c.splits[k];
    }
    const int64_t rows = shapes[0].empty() ? 1 : shapes[0][0];
    if (sum != rows)
      return label + ": alltoall splits add up to " + std::to_string(sum) + " rows, but the " +
             "array has " + std::to_string(rows);
  }
  std::set<const void*> read_vars;
  for (int i = 0; i < c.nparts; ++i) {
    if (plan->in_place[i]) continue;
    const void* v = VarOf(c.ins[i]);
    if (write_vars.count(v) || !read_vars.insert(v).second) continue;
    plan->reads.push_back(c.ins[i]);
  }
  if (c.aux && write_vars.insert(VarOf(c.aux)).second) plan->writes.push_back(c.aux);
  return "";
}

std::vector<std::vector<int64_t>> Shapes(const CallDesc& c) {
  std::vector<std::vector<int64_t>> out(std::max(0, c.nparts));
  const int64_t* at = c.shapes;
  for (int i = 0; i < c.nparts && at; ++i) {
    const int64_t ndim = *at++;
    out[i].assign(at, at + ndim);
    at += ndim;
  }
  return out;
}

Request Proto(const CallDesc& c, const std::vector<std::vector<int64_t>>& shapes) {
  Request r;
  r.op = static_cast<OpKind>(std::min(std::max(c.op, 0), kNumOpKinds - 1));
  r.dtype = c.dtype;
  r.root = c.root;
  r.flags = c.flags;
  r.priority = c.priority;
  r.desc = c.desc ? c.desc : "";
  if (c.name) r.name = c.name;
  r.row = std::max<int64_t>(1, c.row);
  if (c.splits) r.splits.assign(c.splits, c.splits + c.nsplits);
  for (const auto& shape : shapes) {
    Part part;
    part.count = 1;
    for (int64_t d : shape) part.count *= d;
    r.parts.push_back(part);
  }
  if (c.aux) r.parts.push_back(Part());
  return r;
}

}  // namespace

void SetFinalizing(bool on) { g_finalizing = on; }

void FreeChainVar() {
  std::lock_guard<std::mutex> lock(g_chain_mu);
  if (g_chain) MXNDArrayFree(g_chain);
  g_chain = nullptr;
}

std::string PushCalls(const std::shared_ptr<Store>& store, const CallDesc* calls, int n,
                      bool sync, int* failed, const char* context) {
  std::string first;
  *failed = -1;
  // One copy per push, shared by its calls (a Trainer step pushes ~100 at once).
  const std::shared_ptr<const std::string> ctx_text =
      context && *context ? std::make_shared<const std::string>(context) : nullptr;
  static const mxnet::Context ctx = mxnet::Context::CPU(0);
  // Prioritised CPU ops run on their own small thread pool, so a hand-over is
  // never stuck behind a long compute op on the normal CPU worker.
  static mxnet::FnProperty prop = mxnet::FnProperty::kCPUPrioritized;
  const bool chained = store->kind() == ExecKind::kChained;
  for (int i = 0; i < n; ++i) {
    const CallDesc& c = calls[i];
    const auto shapes = Shapes(c);
    Plan plan;
    std::string err = c.token ? std::string(c.token) : Validate(*store, c, shapes, &plan);
    NDArrayHandle chain = nullptr;
    if (err.empty() && chained) chain = ChainVar(&err);
    Request proto = Proto(c, shapes);
    proto.context = ctx_text;
    if (err.empty() && (proto.op == OpKind::kAllgather || proto.op == OpKind::kAlltoall))
      for (int k = 0; k < c.nparts; ++k) proto.parts[k].out_count = SizeOf(c.outs[k]);
    proto.sig = Signature(proto);
    if (g_timeline_on) proto.t_enqueue = NowUs();
    proto.seq = store->NextSeq();
    Lane* lane = store->PickLane(proto.op, proto.Bytes());
    proto.lane = lane->config().index;
    store->Reserve(lane, proto.seq);
    if (!err.empty()) {
      if (!c.token && first.empty()) {
        first = err;
        *failed = i;
      }
      proto.token = err;
      SubmitToken(store, lane, std::move(proto));
      continue;
    }
    auto* param = new OpParam();
    param->store = store;
    param->lane = lane;
    param->sync = sync;
    if (sync) param->sync_error = std::make_shared<std::string>();
    if (chained) param->relay = std::make_shared<std::string>();
    std::string copy_err;
    for (int k = 0; k < c.nparts && copy_err.empty(); ++k) {
      NDArrayHandle out = nullptr, in = nullptr;
      if (MXShallowCopyNDArray(c.outs[k], &out) != 0) {
        copy_err = MXGetLastError();
        break;
      }
      param->outs.push_back(out);
      if (plan.in_place[k]) {
        in = out;
      } else if (MXShallowCopyNDArray(c.ins[k], &in) != 0) {
        copy_err = MXGetLastError();
        break;
      }
      param->ins.push_back(in);
    }
    if (copy_err.empty() && c.aux && MXShallowCopyNDArray(c.aux, &param->aux) != 0)
      copy_err = MXGetLastError();
    param->proto = proto;
    param->ran = true;  // until pushed: FreeParam must not submit a token
    if (!copy_err.empty()) {
      FreeParam(param);
      proto.token = "mxnet_mpi: " + copy_err;
      if (first.empty()) {
        first = proto.token;
        *failed = i;
      }
      SubmitToken(store, lane, std::move(proto));
      continue;
    }
    param->ran = false;
    const std::shared_ptr<std::string> relay_error = param->relay;  // param may be gone below
    const std::shared_ptr<std::string> sync_error = param->sync_error;
    std::vector<NDArrayHandle> writes = plan.writes;
    if (chain) writes.push_back(chain);
    const std::vector<NDArrayHandle> reads = plan.reads;
    const int rc = MXEnginePushAsyncND(&RunOp, param, &FreeParam, &ctx,
                                       const_cast<NDArrayHandle*>(reads.data()),
                                       static_cast<int>(reads.size()), writes.data(),
                                       static_cast<int>(writes.size()), &prop, c.priority,
                                       nullptr, false);
    if (rc == 0 && sync_error && !sync_error->empty() && first.empty()) {
      first = *sync_error;   // it ran inside the push: report its error here
      *failed = i;
    }
    if (rc != 0) {
      // The op was not queued (its param was deleted, as a skip): say why.
      if (first.empty()) {
        first = std::string("mxnet_mpi: engine push failed: ") + MXGetLastError();
        *failed = i;
      }
      continue;
    }
    if (chain) {
      auto* relay = new RelayParam{relay_error};
      std::vector<NDArrayHandle> outs = plan.writes;
      MXEnginePushAsyncND(&RunRelay, relay, &FreeRelay, &ctx, nullptr, 0, outs.data(),
                          static_cast<int>(outs.size()), &prop, c.priority, nullptr, false);
    }
  }
  return first;
}

}  // namespace mxnet_mpi
