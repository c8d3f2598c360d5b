// What every tf_dpkit kernel source includes: TensorFlow's op and kernel framework, Eigen's
// thread pool device, and the names the kernels use from TensorFlow.
#ifndef TF_DPKIT_NATIVE_KERNELS_H_
#define TF_DPKIT_NATIVE_KERNELS_H_

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_dpkit {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::TensorShapeUtils;
using ::tensorflow::errors::InvalidArgument;

}  // namespace tf_dpkit

#endif  // TF_DPKIT_NATIVE_KERNELS_H_
