#include "ndarray_glue.h"

#include <mxnet/ndarray.h>

#include <cstring>
#include <exception>
#include <sstream>

namespace mxnet_mpi {

const char* DTypeName(int dtype) {
  switch (dtype) {
    case 0: return "float32";
    case 1: return "float64";
    case 2: return "float16";
    case 3: return "uint8";
    case 4: return "int32";
    case 5: return "int8";
    case 6: return "int64";
    case 7: return "bool";
    case 12: return "bfloat16";
    default: return "an unsupported dtype";
  }
}

namespace {

std::string ShapeString(const int64_t* dims, int ndim) {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < ndim; ++i) os << dims[i] << (ndim == 1 || i + 1 < ndim ? "," : "") <<
      (i + 1 < ndim ? " " : "");
  os << ")";
  return os.str();
}

std::string ShapeString(const mxnet::TShape& s) {
  std::vector<int64_t> dims(s.ndim() > 0 ? s.ndim() : 0);
  for (int i = 0; i < s.ndim(); ++i) dims[i] = s[i];
  return ShapeString(dims.data(), static_cast<int>(dims.size()));
}

}  // namespace

std::string CheckArray(NDArrayHandle h, int dtype, const int64_t* shape, int ndim,
                       int64_t count, const std::string& what) {
  const auto* nd = static_cast<const mxnet::NDArray*>(h);
  if (nd->is_none()) return what + " is an empty (uninitialised) NDArray";
  if (nd->storage_type() != mxnet::kDefaultStorage)
    return what + " is not a dense array; MPI stores reduce dense arrays only";
  if (nd->ctx().dev_mask() != mxnet::cpu::kDevMask)
    return what + " is not in host memory (stage device arrays first)";
  const mxnet::TShape& s = nd->shape();
  bool same = nd->dtype() == dtype;
  if (ndim >= 0) {
    same = same && s.ndim() == ndim;
    for (int i = 0; same && i < ndim; ++i) same = s[i] == shape[i];
  } else if (ndim != kAnyShape) {
    same = same && static_cast<int64_t>(s.Size()) == count;
  }
  if (same) return "";
  std::ostringstream os;
  os << what << " has shape " << ShapeString(s) << " and dtype " << DTypeName(nd->dtype())
     << ", expected ";
  if (ndim >= 0) {
    os << "shape " << ShapeString(shape, ndim);
  } else {
    os << count << " elements";
  }
  os << " and dtype " << DTypeName(dtype);
  return os.str();
}

const void* VarOf(NDArrayHandle h) { return static_cast<const mxnet::NDArray*>(h)->var(); }

void ByteRange(NDArrayHandle h, int64_t* first, int64_t* last) {
  const auto* nd = static_cast<const mxnet::NDArray*>(h);
  *first = static_cast<int64_t>(nd->byte_offset());
  *last = *first + static_cast<int64_t>(nd->shape().Size()) *
                       mshadow::mshadow_sizeof(nd->dtype());
}

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

int64_t SizeOf(NDArrayHandle h) {
  return static_cast<int64_t>(static_cast<const mxnet::NDArray*>(h)->shape().Size());
}

}  // namespace mxnet_mpi
