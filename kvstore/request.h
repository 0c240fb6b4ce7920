// A collective request handed from an engine op to a communication executor.
#ifndef MXNET_MPI_REQUEST_H_
#define MXNET_MPI_REQUEST_H_

#include <mpi.h>
#include <mxnet/engine.h>

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

namespace mxnet_mpi {

enum class OpKind : int { kAllreduce = 0, kBroadcast = 1 };

// MXNet dtype codes (mshadow::TypeFlag) supported by the collectives.
enum DType : int {
  kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kUint8 = 3,
  kInt32 = 4, kInt8 = 5, kInt64 = 6,
};

struct Request {
  OpKind op;
  const void* in;      // may equal out (in place)
  void* out;
  int64_t count;       // elements
  int dtype;
  int root;            // broadcast root within comm
  MPI_Comm comm;
  std::string name;
  mxnet::engine::CallbackOnComplete on_complete;
  // Set when the engine needs completion before the op returns (NaiveEngine).
  std::shared_ptr<std::promise<void>> done;
  std::string error;  // set if the op could not even read its arrays
  std::shared_ptr<void> keep;  // buffers that must outlive the MPI call
  uint64_t flight = 0;  // in-flight record (health.h)
  // timeline (timeline.h), microseconds since the epoch
  int64_t t_enqueue = 0, t_ready = 0, t_start = 0;
};

// Signals the engine (with an error if `err` is not empty).
void Complete(const Request& r, const std::string& err);

// Runs one request to completion with blocking MPI calls.
// Returns an empty string on success, otherwise an error message.
std::string RunBlocking(const Request& r);

// Starts the request with non-blocking MPI calls (several if it is larger
// than an MPI count), appending them to `reqs`. Returns an error or "".
std::string StartNonBlocking(const Request& r, std::vector<MPI_Request>* reqs);

// Element size in bytes of a supported dtype, 0 if unsupported.
int DTypeSize(int dtype);

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_REQUEST_H_
