// CPU kernels for tf_dpkit's Gaussian noise (built on first use by tf_dpkit/native/__init__.py).
//
// Both ops draw the standard normals of tf_dpkit.noise.stateless_standard_normal, float32:
// the uniform stream is TensorFlow's stateless Philox-4x32-10 stream for (key, counter) as
// returned by StatelessRandomGetKeyCounter (uniform k is 32-bit output k of the stream, its low
// 23 bits as a float in [0, 1), bit for bit what StatelessRandomUniformV2 returns), and with
// h = ceil(n / 2) the pair i < h takes u1 = U[i], u2 = U[h + i] to
//   z[i] = r cos(2 pi u2),  z[h + i] = r sin(2 pi u2),  r = sqrt(-2 log(1 - u1))
// (z[h + i] dropped when h + i = n).  Only the transcendental functions differ from the
// TensorFlow-op sampler (a few float32 ulps); 1 - u1 lies in [2^-23, 1], so r <= 5.65.
//
//   DpkitStatelessNormal(shape, key, counter) -> z reshaped to shape
//   DpkitAddStatelessNormal(x, stddev, key, counter) -> x + stddev * z (z of x's shape)
//
// The work is split over pairs between the CPU device's worker threads; every output element
// depends only on its index, so the result does not depend on the split.
#include "kernels.h"

#include <cmath>

namespace tf_dpkit {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // Philox-4x32 multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
constexpr int64_t kBlocks = 256;   // Philox blocks (4 uniforms each) per batch
constexpr int64_t kPairs = 1024;   // normal pairs per chunk

struct Stream {
  uint64_t key, counter_lo, counter_hi;
};

// Uniforms U[start, start + n) of the stream, n <= kPairs.
void Uniforms(const Stream& s, int64_t start, int64_t n, float* dst) {
  alignas(64) uint32_t c0[kBlocks], c1[kBlocks], c2[kBlocks], c3[kBlocks];
  const int64_t first = start / 4, last = (start + n + 3) / 4;
  for (int64_t b = first; b < last; b += kBlocks) {
    const int64_t nb = std::min(kBlocks, last - b);
    for (int64_t j = 0; j < nb; ++j) {  // 128-bit counter + block index
      const uint64_t lo = s.counter_lo + static_cast<uint64_t>(b + j);
      const uint64_t hi = s.counter_hi + (lo < s.counter_lo ? 1u : 0u);
      c0[j] = static_cast<uint32_t>(lo);
      c1[j] = static_cast<uint32_t>(lo >> 32);
      c2[j] = static_cast<uint32_t>(hi);
      c3[j] = static_cast<uint32_t>(hi >> 32);
    }
    uint32_t k0 = static_cast<uint32_t>(s.key), k1 = static_cast<uint32_t>(s.key >> 32);
    for (int round = 0; round < 10; ++round) {
#pragma omp simd
      for (int64_t j = 0; j < nb; ++j) {
        const uint64_t p0 = static_cast<uint64_t>(kM0) * c0[j];
        const uint64_t p1 = static_cast<uint64_t>(kM1) * c2[j];
        const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
        const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
        c1[j] = static_cast<uint32_t>(p1);
        c3[j] = static_cast<uint32_t>(p0);
        c0[j] = n0;
        c2[j] = n2;
      }
      k0 += kW0;
      k1 += kW1;
    }
    alignas(64) uint32_t words[4 * kBlocks];
    for (int64_t j = 0; j < nb; ++j) {
      words[4 * j] = c0[j];
      words[4 * j + 1] = c1[j];
      words[4 * j + 2] = c2[j];
      words[4 * j + 3] = c3[j];
    }
    const int64_t base = 4 * b;
    const int64_t lo = std::max(start, base), hi = std::min(start + n, base + 4 * nb);
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {  // 23 random mantissa bits: a float in [1, 2), minus 1
      const uint32_t bits = (127u << 23) | (words[i - base] & 0x7fffffu);
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      dst[i - start] = f - 1.0f;
    }
  }
}

// Normals of pairs [begin, end) into out (out[i] and out[half + i]); with x, out = x + scale z.
void NormalPairs(const Stream& s, int64_t size, int64_t begin, int64_t end, const float* x,
                 float scale, float* out) {
  const int64_t half = (size + 1) / 2;
  alignas(64) float u1[kPairs], u2[kPairs], radius[kPairs];
  for (int64_t start = begin; start < end; start += kPairs) {
    const int64_t n = std::min(kPairs, end - start);
    Uniforms(s, start, n, u1);
    Uniforms(s, half + start, n, u2);
    Eigen::Map<Eigen::ArrayXf> one(u1, n);
    Eigen::Map<Eigen::ArrayXf>(radius, n) = ((1.0f - one).log() * (-2.0f)).sqrt() * scale;
    float* cos_out = out + start;
    float* sin_out = out + half + start;
    const float* cos_in = x == nullptr ? nullptr : x + start;
    const float* sin_in = x == nullptr ? nullptr : x + half + start;
    // The last pair of an odd size has no sine slot.
    const int64_t with_sin = std::min(n, size - half - start);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      // 2 pi u2 = 2 pi (f + q / 4), |f| <= 1/8: polynomials on [-pi/4, pi/4], then a rotation.
      const int32_t q = static_cast<int32_t>(4.0f * u2[i] + 0.5f);
      const float t = (u2[i] - 0.25f * static_cast<float>(q)) * 6.28318530717958647692f;
      const float t2 = t * t;
      const float sn = t * (1.0f + t2 * (-1.0f / 6 + t2 * (1.0f / 120 + t2 * (-1.0f / 5040 +
                                                                         t2 * (1.0f / 362880)))));
      const float cs = 1.0f + t2 * (-0.5f + t2 * (1.0f / 24 + t2 * (-1.0f / 720 + t2 * (
                                        1.0f / 40320 + t2 * (-1.0f / 3628800)))));
      const int32_t quadrant = q & 3;
      const float cos_v = quadrant == 0 ? cs : quadrant == 1 ? -sn : quadrant == 2 ? -cs : sn;
      const float sin_v = quadrant == 0 ? sn : quadrant == 1 ? cs : quadrant == 2 ? -sn : -cs;
      u1[i] = radius[i] * cos_v;
      u2[i] = radius[i] * sin_v;
    }
    if (x == nullptr) {
      std::memcpy(cos_out, u1, n * sizeof(float));
      std::memcpy(sin_out, u2, std::max<int64_t>(with_sin, 0) * sizeof(float));
    } else {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) cos_out[i] = cos_in[i] + u1[i];
#pragma omp simd
      for (int64_t i = 0; i < with_sin; ++i) sin_out[i] = sin_in[i] + u2[i];
    }
  }
}

// The stream's (key, counter) from inputs key_index and key_index + 1.
::tensorflow::Status ReadStream(OpKernelContext* ctx, int key_index, Stream* s) {
  const Tensor& key = ctx->input(key_index);
  const Tensor& counter = ctx->input(key_index + 1);
  if (key.NumElements() != 1) {
    return InvalidArgument("key must hold 1 uint64 (StatelessRandomGetKeyCounter's key), got ",
                           key.NumElements());
  }
  if (counter.NumElements() != 2) {
    return InvalidArgument("counter must hold 2 uint64 (StatelessRandomGetKeyCounter's "
                           "counter), got ", counter.NumElements());
  }
  s->key = key.flat<tensorflow::uint64>()(0);
  s->counter_lo = counter.flat<tensorflow::uint64>()(0);
  s->counter_hi = counter.flat<tensorflow::uint64>()(1);
  return ::tensorflow::OkStatus();
}

void FillSharded(OpKernelContext* ctx, const Stream& s, int64_t size, const float* x, float scale,
                 float* out) {
  const int64_t half = (size + 1) / 2;
  if (half == 0) return;
  // Per pair: 16 bytes of random words made in registers, 8 bytes written (8 more read with x),
  // about 60 cycles (Philox for two uniforms, a log, a square root, two polynomials).
  const Eigen::TensorOpCost cost(x == nullptr ? 0 : 8, 8, 60);
  ctx->eigen_cpu_device().parallelFor(half, cost, [&](Eigen::Index begin, Eigen::Index end) {
    NormalPairs(s, size, begin, end, x, scale, out);
  });
}

class StatelessNormalOp : public OpKernel {
 public:
  explicit StatelessNormalOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(ctx->input(0).shape()),
                InvalidArgument("shape must be a 1-D int64 tensor, got shape ",
                                ctx->input(0).shape().DebugString()));
    TensorShape shape;
    OP_REQUIRES_OK(ctx, TensorShapeUtils::MakeShape(ctx->input(0).vec<int64_t>(), &shape));
    Stream s;
    OP_REQUIRES_OK(ctx, ReadStream(ctx, 1, &s));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    FillSharded(ctx, s, shape.num_elements(), nullptr, 1.0f, out->flat<float>().data());
  }
};

class AddStatelessNormalOp : public OpKernel {
 public:
  explicit AddStatelessNormalOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& stddev = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(stddev.shape()),
                InvalidArgument("stddev must be a scalar, got shape ",
                                stddev.shape().DebugString()));
    const float scale = stddev.scalar<float>()();
    OP_REQUIRES(ctx, std::isfinite(scale) && scale >= 0.0f,
                InvalidArgument("stddev must be finite and >= 0, got ", scale));
    Stream s;
    OP_REQUIRES_OK(ctx, ReadStream(ctx, 2, &s));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, x.shape(), &out));
    FillSharded(ctx, s, x.NumElements(), x.flat<float>().data(), scale,
                out->flat<float>().data());
  }
};

}  // namespace

REGISTER_OP("DpkitStatelessNormal")
    .Input("shape: int64")
    .Input("key: uint64")
    .Input("counter: uint64")
    .Output("output: float")
    .SetIsStateful()  // never constant-folded: the key is a secret read at run time
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(0, &out));
      c->set_output(0, out);
      return ::tensorflow::OkStatus();
    });

REGISTER_OP("DpkitAddStatelessNormal")
    .Input("x: float")
    .Input("stddev: float")
    .Input("key: uint64")
    .Input("counter: uint64")
    .Output("output: float")
    .SetIsStateful()
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return ::tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("DpkitStatelessNormal").Device(::tensorflow::DEVICE_CPU),
                        StatelessNormalOp);
REGISTER_KERNEL_BUILDER(Name("DpkitAddStatelessNormal").Device(::tensorflow::DEVICE_CPU),
                        AddStatelessNormalOp);

}  // namespace tf_dpkit
