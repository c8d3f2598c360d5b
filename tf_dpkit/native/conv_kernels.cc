// CPU kernel for the Conv2D clipping rule (tf_dpkit/clipping/rules/conv.py), float32.
//
//   DpkitConvKernelGrads(x [B, H, W, C], g [B, OH, OW, P]) -> [B, KH * KW * C, P]
//   attrs: kernel_size (KH, KW), stride s (both axes), padding "SAME" | "VALID"
//
// Example b's gradient of an undilated convolution's kernel, in the kernel's (kh, kw, c) order:
//   G_b[kh, kw, c, p] = sum over output positions (oh, ow) of
//                       x_padded[b, oh s + kh, ow s + kw, c] g[b, oh, ow, p]
// with TensorFlow's padding (SAME: total max((OH - 1) s + KH - H, 0), the smaller half on top
// and left; VALID: none).  Each example is a separate sum (examples are split between threads),
// so the result depends on nothing but x[b] and g[b].
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_dpkit {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;

int64_t OutputSize(int64_t size, int64_t kernel, int64_t stride, bool same) {
  return same ? (size + stride - 1) / stride : (size - kernel) / stride + 1;
}

class ConvKernelGradsOp : public OpKernel {
 public:
  explicit ConvKernelGradsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::vector<int32_t> kernel_size;
    std::string padding;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kernel_size", &kernel_size));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stride", &stride_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("padding", &padding));
    OP_REQUIRES(ctx, kernel_size.size() == 2 && kernel_size[0] > 0 && kernel_size[1] > 0,
                InvalidArgument("kernel_size must be two positive ints"));
    OP_REQUIRES(ctx, stride_ > 0, InvalidArgument("stride must be >= 1, got ", stride_));
    OP_REQUIRES(ctx, padding == "SAME" || padding == "VALID",
                InvalidArgument("padding must be SAME or VALID, got ", padding));
    kh_ = kernel_size[0];
    kw_ = kernel_size[1];
    same_ = padding == "SAME";
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& g = ctx->input(1);
    OP_REQUIRES(ctx, x.dims() == 4 && g.dims() == 4 && x.dim_size(0) == g.dim_size(0),
                InvalidArgument("x must be [B, H, W, C] and g [B, OH, OW, P] with one B, got ",
                                x.shape().DebugString(), " and ", g.shape().DebugString()));
    const int64_t batch = x.dim_size(0), height = x.dim_size(1), width = x.dim_size(2);
    const int64_t channels = x.dim_size(3), out_h = g.dim_size(1), out_w = g.dim_size(2);
    const int64_t filters = g.dim_size(3);
    OP_REQUIRES(ctx, same_ || (height >= kh_ && width >= kw_),
                InvalidArgument("VALID padding needs x at least as large as the kernel"));
    OP_REQUIRES(ctx, out_h == OutputSize(height, kh_, stride_, same_) &&
                     out_w == OutputSize(width, kw_, stride_, same_),
                InvalidArgument("g's spatial shape ", out_h, "x", out_w,
                                " is not the convolution's output for x ", height, "x", width));
    const int64_t pad_top = same_ ? std::max<int64_t>((out_h - 1) * stride_ + kh_ - height, 0) / 2 : 0;
    const int64_t pad_left = same_ ? std::max<int64_t>((out_w - 1) * stride_ + kw_ - width, 0) / 2 : 0;
    const int64_t rows = kh_ * kw_ * channels;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, rows, filters}), &out));
    const float* xs = x.flat<float>().data();
    const float* gs = g.flat<float>().data();
    float* grads = out->flat<float>().data();
    const int64_t kh = kh_, kw = kw_, stride = stride_;
    const double work = static_cast<double>(out_h) * out_w * rows * filters;
    const Eigen::TensorOpCost cost(4.0 * (height * width * channels + out_h * out_w * filters),
                                   4.0 * rows * filters, 2.0 * work);
    ctx->eigen_cpu_device().parallelFor(batch, cost, [&](Eigen::Index begin, Eigen::Index end) {
      for (Eigen::Index b = begin; b < end; ++b) {
        const float* xb = xs + b * height * width * channels;
        const float* gb = gs + b * out_h * out_w * filters;
        float* ob = grads + b * rows * filters;
        std::fill(ob, ob + rows * filters, 0.0f);
        for (int64_t oh = 0; oh < out_h; ++oh) {
          for (int64_t ow = 0; ow < out_w; ++ow) {
            const float* gv = gb + (oh * out_w + ow) * filters;
            for (int64_t i = 0; i < kh; ++i) {
              const int64_t ih = oh * stride + i - pad_top;
              if (ih < 0 || ih >= height) continue;  // zero padding
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iw = ow * stride + j - pad_left;
                if (iw < 0 || iw >= width) continue;
                const float* xv = xb + (ih * width + iw) * channels;
                float* target = ob + (i * kw + j) * channels * filters;
                for (int64_t c = 0; c < channels; ++c) {
                  const float xc = xv[c];
                  float* t = target + c * filters;
#pragma omp simd
                  for (int64_t p = 0; p < filters; ++p) t[p] += xc * gv[p];
                }
              }
            }
          }
        }
      }
    });
  }

 private:
  int64_t kh_ = 0, kw_ = 0;
  int32_t stride_ = 1;
  bool same_ = true;
};

}  // namespace

REGISTER_OP("DpkitConvKernelGrads")
    .Input("x: float")
    .Input("g: float")
    .Attr("kernel_size: list(int)")
    .Attr("stride: int")
    .Attr("padding: {'SAME', 'VALID'}")
    .Output("grads: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      std::vector<int32_t> kernel_size;
      TF_RETURN_IF_ERROR(c->GetAttr("kernel_size", &kernel_size));
      if (kernel_size.size() != 2) {
        return InvalidArgument("kernel_size must be two positive ints");
      }
      ::tensorflow::shape_inference::DimensionHandle rows, filters;
      TF_RETURN_IF_ERROR(c->Multiply(c->Dim(c->input(0), 3),
                                     static_cast<int64_t>(kernel_size[0]) * kernel_size[1],
                                     &rows));
      c->set_output(0, c->MakeShape({c->Dim(c->input(0), 0), rows, c->Dim(c->input(1), 3)}));
      return ::tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("DpkitConvKernelGrads").Device(::tensorflow::DEVICE_CPU),
                        ConvKernelGradsOp);

}  // namespace tf_dpkit
