// CPU kernel for the input gradient of a 2-D max pooling (tf_dpkit/clipping/pooling.py), float32.
//
//   DpkitMaxPoolGrad(x [B, H, W, C], g [B, OH, OW, C]) -> dx [B, H, W, C]:
//     dx[b, i, j, c] = sum of g[b, oy, ox, c] over the output positions (oy, ox) whose window
//     has its maximum of channel c at (i, j),
//   where window (oy, ox) covers the rows oy sh - pad_top .. + kh - 1 and the columns
//   ox sw - pad_left .. + kw - 1 that lie inside the image, and its maximum is the first entry
//   in row-major order that no later entry exceeds (a later entry replaces it only when strictly
//   greater): the choice TensorFlow's own CPU MaxPoolGrad makes, ties and NaN included, so both
//   give the same dx bit for bit.
//
// Work is split over examples; each example's dx is written by one thread (no atomics).
#include "kernels.h"

namespace tf_dpkit {
namespace {

class MaxPoolGradOp : public OpKernel {
 public:
  explicit MaxPoolGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    for (const char* name : {"ksize", "strides", "pads"}) {
      std::vector<int32_t> values;
      OP_REQUIRES_OK(ctx, ctx->GetAttr(name, &values));
      OP_REQUIRES(ctx, values.size() == 2,
                  InvalidArgument(name, " must have 2 entries (height, width), got ",
                                  values.size()));
      attrs_.push_back(values);
    }
    OP_REQUIRES(ctx, attrs_[0][0] > 0 && attrs_[0][1] > 0 && attrs_[1][0] > 0 &&
                         attrs_[1][1] > 0 && attrs_[2][0] >= 0 && attrs_[2][1] >= 0,
                InvalidArgument("ksize and strides must be positive and pads non-negative"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& g = ctx->input(1);
    OP_REQUIRES(ctx, x.dims() == 4 && g.dims() == 4,
                InvalidArgument("x and g must be rank 4 [B, H, W, C], got ",
                                x.shape().DebugString(), " and ", g.shape().DebugString()));
    const int64_t batch = x.dim_size(0), height = x.dim_size(1), width = x.dim_size(2),
                  channels = x.dim_size(3);
    const int64_t out_h = g.dim_size(1), out_w = g.dim_size(2);
    const int64_t kh = attrs_[0][0], kw = attrs_[0][1], sh = attrs_[1][0], sw = attrs_[1][1];
    const int64_t top = attrs_[2][0], left = attrs_[2][1];
    OP_REQUIRES(ctx, g.dim_size(0) == batch && g.dim_size(3) == channels,
                InvalidArgument("g must have x's batch and channels, got ",
                                g.shape().DebugString(), " for x ", x.shape().DebugString()));
    // Every window must hold at least one entry of the image (sizes bounded first, so that the
    // products below cannot overflow).
    const bool no_windows = out_h == 0 || out_w == 0 || batch == 0 || channels == 0;
    OP_REQUIRES(ctx, no_windows || (height > 0 && width > 0 && out_h <= height + kh &&
                                    out_w <= width + kw && top < kh && left < kw &&
                                    (out_h - 1) * sh - top < height &&
                                    (out_w - 1) * sw - left < width),
                InvalidArgument("g's spatial shape ", g.shape().DebugString(),
                                " has windows outside x ", x.shape().DebugString()));
    Tensor* dx = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &dx));
    if (no_windows) {  // nothing to route (x may have entries: its gradient is zero)
      dx->flat<float>().setZero();
      return;
    }
    const int64_t image = x.NumElements() / batch;  // H W C of one example
    const int64_t grads = g.NumElements() / batch;  // OH OW C
    OP_REQUIRES(ctx, image < (int64_t{1} << 31),
                InvalidArgument("one example of x must have fewer than 2^31 entries, got ",
                                x.shape().DebugString()));
    const float* xs = x.flat<float>().data();
    const float* gs = g.flat<float>().data();
    float* out = dx->flat<float>().data();
    const Eigen::TensorOpCost cost(4.0 * (image + grads), 4.0 * image,
                                   2.0 * kh * kw * grads + image);
    ctx->eigen_cpu_device().parallelFor(batch, cost, [&](Eigen::Index lo, Eigen::Index hi) {
      std::vector<float> best(channels);
      std::vector<int32_t> where(channels);
      float* best_c = best.data();
      int32_t* where_c = where.data();
      for (Eigen::Index b = lo; b < hi; ++b) {
        const float* xb = xs + b * image;
        const float* gb = gs + b * grads;
        float* db = out + b * image;
        std::fill(db, db + image, 0.0f);
        for (int64_t oy = 0; oy < out_h; ++oy) {
          const int64_t y0 = std::max<int64_t>(oy * sh - top, 0);
          const int64_t y1 = std::min<int64_t>(oy * sh - top + kh, height);
          for (int64_t ox = 0; ox < out_w; ++ox) {
            const int64_t x0 = std::max<int64_t>(ox * sw - left, 0);
            const int64_t x1 = std::min<int64_t>(ox * sw - left + kw, width);
            const int64_t first = (y0 * width + x0) * channels;
            std::memcpy(best_c, xb + first, sizeof(float) * channels);
            for (int64_t c = 0; c < channels; ++c) where_c[c] = static_cast<int32_t>(first);
            for (int64_t iy = y0; iy < y1; ++iy) {
              for (int64_t ix = (iy == y0 ? x0 + 1 : x0); ix < x1; ++ix) {
                const int32_t at = static_cast<int32_t>((iy * width + ix) * channels);
                const float* v = xb + at;
                // Branch-free, so that it runs channel-parallel: replace only where strictly
                // greater (a NaN never replaces, and a NaN first entry is never replaced).
#pragma omp simd
                for (int64_t c = 0; c < channels; ++c) {
                  const bool greater = best_c[c] < v[c];
                  best_c[c] = greater ? v[c] : best_c[c];
                  where_c[c] = greater ? at : where_c[c];
                }
              }
            }
            const float* row = gb + (oy * out_w + ox) * channels;
            for (int64_t c = 0; c < channels; ++c) db[where_c[c] + c] += row[c];
          }
        }
      }
    });
  }

 private:
  std::vector<std::vector<int32_t>> attrs_;
};

}  // namespace

REGISTER_OP("DpkitMaxPoolGrad")
    .Input("x: float")
    .Input("g: float")
    .Attr("ksize: list(int)")
    .Attr("strides: list(int)")
    .Attr("pads: list(int)")
    .Output("dx: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return ::tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("DpkitMaxPoolGrad").Device(::tensorflow::DEVICE_CPU), MaxPoolGradOp);

}  // namespace tf_dpkit
