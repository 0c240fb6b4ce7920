// What a collective carries from the engine op (or a join/serve loop) to the
// MPI calls: its place in the store's sequence, its description, its buffers.
#ifndef MXNET_MPI_REQUEST_H_
#define MXNET_MPI_REQUEST_H_

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mxnet_mpi {

enum class OpKind : int {
  kAllreduce = 0,
  kBroadcast = 1,
  kAllgather = 2,      // variable first dimension per rank
  kAlltoall = 3,       // per-rank splits of the first dimension
  kReduceScatter = 4,  // first dimension split as evenly as possible
};
constexpr int kNumOpKinds = 5;
const char* OpName(OpKind op);

// MXNet dtype codes (mshadow::TypeFlag) supported by the collectives.
enum DType : int {
  kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kUint8 = 3,
  kInt32 = 4, kInt8 = 5, kInt64 = 6,
};
// Element size in bytes of a supported dtype, 0 if unsupported.
int DTypeSize(int dtype);
bool IsFloat(int dtype);

// Request flags (set by the caller, part of the signature ranks agree on).
enum RequestFlags : int {
  kAverage = 1,     // allreduce/reduce_scatter: divide the sum by the group size
  kCompressFp16 = 2,  // allreduce of float32/64: fp16 on the wire, fp32 accumulation
  // allreduce: the elementwise minimum, maximum or product instead of the sum
  kMin = 4,
  kMax = 8,
  kProduct = 16,
  // A tag that changes no result: the parity of this rank's loads of
  // optimizer states (kv.load_optimizer_states). Ranks differing in it
  // disagree on every push: the states were loaded on some ranks only.
  kStatesLoaded = 32,
};
constexpr int kNotSum = kMin | kMax | kProduct;

// One array of a collective (several for a grouped allreduce).
struct Part {
  const void* in = nullptr;  // may equal out (in place)
  void* out = nullptr;
  int64_t count = 0;         // elements of `in`
  int64_t out_count = -1;    // elements of `out` (allgather/alltoall: checked)
};

struct Request {
  uint64_t seq = 0;        // place in the store's sequence (program order)
  int lane = 0;
  OpKind op = OpKind::kAllreduce;
  int dtype = kFloat32;
  int root = 0;            // broadcast root (rank in the store's communicator)
  int flags = 0;
  int priority = 0;
  std::vector<Part> parts;
  int64_t row = 1;                 // elements per first-dimension row
  std::vector<int64_t> splits;     // alltoall: rows sent to each rank
  std::string desc;                // "allreduce key=3 shape=(2,) float32"
  // Printed only, never agreed on (ranks may name the same array differently):
  std::string name;                          // "parameter 'dense0_weight'", or ""
  std::shared_ptr<const std::string> context;  // "Trainer.step 7: gradient allreduce"
  uint64_t sig = 0;                // hash ranks compare (desc, sizes, op, dtype...)
  std::string token;               // non-empty: this rank cannot take part (why)
  std::shared_ptr<void> keep;      // buffers that must outlive the MPI calls
  // Called exactly once, with "" or an error message.
  std::function<void(const std::string&)> done;
  uint64_t flight = 0;
  int64_t t_enqueue = 0, t_ready = 0, t_start = 0;
  // Funneled pre-emption: elements of this allreduce already reduced (it moves
  // piece by piece, other units may run in between), and with the timeline on
  // when each piece ran (start, end in us).
  int64_t progress = 0;
  std::vector<std::pair<int64_t, int64_t>> pieces;

  int64_t Count() const {
    int64_t n = 0;
    for (const Part& p : parts) n += p.count;
    return n;
  }
  int64_t Bytes() const { return Count() * DTypeSize(dtype); }
};

// What messages add after the quoted description: " for <name> [<context>]"
// (each part only when known).
std::string Where(const Request& r);

// 64-bit FNV-1a, chained: what ranks compare to agree on a collective.
uint64_t Hash(const void* data, size_t n, uint64_t h = 1469598103934665603ull);
uint64_t Signature(const Request& r);

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_REQUEST_H_
