// Collectives as nodes of MXNet's dependency engine: validation at push time,
// the engine op that hands a ready request to its store, and what happens
// when the engine skips an op (its input carries an earlier error).
#ifndef MXNET_MPI_ENGINE_OPS_H_
#define MXNET_MPI_ENGINE_OPS_H_

#include <mxnet/c_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "store.h"

namespace mxnet_mpi {

// One collective as Python describes it (mirrored by ctypes in _native.py).
struct CallDesc {
  int32_t op, dtype, root, priority, flags, nparts;
  NDArrayHandle* ins;     // nparts arrays
  NDArrayHandle* outs;    // nparts arrays (an entry may equal ins[i]: in place)
  const int64_t* shapes;  // per part: ndim, then the dims, of ins[i] as expected
  const char* desc;       // what ranks agree on ("allreduce key=3 shape=(2,) float32")
  const char* label;      // names the arrays in errors ("key 3")
  const char* token;      // non-NULL: this rank cannot take part, with this reason
  const int64_t* splits;  // alltoall: rows to each rank (nsplits of them)
  int64_t nsplits;
  int64_t row;            // elements per first-dimension row
  NDArrayHandle aux;      // alltoall: received splits (int32, one per rank), or NULL
  const char* name;       // printed in messages, never agreed on ("parameter 'dense0_weight'");
                          // NULL or "": none
};

// Every field of CallDesc, in order: the library reports their offsets
// (mxmpi_abi) and _native.py checks them against its ctypes mirror at load.
#define MXMPI_CALLDESC_FIELDS(X) \
  X(op) X(dtype) X(root) X(priority) X(flags) X(nparts) X(ins) X(outs) X(shapes) X(desc) \
  X(label) X(token) X(splits) X(nsplits) X(row) X(aux) X(name)
static_assert(offsetof(CallDesc, name) + sizeof(const char*) == sizeof(CallDesc),
              "a field after CallDesc::name: add it to MXMPI_CALLDESC_FIELDS and _native.py");

// Pushes `n` calls in order; each takes its place in the store's sequence.
// A call that fails validation becomes a token (its peers learn why) and the
// first such error is returned with its index; the others are pushed anyway.
// `context` (NULL: none) says what the calls are for ("Trainer.step 7:
// gradient allreduce"); messages print it, ranks do not agree on it.
std::string PushCalls(const std::shared_ptr<Store>& store, const CallDesc* calls, int n,
                      bool sync, int* failed, const char* context);

// Set once finalize begins: ops the engine skips from now on are shutdown
// noise, not collectives peers wait for.
void SetFinalizing(bool on);
// Releases the process-wide chain variable (after the engine is idle).
void FreeChainVar();

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_ENGINE_OPS_H_
