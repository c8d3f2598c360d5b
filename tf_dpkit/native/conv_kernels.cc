// CPU kernel for the Conv1D/Conv2D clipping rule (tf_dpkit/clipping/rules/conv.py), float32.
//
//   DpkitConvKernelGradSquaredNorms(x [B, H, W, C], g [B, OH, OW, P], num_groups M)
//     -> squared_norms [M], bias_grads [M, P], kernel_grads [M, kh kw C, P] (with keep_grads;
//        else [0, kh kw C, P]), for each microbatch j of k = B / M consecutive examples:
//     kernel_grads[j] = sum over examples b of j, output positions s of patch_s(x_b) (x) g_b[s]
//     bias_grads[j]   = sum over b of j, s of g_b[s]
//     squared_norms[j] = ||kernel_grads[j]||^2 (+ ||bias_grads[j]||^2 with with_bias)
//   where patch_s(x_b)[ky, kx, c] = x_b[oy sh + ky dh - pad_top, ox sw + kx dw - pad_left, c]
//   (zero outside the image) for s = (oy, ox).
//
// No unfolded patch is written to memory: each thread copies its examples into a zero-padded
// image, and the kernel gradient is formed block by block (a few taps x up to 32 filters, held
// in registers; k S kh kw C P multiply-adds), squared as it completes and written out only with
// keep_grads.  Entries are float32 sums over the positions and examples (as TensorFlow's filter
// gradient); their squares are totalled in double.  Work is split over microbatches.  (No Gram
// form, sum over position pairs of <patch_q, patch_r> <g_q, g_r>, here: the caller uses its
// TensorFlow-op Gram form where that needs far fewer multiply-adds, conv._NATIVE_ADVANTAGE;
// benchmarks/conv_norms.py compares the two per layer shape.)
#include "kernels.h"

namespace tf_dpkit {
namespace {

typedef float v8 __attribute__((vector_size(32)));

// What one microbatch's blocks read.
struct Group {
  const float* const* images;  // k padded images [Hp, Wp, C]
  const float* g;              // the group's first example's g [OH OW, P]
  int64_t k;                   // examples in the group
  int64_t g_stride;            // floats per example of g: S P
  const int64_t* bases;        // [S]: offset of position s's patch origin in a padded image
  int64_t positions;           // S
  int64_t filters;             // P
  float* grads;                // the group's kernel gradient [kh kw C, P] to write, or null
};

// Squares of the kernel-gradient entries for TB consecutive taps (offsets t0 .. t0 + TB - 1 from
// a patch origin; kernel rows index .. index + TB - 1) and filters [p0, p0 + 8 NV).
template <int TB, int NV>
double BlockSquares(const Group& grp, int64_t t0, int64_t index, int64_t p0) {
  v8 acc[TB][NV];
  for (int j = 0; j < TB; ++j)
    for (int v = 0; v < NV; ++v) acc[j][v] = v8{};
  for (int64_t e = 0; e < grp.k; ++e) {
    const float* image = grp.images[e] + t0;
    const float* ge = grp.g + e * grp.g_stride + p0;
    for (int64_t s = 0; s < grp.positions; ++s) {
      const float* xb = image + grp.bases[s];
      const float* gs = ge + s * grp.filters;
      v8 gv[NV];
      for (int v = 0; v < NV; ++v) std::memcpy(&gv[v], gs + 8 * v, sizeof(v8));
#pragma GCC unroll 16
      for (int j = 0; j < TB; ++j) {
        const float a = xb[j];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[j][v] += a * gv[v];
      }
    }
  }
  v8 squares = v8{};
  for (int j = 0; j < TB; ++j)
    for (int v = 0; v < NV; ++v) squares += acc[j][v] * acc[j][v];
  if (grp.grads != nullptr) {
    for (int j = 0; j < TB; ++j)
      for (int v = 0; v < NV; ++v)
        std::memcpy(grp.grads + (index + j) * grp.filters + p0 + 8 * v, &acc[j][v], sizeof(v8));
  }
  double total = 0.0;
  for (int l = 0; l < 8; ++l) total += squares[l];
  return total;
}

// Filters [p0, p0 + width) for width < 8, one tap at a time.
double NarrowSquares(const Group& grp, int64_t t0, int64_t index, int64_t taps, int64_t p0,
                     int64_t width) {
  double total = 0.0;
  float acc[8];
  for (int64_t t = t0; t < t0 + taps; ++t) {
    std::fill(acc, acc + 8, 0.0f);
    for (int64_t e = 0; e < grp.k; ++e) {
      const float* image = grp.images[e] + t;
      const float* ge = grp.g + e * grp.g_stride + p0;
      for (int64_t s = 0; s < grp.positions; ++s) {
        const float a = image[grp.bases[s]];
        const float* gs = ge + s * grp.filters;
        for (int64_t p = 0; p < width; ++p) acc[p] += a * gs[p];
      }
    }
    for (int64_t p = 0; p < width; ++p) total += static_cast<double>(acc[p]) * acc[p];
    if (grp.grads != nullptr) {
      std::copy(acc, acc + width, grp.grads + (index + t - t0) * grp.filters + p0);
    }
  }
  return total;
}

// A run of `taps` taps at consecutive offsets from t0 (kernel rows from index), for filters
// [p0, p0 + 8 NV).
template <int NV, int TB>
double RunSquares(const Group& grp, int64_t t0, int64_t index, int64_t taps, int64_t p0) {
  double total = 0.0;
  int64_t t = 0;
  for (; t + TB <= taps; t += TB) total += BlockSquares<TB, NV>(grp, t0 + t, index + t, p0);
  for (; t + 8 <= taps && TB > 8; t += 8)
    total += BlockSquares<8, NV>(grp, t0 + t, index + t, p0);
  for (; t + 4 <= taps; t += 4) total += BlockSquares<4, NV>(grp, t0 + t, index + t, p0);
  for (; t + 2 <= taps; t += 2) total += BlockSquares<2, NV>(grp, t0 + t, index + t, p0);
  for (; t < taps; ++t) total += BlockSquares<1, NV>(grp, t0 + t, index + t, p0);
  return total;
}

// Register blocking by the vector registers the build targets (-march=native).  With AVX-512VL
// (32 vector registers) blocks of 24 accumulators: 4 vectors x 6 taps for 32 filters, 2 x 12 for
// 16.  With AVX2 (16 vector registers) at most 12 accumulators, 2 vectors x 6 taps for 16 filters
// (with the 2 loaded output-gradient vectors and the broadcast tap, 15 registers; a 24-accumulator
// block spills to the stack there and runs about 3x slower).  Block sizes are chosen with
// benchmarks/conv_norms.py.
double RunAllFilters(const Group& grp, int64_t t0, int64_t index, int64_t taps) {
  double total = 0.0;
  int64_t p = 0;
#if defined(__AVX512VL__)  // 32 addressable 256-bit registers
  for (; p + 32 <= grp.filters; p += 32) total += RunSquares<4, 6>(grp, t0, index, taps, p);
  for (; p + 16 <= grp.filters; p += 16) total += RunSquares<2, 12>(grp, t0, index, taps, p);
  for (; p + 8 <= grp.filters; p += 8) total += RunSquares<1, 16>(grp, t0, index, taps, p);
#else
  for (; p + 16 <= grp.filters; p += 16) total += RunSquares<2, 6>(grp, t0, index, taps, p);
  for (; p + 8 <= grp.filters; p += 8) total += RunSquares<1, 8>(grp, t0, index, taps, p);
#endif
  if (p < grp.filters) total += NarrowSquares(grp, t0, index, taps, p, grp.filters - p);
  return total;
}

class ConvKernelGradSquaredNormsOp : public OpKernel {
 public:
  explicit ConvKernelGradSquaredNormsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    for (const char* name : {"kernel_size", "strides", "dilations", "pads"}) {
      std::vector<int32_t> values;
      OP_REQUIRES_OK(ctx, ctx->GetAttr(name, &values));
      OP_REQUIRES(ctx, values.size() == 2,
                  InvalidArgument(name, " must have 2 entries (height, width)"));
      const int low = std::string(name) == "pads" ? 0 : 1;
      OP_REQUIRES(ctx, values[0] >= low && values[1] >= low,
                  InvalidArgument(name, " must be >= ", low));
      attrs_.push_back(values);
    }
    OP_REQUIRES_OK(ctx, ctx->GetAttr("with_bias", &with_bias_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("keep_grads", &keep_grads_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& g = ctx->input(1);
    const Tensor& groups_t = ctx->input(2);
    OP_REQUIRES(ctx, x.dims() == 4 && g.dims() == 4 && x.dim_size(0) == g.dim_size(0),
                InvalidArgument("x must be [B, H, W, C] and g [B, OH, OW, P] with the same B, "
                                "got ", x.shape().DebugString(), " and ", g.shape().DebugString()));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(groups_t.shape()),
                InvalidArgument("num_groups must be a scalar"));
    const int64_t batch = x.dim_size(0), height = x.dim_size(1), width = x.dim_size(2);
    const int64_t channels = x.dim_size(3);
    const int64_t out_h = g.dim_size(1), out_w = g.dim_size(2), filters = g.dim_size(3);
    const int64_t groups = groups_t.scalar<int64_t>()();
    OP_REQUIRES(ctx, groups >= 1 && batch % groups == 0,
                InvalidArgument("num_groups must be >= 1 and divide the batch size ", batch,
                                ", got ", groups));
    const int64_t kh = attrs_[0][0], kw = attrs_[0][1], sh = attrs_[1][0], sw = attrs_[1][1];
    const int64_t dh = attrs_[2][0], dw = attrs_[2][1], top = attrs_[3][0], left = attrs_[3][1];
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({groups}), &out));
    float* norms = out->flat<float>().data();
    Tensor* bias_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({groups, filters}), &bias_out));
    float* bias_grads = bias_out->flat<float>().data();
    const int64_t taps = kh * kw * channels;
    Tensor* grads_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({keep_grads_ ? groups : 0, taps,
                                                             filters}), &grads_out));
    float* kernel_grads = keep_grads_ ? grads_out->flat<float>().data() : nullptr;
    const int64_t k = batch / groups;
    // The padded image covers every position a patch reads.
    const int64_t pad_h = std::max<int64_t>((out_h - 1) * sh + (kh - 1) * dh + 1, 1);
    const int64_t pad_w = std::max<int64_t>((out_w - 1) * sw + (kw - 1) * dw + 1, 1);
    const int64_t image_size = pad_h * pad_w * channels;
    const int64_t positions = out_h * out_w;
    std::vector<int64_t> bases(positions);
    for (int64_t oy = 0; oy < out_h; ++oy)
      for (int64_t ox = 0; ox < out_w; ++ox)
        bases[oy * out_w + ox] = (oy * sh * pad_w + ox * sw) * channels;
    const float* xs = x.flat<float>().data();
    const float* gs = g.flat<float>().data();
    const double flops = 2.0 * k * positions * kh * kw * channels * filters;
    const Eigen::TensorOpCost cost(4.0 * k * (height * width * channels + positions * filters),
                                   4, flops + k * image_size);
    ctx->eigen_cpu_device().parallelFor(groups, cost, [&](Eigen::Index lo, Eigen::Index hi) {
      std::vector<float> padded(k * image_size);
      std::vector<const float*> images(k);
      for (int64_t e = 0; e < k; ++e) images[e] = padded.data() + e * image_size;
      for (Eigen::Index j = lo; j < hi; ++j) {
        std::fill(padded.begin(), padded.end(), 0.0f);
        for (int64_t e = 0; e < k; ++e) {
          const float* src = xs + (j * k + e) * height * width * channels;
          float* dst = padded.data() + e * image_size;
          for (int64_t iy = 0; iy < height; ++iy) {
            const int64_t py = iy + top;
            if (py < 0 || py >= pad_h) continue;
            const int64_t first = std::max<int64_t>(0, -left);
            const int64_t last = std::min<int64_t>(width, pad_w - left);
            if (first >= last) continue;
            std::memcpy(dst + (py * pad_w + first + left) * channels,
                        src + (iy * width + first) * channels,
                        sizeof(float) * (last - first) * channels);
          }
        }
        const Group grp{images.data(), gs + j * k * positions * filters, k, positions * filters,
                        bases.data(), positions, filters,
                        kernel_grads == nullptr ? nullptr : kernel_grads + j * taps * filters};
        double total = 0.0;
        if (dw == 1) {  // a kernel row's kw C taps lie at consecutive offsets
          for (int64_t ky = 0; ky < kh; ++ky)
            total += RunAllFilters(grp, ky * dh * pad_w * channels, ky * kw * channels,
                                   kw * channels);
        } else {  // each (ky, kx)'s C channels do
          for (int64_t ky = 0; ky < kh; ++ky)
            for (int64_t kx = 0; kx < kw; ++kx)
              total += RunAllFilters(grp, (ky * dh * pad_w + kx * dw) * channels,
                                     (ky * kw + kx) * channels, channels);
        }
        // The bias gradient: g summed over the group's examples and positions.
        float* bias = bias_grads + j * filters;
        std::fill(bias, bias + filters, 0.0f);
        for (int64_t r = 0; r < k * positions; ++r) {
          const float* row = grp.g + r * filters;
#pragma omp simd
          for (int64_t p = 0; p < filters; ++p) bias[p] += row[p];
        }
        if (with_bias_) {
          for (int64_t p = 0; p < filters; ++p) total += static_cast<double>(bias[p]) * bias[p];
        }
        norms[j] = static_cast<float>(total);
      }
    });
  }

 private:
  std::vector<std::vector<int32_t>> attrs_;
  bool with_bias_ = false;
  bool keep_grads_ = false;
};

}  // namespace

REGISTER_OP("DpkitConvKernelGradSquaredNorms")
    .Input("x: float")
    .Input("g: float")
    .Input("num_groups: int64")
    .Attr("kernel_size: list(int)")
    .Attr("strides: list(int)")
    .Attr("dilations: list(int)")
    .Attr("pads: list(int)")
    .Attr("with_bias: bool = false")
    .Attr("keep_grads: bool = false")
    .Output("squared_norms: float")
    .Output("bias_grads: float")
    .Output("kernel_grads: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::DimensionHandle groups;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &groups));
      c->set_output(0, c->Vector(groups));
      c->set_output(1, c->Matrix(groups, c->Dim(c->input(1), 3)));
      c->set_output(2, c->UnknownShapeOfRank(3));
      return ::tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("DpkitConvKernelGradSquaredNorms").Device(::tensorflow::DEVICE_CPU),
                        ConvKernelGradSquaredNormsOp);

}  // namespace tf_dpkit
