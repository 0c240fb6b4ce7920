#include "onednn.h"

#include <mxnet/ndarray.h>

#include <cstring>
#include <exception>

namespace mxnet_mpi {

PlainData GetPlainData(NDArrayHandle in_h, NDArrayHandle out_h, size_t bytes) {
  PlainData d;
#if MXNET_USE_MKLDNN == 1
  try {
    auto* in = static_cast<mxnet::NDArray*>(in_h);
    auto* out = static_cast<mxnet::NDArray*>(out_h);
    if (out->IsMKLDNNData()) {
      if (in_h == out_h) {
        // Keep the values: plain copy, drop the oneDNN memory, copy back.
        mxnet::NDArray plain = out->Reorder2Default();
        out->InvalidateMKLDNNData();
        std::memcpy(out->data().dptr_, plain.data().dptr_, bytes);
      } else {
        out->InvalidateMKLDNNData();  // the collective overwrites all of it
      }
    }
    if (in_h != out_h && in->IsMKLDNNData()) {
      auto plain = std::make_shared<mxnet::NDArray>(in->Reorder2Default());
      d.in = plain->data().dptr_;
      d.keep = plain;
    }
  } catch (const std::exception& e) {
    d.error = std::string("mxnet_mpi: cannot convert a oneDNN array to plain layout: ") +
              e.what();
    return d;
  }
#endif
  if ((!d.in && MXNDArrayGetData(in_h, &d.in) != 0) || MXNDArrayGetData(out_h, &d.out) != 0)
    d.error = std::string("mxnet_mpi: cannot read array data: ") + MXGetLastError();
  return d;
}

}  // namespace mxnet_mpi
