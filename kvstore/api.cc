// C API loaded by mxnet_mpi/_native.py with ctypes: MPI world and
// communicator management, and pushing collectives into MXNet's engine.
#include <mxnet/c_api.h>
#include <mxnet/engine.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "executors.h"
#include "health.h"
#include "onednn.h"
#include "owner_thread.h"
#include "request.h"
#include "timeline.h"

#define MXMPI_API extern "C" __attribute__((visibility("default")))

namespace mxnet_mpi {
namespace {

thread_local std::string g_last_error;
OwnerThread g_owner;
std::mutex g_comms_mu;
std::vector<MPI_Comm> g_comms;  // id -> communicator; 0 is the world
bool g_we_initialized = false;
std::mutex g_exec_mu;
std::vector<std::unique_ptr<Executor>> g_execs;  // id -> executor (null once freed)

int Fail(const std::string& msg) {
  g_last_error = msg;
  return -1;
}

MPI_Comm CommById(int id) {
  std::lock_guard<std::mutex> lock(g_comms_mu);
  if (id < 0 || id >= static_cast<int>(g_comms.size())) return MPI_COMM_NULL;
  return g_comms[id];
}

int AddComm(MPI_Comm comm) {
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  std::lock_guard<std::mutex> lock(g_comms_mu);
  g_comms.push_back(comm);
  return static_cast<int>(g_comms.size()) - 1;
}

// What the engine op carries: private shallow copies of the arrays so the
// Python objects may die before the op runs.
struct OpParam {
  OpKind op;
  NDArrayHandle in = nullptr;
  NDArrayHandle out = nullptr;
  int64_t count = 0;
  int dtype = 0;
  int root = 0;
  MPI_Comm comm = MPI_COMM_NULL;
  std::string name;
  bool sync = false;
  Executor* exec = nullptr;
  uint64_t ticket = 0;
  int64_t t_enqueue = 0;
};

void DeleteOpParam(void* p) {
  auto* param = static_cast<OpParam*>(p);
  if (param->in != param->out && param->in) MXNDArrayFree(param->in);
  if (param->out) MXNDArrayFree(param->out);
  delete param;
}

Executor* ExecById(int id) {
  std::lock_guard<std::mutex> lock(g_exec_mu);
  if (id < 0 || id >= static_cast<int>(g_execs.size())) return nullptr;
  return g_execs[id].get();
}

void StopAllExecutors() {
  std::vector<std::unique_ptr<Executor>> execs;
  {
    std::lock_guard<std::mutex> lock(g_exec_mu);
    execs.swap(g_execs);
  }
  for (auto& e : execs) {
    if (e) e->Stop();
  }
}

// The engine op: its dependencies are ready; hand the request to the
// executor and return (unless the engine is synchronous).
void RunOp(void* /*rctx*/, void* on_complete, void* p) {
  const OpParam& param = *static_cast<OpParam*>(p);
  Request r;
  r.op = param.op;
  r.count = param.count;
  r.dtype = param.dtype;
  r.root = param.root;
  r.comm = param.comm;
  r.name = param.name;
  r.on_complete = *static_cast<mxnet::engine::CallbackOnComplete*>(on_complete);
  r.t_enqueue = param.t_enqueue;
  if (g_timeline_on) r.t_ready = NowUs();
  if (param.sync) r.done = std::make_shared<std::promise<void>>();
  if (r.count > 0) {
    PlainData data = GetPlainData(param.in, param.out, r.count * DTypeSize(r.dtype));
    // On error still hand it over, so ticketed executors stay in step; it fails there.
    r.error = data.error;
    r.in = data.in;
    r.out = data.out;
    r.keep = data.keep;
  }
  r.flight = FlightBegin(r.name);
  std::shared_ptr<std::promise<void>> done = r.done;
  param.exec->Ready(param.ticket, std::move(r));
  // A synchronous engine (NaiveEngine) requires completion before return.
  if (done) done->get_future().wait();
}

}  // namespace
}  // namespace mxnet_mpi

using namespace mxnet_mpi;  // NOLINT

MXMPI_API const char* mxmpi_last_error() { return g_last_error.c_str(); }

// Starts the owner thread, which initialises MPI unless someone (mpi4py) did.
MXMPI_API int mxmpi_init(int required, int* provided, int* rank, int* size,
                         int* local_rank, int* local_size) {
  if (g_owner.running()) return Fail("mxnet_mpi: already initialised");
  g_owner.Start();
  std::string err;
  g_owner.Call([&] {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) {
      err = "mxnet_mpi: MPI was already finalized in this process";
      return;
    }
    if (!inited) {
      if (MPI_Init_thread(nullptr, nullptr, required, provided) != MPI_SUCCESS) {
        err = "mxnet_mpi: MPI_Init_thread failed";
        return;
      }
      g_we_initialized = true;
    } else {
      MPI_Query_thread(provided);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, local_rank);
    MPI_Comm_size(local, local_size);
    MPI_Comm_free(&local);
    {
      std::lock_guard<std::mutex> lock(g_comms_mu);
      g_comms.assign(1, MPI_COMM_WORLD);
    }
    // The health thread needs MPI_THREAD_MULTIPLE (it calls MPI beside us).
    if (*size > 1 && *provided >= MPI_THREAD_MULTIPLE && Options().interval_s > 0) {
      MPI_Comm health;
      MPI_Comm_dup(MPI_COMM_WORLD, &health);
      AddComm(health);
      HealthStart(health, *rank);
    }
  });
  if (!err.empty()) {
    g_owner.Stop();
    return Fail(err);
  }
  return 0;
}

// Frees communicators, finalises MPI if we initialised it, stops the thread.
// The caller must have waited for all engine ops (mx.nd.waitall()).
MXMPI_API int mxmpi_finalize() {
  if (!g_owner.running()) return 0;
  StopAllExecutors();
  HealthStop();
  g_owner.Call([] {
    std::lock_guard<std::mutex> lock(g_comms_mu);
    for (size_t i = 1; i < g_comms.size(); ++i) {
      if (g_comms[i] != MPI_COMM_NULL) MPI_Comm_free(&g_comms[i]);
    }
    g_comms.clear();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (g_we_initialized && !finalized) MPI_Finalize();
  });
  g_owner.Stop();
  return 0;
}

// Set before mxmpi_init: signature checks, stall warning/abort times (s),
// health round period (s; 0 disables the health thread).
MXMPI_API int mxmpi_configure(int check_signatures, double warn_s, double abort_s,
                              double interval_s) {
  HealthOptions& o = Options();
  o.check_signatures = check_signatures != 0;
  o.warn_s = warn_s;
  o.abort_s = abort_s;
  o.interval_s = interval_s;
  return 0;
}

MXMPI_API int mxmpi_abort(int code) {
  // Called from any thread when the job must die: MPI_Abort is allowed then.
  return MPI_Abort(MPI_COMM_WORLD, code);
}

// Collective over `parent`: every member must call it in the same order.
MXMPI_API int mxmpi_comm_split(int parent, int color, int key, int* out) {
  if (!g_owner.running()) return Fail("mxnet_mpi: not initialised");
  MPI_Comm pc = CommById(parent);
  if (pc == MPI_COMM_NULL) return Fail("mxnet_mpi: unknown communicator id " + std::to_string(parent));
  std::string err;
  g_owner.Call([&] {
    MPI_Comm c;
    int rc = MPI_Comm_split(pc, color < 0 ? MPI_UNDEFINED : color, key, &c);
    if (rc != MPI_SUCCESS) {
      err = "mxnet_mpi: MPI_Comm_split failed";
      return;
    }
    *out = c == MPI_COMM_NULL ? -1 : AddComm(c);
  });
  return err.empty() ? 0 : Fail(err);
}

MXMPI_API int mxmpi_comm_info(int id, int* rank, int* size) {
  MPI_Comm c = CommById(id);
  if (c == MPI_COMM_NULL) return Fail("mxnet_mpi: unknown communicator id " + std::to_string(id));
  MPI_Comm_rank(c, rank);
  MPI_Comm_size(c, size);
  return 0;
}

MXMPI_API int mxmpi_comm_free(int id) {
  if (id <= 0 || !g_owner.running()) return 0;
  g_owner.Call([id] {
    std::lock_guard<std::mutex> lock(g_comms_mu);
    if (id < static_cast<int>(g_comms.size()) && g_comms[id] != MPI_COMM_NULL) {
      MPI_Comm_free(&g_comms[id]);
      g_comms[id] = MPI_COMM_NULL;
    }
  });
  return 0;
}

// Pushes one collective into MXNet's engine. `in` is a read dependency and
// `out` a write dependency (one write dependency when in == out); `chain`,
// if not NULL, is an extra write dependency that serialises collectives.
MXMPI_API int mxmpi_push(int op, NDArrayHandle in, NDArrayHandle out, NDArrayHandle chain,
                         int64_t count, int dtype, int comm, int root, int priority,
                         const char* name, int sync, int executor) {
  if (!g_owner.running()) return Fail("mxnet_mpi: not initialised");
  Executor* exec = ExecById(executor);
  if (!exec) return Fail("mxnet_mpi: unknown executor id " + std::to_string(executor));
  if (op != static_cast<int>(OpKind::kAllreduce) && op != static_cast<int>(OpKind::kBroadcast))
    return Fail("mxnet_mpi: unknown collective " + std::to_string(op));
  if (DTypeSize(dtype) == 0) return Fail("mxnet_mpi: unsupported dtype code " + std::to_string(dtype));
  MPI_Comm c = CommById(comm);
  if (c == MPI_COMM_NULL) return Fail("mxnet_mpi: unknown communicator id " + std::to_string(comm));

  auto* param = new OpParam();
  param->op = static_cast<OpKind>(op);
  param->count = count;
  param->dtype = dtype;
  param->root = root;
  param->comm = c;
  param->name = name ? name : "";
  param->sync = sync != 0;
  param->exec = exec;
  if (g_timeline_on) param->t_enqueue = NowUs();
  if (MXShallowCopyNDArray(out, &param->out) != 0 ||
      (in != out && MXShallowCopyNDArray(in, &param->in) != 0)) {
    std::string msg = MXGetLastError();
    DeleteOpParam(param);
    return Fail("mxnet_mpi: " + msg);
  }
  if (in == out) param->in = param->out;

  std::vector<NDArrayHandle> reads;
  std::vector<NDArrayHandle> writes{param->out};
  if (in != out) reads.push_back(param->in);
  if (chain) writes.push_back(chain);
  static const mxnet::Context ctx = mxnet::Context::CPU(0);
  // Prioritised CPU ops run on their own small thread pool, so an enqueue is
  // never stuck behind a long compute op on the normal CPU worker.
  static mxnet::FnProperty prop = mxnet::FnProperty::kCPUPrioritized;
  // Tickets follow push order, which is the same on every rank.
  param->ticket = exec->Ticket();
  int rc = MXEnginePushAsyncND(&RunOp, param, &DeleteOpParam, &ctx,
                               reads.data(), static_cast<int>(reads.size()),
                               writes.data(), static_cast<int>(writes.size()),
                               &prop, priority, param->name.c_str(), false);
  if (rc != 0) return Fail(std::string("mxnet_mpi: engine push failed: ") + MXGetLastError());
  return 0;
}

// Creates an executor for collectives over `comm` (collective over `comm`
// for the funneled kind, which duplicates it for its agreement traffic).
MXMPI_API int mxmpi_executor_create(int kind, int comm, int64_t fusion_bytes, int cycle_us,
                                    int* out) {
  if (!g_owner.running()) return Fail("mxnet_mpi: not initialised");
  MPI_Comm c = CommById(comm);
  if (c == MPI_COMM_NULL) return Fail("mxnet_mpi: unknown communicator id " + std::to_string(comm));
  std::unique_ptr<Executor> exec;
  switch (static_cast<ExecKind>(kind)) {
    case ExecKind::kChained:
      exec.reset(new ChainedExecutor());
      break;
    case ExecKind::kFunneled: {
      MPI_Comm neg = MPI_COMM_NULL;
      g_owner.Call([&] { MPI_Comm_dup(c, &neg); });
      AddComm(neg);  // freed with the others at finalize
      exec.reset(new FunneledExecutor(neg, static_cast<size_t>(fusion_bytes), cycle_us));
      break;
    }
    case ExecKind::kConcurrent:
      exec.reset(new ConcurrentExecutor());
      break;
    default:
      return Fail("mxnet_mpi: unknown executor kind " + std::to_string(kind));
  }
  std::lock_guard<std::mutex> lock(g_exec_mu);
  g_execs.push_back(std::move(exec));
  *out = static_cast<int>(g_execs.size()) - 1;
  return 0;
}

// Stops an executor; the caller has waited for its collectives.
MXMPI_API int mxmpi_executor_free(int id) {
  std::unique_ptr<Executor> exec;
  {
    std::lock_guard<std::mutex> lock(g_exec_mu);
    if (id < 0 || id >= static_cast<int>(g_execs.size())) return 0;
    exec.swap(g_execs[id]);
  }
  if (exec) exec->Stop();
  return 0;
}

// Starts recording the timeline (MXNET_MPI_TIMELINE).
MXMPI_API int mxmpi_timeline_start() {
  g_timeline_on = true;
  return 0;
}

// Writes the events recorded so far as Chrome-trace JSON.
MXMPI_API int mxmpi_timeline_dump(const char* path, int rank) {
  std::string err = TimelineDump(path, rank);
  return err.empty() ? 0 : Fail(err);
}
