// CPU kernels for the Embedding clipping rule (tf_dpkit/clipping/rules/embedding.py), float32.
//
// Inputs: ids [M, K] int32 (microbatch j's K positions; ids outside [0, V) count for nothing),
// rows [M, K, d] float (the output gradient g at each position), the vocabulary size V.
//
//   DpkitTokenSquaredNorms(ids, rows, vocab) -> [M]:
//     ||G_j||^2 = sum over tokens v of || sum over positions k of j with ids[j, k] = v of
//     rows[j, k] ||^2  (positions of one token are summed first, then squared)
//   DpkitScatterScaledRows(ids, rows, factors [M], vocab) -> [V, d]:
//     sum_j factors[j] G_j, i.e. out[ids[j, k]] += factors[j] rows[j, k] over counted positions
//
// Both are sums of the same terms as the TensorFlow-op rule in another order (float32; a
// microbatch's tokens are totalled in double).  Work is split over microbatches (norms) or over
// vocabulary ranges (scatter: each thread owns its rows of out and adds in position order, so
// the result does not depend on the split).
#include "kernels.h"

namespace tf_dpkit {
namespace {

// Checks ids [M, K], rows [M, K, d], vocab scalar >= 0; sets M, K, d, V.
Status ReadPositions(OpKernelContext* ctx, int64_t* m, int64_t* k, int64_t* d, int64_t* v) {
  const Tensor& ids = ctx->input(0);
  const Tensor& rows = ctx->input(1);
  if (ids.dims() != 2) {
    return InvalidArgument("ids must be [microbatches, positions], got shape ",
                           ids.shape().DebugString());
  }
  if (rows.dims() != 3 || rows.dim_size(0) != ids.dim_size(0) ||
      rows.dim_size(1) != ids.dim_size(1)) {
    return InvalidArgument("rows must be [microbatches, positions, width] matching ids ",
                           ids.shape().DebugString(), ", got ", rows.shape().DebugString());
  }
  const Tensor& vocab = ctx->input(ctx->num_inputs() - 1);
  if (!TensorShapeUtils::IsScalar(vocab.shape()) || vocab.scalar<int64_t>()() < 0) {
    return InvalidArgument("vocab must be a scalar >= 0");
  }
  *m = ids.dim_size(0);
  *k = ids.dim_size(1);
  *d = rows.dim_size(2);
  *v = vocab.scalar<int64_t>()();
  return ::tensorflow::OkStatus();
}

class TokenSquaredNormsOp : public OpKernel {
 public:
  explicit TokenSquaredNormsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t m, k, d, v;
    OP_REQUIRES_OK(ctx, ReadPositions(ctx, &m, &k, &d, &v));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &out));
    const int32_t* ids = ctx->input(0).flat<int32_t>().data();
    const float* rows = ctx->input(1).flat<float>().data();
    float* norms = out->flat<float>().data();
    const Eigen::TensorOpCost cost(static_cast<double>(k) * (4 + 4 * d), 4,
                                   static_cast<double>(k) * (2 * d + 20));
    // Tokens of a microbatch are found with an open-addressing table of 2^b >= 2K slots; a
    // token's positions are chained in position order.
    int bits = 1;
    while ((int64_t{1} << bits) < 2 * k) ++bits;
    const int64_t slots = int64_t{1} << bits;
    ctx->eigen_cpu_device().parallelFor(m, cost, [&](Eigen::Index begin, Eigen::Index end) {
      std::vector<int32_t> key(slots, -1), first(slots), last(slots), count(slots);
      std::vector<int64_t> next(k), used;
      std::vector<float> run(d);
      used.reserve(k);
      for (Eigen::Index j = begin; j < end; ++j) {
        const int32_t* id_row = ids + j * k;
        const float* g = rows + j * k * d;
        used.clear();
        for (int64_t p = 0; p < k; ++p) {
          const int32_t id = id_row[p];
          if (id < 0 || id >= v) continue;  // not counted
          next[p] = -1;
          uint64_t h = (static_cast<uint32_t>(id) * 0x9E3779B1u) >> (32 - bits);
          while (key[h] != -1 && key[h] != id) h = (h + 1) & (slots - 1);
          if (key[h] == -1) {
            key[h] = id;
            first[h] = last[h] = static_cast<int32_t>(p);
            count[h] = 1;
            used.push_back(static_cast<int64_t>(h));
          } else {
            next[last[h]] = p;
            last[h] = static_cast<int32_t>(p);
            ++count[h];
          }
        }
        double total = 0.0;
        for (const int64_t h : used) {
          const float* row = g + static_cast<int64_t>(first[h]) * d;
          float square = 0.0f;
          if (count[h] == 1) {  // a token at one position: that position's ||g||^2
#pragma omp simd reduction(+ : square)
            for (int64_t c = 0; c < d; ++c) square += row[c] * row[c];
          } else {  // repeated: sum the positions' g (in position order), then square
            std::copy(row, row + d, run.begin());
            for (int64_t p = next[first[h]]; p != -1; p = next[p]) {
              const float* more = g + p * d;
#pragma omp simd
              for (int64_t c = 0; c < d; ++c) run[c] += more[c];
            }
#pragma omp simd reduction(+ : square)
            for (int64_t c = 0; c < d; ++c) square += run[c] * run[c];
          }
          total += square;
          key[h] = -1;  // reset for the next microbatch
        }
        norms[j] = static_cast<float>(total);
      }
    });
  }
};

class ScatterScaledRowsOp : public OpKernel {
 public:
  explicit ScatterScaledRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t m, k, d, v;
    OP_REQUIRES_OK(ctx, ReadPositions(ctx, &m, &k, &d, &v));
    const Tensor& factors = ctx->input(2);
    OP_REQUIRES(ctx, factors.dims() == 1 && factors.dim_size(0) == m,
                InvalidArgument("factors must be [microbatches] = [", m, "], got shape ",
                                factors.shape().DebugString()));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({v, d}), &out));
    const int32_t* ids = ctx->input(0).flat<int32_t>().data();
    const float* rows = ctx->input(1).flat<float>().data();
    const float* scale = factors.flat<float>().data();
    float* table = out->flat<float>().data();
    const int64_t positions = m * k;
    // Per vocabulary row: zeroing d floats, plus a share of the scan and the adds.
    const double adds_per_row = v > 0 ? static_cast<double>(positions) * d / v : 0.0;
    const Eigen::TensorOpCost cost(4.0 * adds_per_row, 4.0 * d,
                                   2.0 * adds_per_row + d + (v > 0 ? positions / v : 0));
    ctx->eigen_cpu_device().parallelFor(v, cost, [&](Eigen::Index lo, Eigen::Index hi) {
      std::fill(table + lo * d, table + hi * d, 0.0f);
      for (int64_t p = 0; p < positions; ++p) {
        const int32_t id = ids[p];
        if (id < lo || id >= hi) continue;  // other threads' rows, or not counted
        const float c = scale[p / k];
        const float* row = rows + p * d;
        float* target = table + static_cast<int64_t>(id) * d;
#pragma omp simd
        for (int64_t e = 0; e < d; ++e) target[e] += c * row[e];
      }
    });
  }
};

}  // namespace

REGISTER_OP("DpkitTokenSquaredNorms")
    .Input("ids: int32")
    .Input("rows: float")
    .Input("vocab: int64")
    .Output("squared_norms: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->Dim(c->input(0), 0)));
      return ::tensorflow::OkStatus();
    });

REGISTER_OP("DpkitScatterScaledRows")
    .Input("ids: int32")
    .Input("rows: float")
    .Input("factors: float")
    .Input("vocab: int64")
    .Output("clipped_sum: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::DimensionHandle vocab;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(3, &vocab));
      c->set_output(0, c->Matrix(vocab, c->Dim(c->input(1), 2)));
      return ::tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("DpkitTokenSquaredNorms").Device(::tensorflow::DEVICE_CPU),
                        TokenSquaredNormsOp);
REGISTER_KERNEL_BUILDER(Name("DpkitScatterScaledRows").Device(::tensorflow::DEVICE_CPU),
                        ScatterScaledRowsOp);

}  // namespace tf_dpkit
