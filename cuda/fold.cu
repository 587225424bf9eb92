// Elementwise left fold of k same-shaped contributions: out[i] = op(...op(op(x0[i], x1[i]), x2[i])..., xk-1[i]).
//
// Bitwise contract: the result equals the CPU path (torch ops on CPU, prism/runtime/semantics.py):
// - each step computes in the op-math type (float for bf16/fp16) and rounds to the dtype at once, as torch
//   does for a bf16 + bf16 -> bf16 add; no contraction into FMA (built with --fmad=false), no flush to zero;
// - MAX/MIN follow torch's CPU vectorized rule: any NaN gives the all-ones NaN pattern, a tie (+0 vs -0)
//   returns the second operand. (torch's scalar tail, the last numel mod 2*vector-width elements of a CPU
//   op, returns the first operand and a canonical NaN instead: see cuda/README.md.)
// - integer SUM/PRODUCT wrap modulo 2^64 (computed unsigned: no undefined overflow);
// - AVG's final division: true division by n in op-math type for floats, floor division for integers.
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

enum FoldOp : int64_t { SUM = 0, PRODUCT = 1, MIN = 2, MAX = 3, BAND = 4, BOR = 5, BXOR = 6 };

template <typename T> struct OpMath { using type = T; };
template <> struct OpMath<at::BFloat16> { using type = float; };
template <> struct OpMath<at::Half> { using type = float; };

template <typename T> __device__ __forceinline__ T all_ones_nan();
template <> __device__ __forceinline__ float all_ones_nan<float>() { return __int_as_float(-1); }
template <> __device__ __forceinline__ double all_ones_nan<double>() { return __longlong_as_double(-1LL); }
template <> __device__ __forceinline__ at::BFloat16 all_ones_nan<at::BFloat16>() {
  return at::BFloat16(0xFFFF, at::BFloat16::from_bits());
}
template <> __device__ __forceinline__ at::Half all_ones_nan<at::Half>() {
  return at::Half(0xFFFF, at::Half::from_bits());
}

template <typename T, int64_t OP>
__device__ __forceinline__ T step(T a, T b) {
  using M = typename OpMath<T>::type;
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    if constexpr (OP == SUM) return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    if constexpr (OP == PRODUCT) return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    if constexpr (OP == MIN) return b < a ? b : a;
    if constexpr (OP == MAX) return b > a ? b : a;
    if constexpr (OP == BAND) return a & b;
    if constexpr (OP == BOR) return a | b;
    if constexpr (OP == BXOR) return a ^ b;
  } else {
    const M x = static_cast<M>(a), y = static_cast<M>(b);
    if constexpr (OP == SUM) return static_cast<T>(x + y);
    if constexpr (OP == PRODUCT) return static_cast<T>(x * y);
    if constexpr (OP == MIN) return (x != x || y != y) ? all_ones_nan<T>() : (x < y ? a : b);
    if constexpr (OP == MAX) return (x != x || y != y) ? all_ones_nan<T>() : (x > y ? a : b);
  }
  return a;  // unreachable: ops are checked on the host
}

template <typename T, int64_t OP>
__global__ void fold_kernel(const T* const* __restrict__ parts, int k, T* __restrict__ out, int64_t numel) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    T acc = parts[0][i];
    for (int j = 1; j < k; ++j) acc = step<T, OP>(acc, parts[j][i]);
    out[i] = acc;
  }
}

template <typename T>
__global__ void avg_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t numel, int64_t n) {
  using M = typename OpMath<T>::type;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    if constexpr (std::is_integral_v<T>) {
      T q = in[i] / n;
      if ((in[i] % n != 0) && ((in[i] < 0) != (n < 0))) q -= 1;   // floor, as torch's // on integers
      out[i] = q;
    } else {
      out[i] = static_cast<T>(static_cast<M>(in[i]) / static_cast<M>(n));
    }
  }
}

int blocks_for(int64_t numel, int threads) {
  const int64_t want = (numel + threads - 1) / threads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, 65535)));
}

template <typename T, int64_t OP>
void launch_fold(const std::vector<torch::Tensor>& parts, torch::Tensor& out) {
  const int k = static_cast<int>(parts.size());
  std::vector<int64_t> ptrs(k);
  for (int j = 0; j < k; ++j) ptrs[j] = reinterpret_cast<int64_t>(parts[j].data_ptr<T>());
  // The pointer table travels to the device on the current stream; the caching allocator keeps its block
  // until the kernel queued after the copy has run.
  auto table = torch::from_blob(ptrs.data(), {k}, torch::kInt64).to(out.device(), /*non_blocking=*/false);
  const int threads = 256;
  const int64_t numel = out.numel();
  auto stream = c10::cuda::getCurrentCUDAStream();
  fold_kernel<T, OP><<<blocks_for(numel, threads), threads, 0, stream>>>(
      reinterpret_cast<const T* const*>(table.data_ptr<int64_t>()), k, out.data_ptr<T>(), numel);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void dispatch_op(int64_t op, const std::vector<torch::Tensor>& parts, torch::Tensor& out) {
  switch (op) {
    case SUM: return launch_fold<T, SUM>(parts, out);
    case PRODUCT: return launch_fold<T, PRODUCT>(parts, out);
    case MIN: return launch_fold<T, MIN>(parts, out);
    case MAX: return launch_fold<T, MAX>(parts, out);
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case BAND: return launch_fold<T, BAND>(parts, out);
      case BOR: return launch_fold<T, BOR>(parts, out);
      case BXOR: return launch_fold<T, BXOR>(parts, out);
      default: break;
    }
  }
  TORCH_CHECK(false, "prism fold: op ", op, " is not defined for dtype ", out.scalar_type());
}

// fold_into: the contributions' pointers travel as a kernel parameter (no device allocation), up to
// kMaxParts per launch; a longer fold continues from `out` (bitwise the same: the accumulator is rounded to
// T after every step either way). `out` may be one of the inputs: each thread reads element i of every
// part before it writes element i of `out`.
constexpr int kMaxParts = 32;
struct PartPtrs {
  const void* p[kMaxParts];
};

template <typename T, int64_t OP>
__global__ void fold_params_kernel(PartPtrs parts, int k, T* out, int64_t numel) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    T acc = static_cast<const T*>(parts.p[0])[i];
    for (int j = 1; j < k; ++j) acc = step<T, OP>(acc, static_cast<const T*>(parts.p[j])[i]);
    out[i] = acc;
  }
}

// The address a kernel reads a tensor at: a CUDA tensor's own, a pinned host tensor's mapped address.
void* device_address(const torch::Tensor& t) {
  if (t.is_cuda()) return t.data_ptr();
  void* dev = nullptr;
  C10_CUDA_CHECK(cudaHostGetDevicePointer(&dev, t.data_ptr(), 0));
  return dev;
}

template <typename T, int64_t OP>
void launch_fold_into(const std::vector<torch::Tensor>& parts, torch::Tensor& out) {
  const int64_t numel = out.numel();
  const int threads = 256;
  auto stream = c10::cuda::getCurrentCUDAStream();
  T* dst = static_cast<T*>(device_address(out));
  size_t next = 0;
  bool first = true;
  while (next < parts.size()) {
    PartPtrs ptrs{};
    int k = 0;
    if (!first) ptrs.p[k++] = dst;  // continue the left fold from what the previous launch wrote
    while (k < kMaxParts && next < parts.size()) ptrs.p[k++] = device_address(parts[next++]);
    fold_params_kernel<T, OP><<<blocks_for(numel, threads), threads, 0, stream>>>(ptrs, k, dst, numel);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    first = false;
  }
}

template <typename T>
void dispatch_op_into(int64_t op, const std::vector<torch::Tensor>& parts, torch::Tensor& out) {
  switch (op) {
    case SUM: return launch_fold_into<T, SUM>(parts, out);
    case PRODUCT: return launch_fold_into<T, PRODUCT>(parts, out);
    case MIN: return launch_fold_into<T, MIN>(parts, out);
    case MAX: return launch_fold_into<T, MAX>(parts, out);
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case BAND: return launch_fold_into<T, BAND>(parts, out);
      case BOR: return launch_fold_into<T, BOR>(parts, out);
      case BXOR: return launch_fold_into<T, BXOR>(parts, out);
      default: break;
    }
  }
  TORCH_CHECK(false, "prism fold: op ", op, " is not defined for dtype ", out.scalar_type());
}

}  // namespace

void fold_into_cuda(const std::vector<torch::Tensor>& inputs, torch::Tensor out, int64_t op) {
  TORCH_CHECK(!inputs.empty(), "prism fold_into: no contributions");
  const torch::Tensor* cuda = out.is_cuda() ? &out : nullptr;
  for (const auto& t : inputs)
    if (cuda == nullptr && t.is_cuda()) cuda = &t;
  TORCH_CHECK(cuda != nullptr, "prism fold_into: no CUDA tensor among the contributions and the output");
  const auto device = cuda->device();
  auto usable = [&](const torch::Tensor& t) {
    return t.scalar_type() == out.scalar_type() && t.sizes() == out.sizes() && t.is_contiguous() &&
           (t.is_cuda() ? t.device() == device : t.is_pinned());
  };
  TORCH_CHECK(usable(out), "prism fold_into: the output must be contiguous, on ", device,
              " or in pinned host memory, of the contributions' dtype and shape");
  for (const auto& t : inputs)
    TORCH_CHECK(usable(t), "prism fold_into: contributions must be contiguous, same dtype and shape, on ", device,
                " or in pinned host memory");
  c10::cuda::CUDAGuard guard(device);
  if (out.numel() == 0) return;
  switch (out.scalar_type()) {
    case at::kFloat: dispatch_op_into<float>(op, inputs, out); break;
    case at::kDouble: dispatch_op_into<double>(op, inputs, out); break;
    case at::kBFloat16: dispatch_op_into<at::BFloat16>(op, inputs, out); break;
    case at::kHalf: dispatch_op_into<at::Half>(op, inputs, out); break;
    case at::kLong: dispatch_op_into<int64_t>(op, inputs, out); break;
    default: TORCH_CHECK(false, "prism fold_into: dtype ", out.scalar_type(),
                         " is not supported (float32, float64, bfloat16, float16, int64)");
  }
  // host memory is read and written by the kernel: done before the caller reads `out` or frees an input
  C10_CUDA_CHECK(cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream()));
}

torch::Tensor fold_cuda(const std::vector<torch::Tensor>& inputs, int64_t op) {
  TORCH_CHECK(!inputs.empty(), "prism fold: no contributions");
  const auto& first = inputs[0];
  TORCH_CHECK(first.is_cuda(), "prism fold: contributions must be CUDA tensors");
  std::vector<torch::Tensor> parts;
  parts.reserve(inputs.size());
  for (const auto& t : inputs) {
    TORCH_CHECK(t.device() == first.device() && t.scalar_type() == first.scalar_type() &&
                t.sizes() == first.sizes(), "prism fold: contributions differ in device, dtype or shape");
    parts.push_back(t.contiguous());
  }
  c10::cuda::CUDAGuard guard(first.device());
  auto out = torch::empty_like(parts[0], at::MemoryFormat::Contiguous);
  if (out.numel() == 0) return out;
  switch (first.scalar_type()) {
    case at::kFloat: dispatch_op<float>(op, parts, out); break;
    case at::kDouble: dispatch_op<double>(op, parts, out); break;
    case at::kBFloat16: dispatch_op<at::BFloat16>(op, parts, out); break;
    case at::kHalf: dispatch_op<at::Half>(op, parts, out); break;
    case at::kLong: dispatch_op<int64_t>(op, parts, out); break;
    default: TORCH_CHECK(false, "prism fold: dtype ", first.scalar_type(),
                         " is not supported (float32, float64, bfloat16, float16, int64)");
  }
  return out;
}

torch::Tensor finish_avg_cuda(const torch::Tensor& acc_in, int64_t n) {
  TORCH_CHECK(acc_in.is_cuda(), "prism finish_avg: accumulator must be a CUDA tensor");
  TORCH_CHECK(n > 0, "prism finish_avg: group size must be positive, got ", n);
  c10::cuda::CUDAGuard guard(acc_in.device());
  auto acc = acc_in.contiguous();
  auto out = torch::empty_like(acc, at::MemoryFormat::Contiguous);
  const int64_t numel = acc.numel();
  if (numel == 0) return out;
  const int threads = 256;
  auto stream = c10::cuda::getCurrentCUDAStream();
  switch (acc.scalar_type()) {
#define PRISM_AVG(T)                                                                                     \
  avg_kernel<T><<<blocks_for(numel, threads), threads, 0, stream>>>(acc.data_ptr<T>(), out.data_ptr<T>(), \
                                                                    numel, n);                          \
  break;
    case at::kFloat: PRISM_AVG(float)
    case at::kDouble: PRISM_AVG(double)
    case at::kBFloat16: PRISM_AVG(at::BFloat16)
    case at::kHalf: PRISM_AVG(at::Half)
    case at::kLong: PRISM_AVG(int64_t)
#undef PRISM_AVG
    default: TORCH_CHECK(false, "prism finish_avg: dtype ", acc.scalar_type(), " is not supported");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
