// lowrank_cuda_kernel_perf: effective memory bandwidth of each device phase of PowerSGD (pass 1,
// pass 2, orthonormalize, pass 3; kernels/cuda) on >= 1 GB working sets, beside a plain device copy
// kernel measured in the same run, in an nccl-tests style table.
// Bytes counted as STREAM does, with error feedback: pass 1 reads G and E and writes E (12 B per
// float32 element, 10 B for 16-bit G), pass 2 reads M = E (4 B), pass 3 reads E, writes E and the
// output (12 B, 10 B); orthonormalize reads and writes P (its time matters, not its bandwidth).
// The copy kernel reads and writes the same number of bytes as one float32 M (8 B per element).
// Layouts: "square" (one n x n matrix) and "batch" (many tensors of model-like shapes, one launch
// per phase for all of them); k is clipped to each tensor's rows and columns.
// The cuBLAS baseline (float32 only: cuBLAS has no bfloat16 x float32 product): cublas1 is P = M Q
// and cublas2 Q = M^T P by cublasSgemm, one call per tensor, reading M once (4 B per element).
// cublas2 does pass 2's work; pass 1 does cublas1's and the error-feedback add besides.
//
// usage: lowrank_cuda_kernel_perf [-k 1,4,8,32] [-d f32,bf16] [-s GiB of float32 M (default 1)]
//                                 [-m square,batch] [-r repeats (default 20)]
//                                 [-p pass1,pass2,ortho,pass3,cublas1,cublas2 (phases to time;
//                                     default all)]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/dense_qr.h"
#include "kernels/cuda/powersgd_kernels.h"

namespace cu = lowrank::cuda;

namespace {

[[noreturn]] void die(const char* what, cudaError_t e) {
  fprintf(stderr, "lowrank_cuda_kernel_perf: %s: %s\n", what, cudaGetErrorString(e));
  exit(1);
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(what, e);
}
#define CHECK(call) check((call), #call)
void checkBlas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "lowrank_cuda_kernel_perf: %s: cuBLAS status %d\n", what, int(s));
    exit(1);
  }
}
#define CHECK_BLAS(call) checkBlas((call), #call)

std::vector<std::string> split(const char* s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');)
    if (!t.empty()) v.push_back(t);
  return v;
}

// Launches kernel k (the library's launch helper does the same; LOWRANK_CUDA_EMULATION runs it on
// the CPU emulation of tests/gpu/emu, for a smoke test without a GPU).
template <typename... P, typename... A>
cudaError_t run(void (*k)(P...), unsigned grid, unsigned block, A... args) {
#ifdef LOWRANK_CUDA_EMULATION
  return ::emu::launch(grid, block, [&] { k(args...); });
#else
  k<<<grid, block>>>(args...);
  return cudaGetLastError();
#endif
}

__device__ inline float cvt(float x, float) { return x; }
__device__ inline __nv_bfloat16 cvt(float x, __nv_bfloat16) { return __float2bfloat16_rn(x); }

// Deterministic pseudo-random values in [-scale, scale), in any dtype.
__device__ float hashUniform(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9e3779b97f4a7c15ull + seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return float((z ^ (z >> 31)) >> 40) * 0x1p-24f * 2.f - 1.f;
}
template <typename T>
__global__ void fillKernel(T* x, uint64_t n, uint32_t seed, float scale) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x)
    x[i] = cvt(scale * hashUniform(i, seed), T{});
}
void fill(void* x, lowrankDataType_t dt, uint64_t n, uint32_t seed, float scale) {
  if (dt == lowrankFloat32)
    CHECK(run(fillKernel<float>, 4096, 256, static_cast<float*>(x), n, seed, scale));
  else
    CHECK(
        run(fillKernel<__nv_bfloat16>, 4096, 256, static_cast<__nv_bfloat16*>(x), n, seed, scale));
}

__global__ void copyKernel(const float4* __restrict src, float4* __restrict dst, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// Mean time in microseconds of `reps` runs of f, after one untimed run.
template <typename F>
double timeUs(int reps, F f) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(f());
  CHECK(cudaEventRecord(a));
  for (int r = 0; r < reps; ++r) CHECK(f());
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return 1e3 * ms / reps;
}

struct Shape {
  uint32_t rows, cols;
};

// "square": one n x n matrix of at least `elems` elements' worth (n = floor(sqrt)); "batch": shapes
// of transformer and CNN layers, cycled until they hold at least `elems` elements.
std::vector<Shape> layoutShapes(const std::string& layout, uint64_t elems) {
  if (layout == "square") {
    const uint32_t n = uint32_t(std::sqrt(double(elems)));
    return {{n, n}};
  }
  const Shape cycle[] = {{4096, 4096}, {4096, 11008}, {11008, 4096}, {1024, 4096}, {4096, 1024},
                         {768, 3072},  {3072, 768},   {2304, 768},   {512, 512},   {50257, 768},
                         {1000, 1000}, {333, 777},    {64, 9000},    {9000, 64},   {256, 2304}};
  std::vector<Shape> v;
  for (uint64_t total = 0; total < elems;) {
    const Shape s = cycle[v.size() % (sizeof(cycle) / sizeof(cycle[0]))];
    v.push_back(s);
    total += uint64_t(s.rows) * s.cols;
  }
  return v;
}

struct Row {
  std::string layout, phase, dtype;
  int k;
  double bytes, us;
};

void printRow(const Row& r, double copyGBs) {
  const double gbs = r.bytes / (r.us * 1e-6) / 1e9;
  if (r.phase == "ortho")
    printf("%8s %7s %4d %5s %14.0f %11.1f %9s %7s\n", r.layout.c_str(), r.phase.c_str(), r.k,
           r.dtype.c_str(), r.bytes, r.us, "-", "-");
  else
    printf("%8s %7s %4d %5s %14.0f %11.1f %9.1f %6.1f%%\n", r.layout.c_str(), r.phase.c_str(), r.k,
           r.dtype.c_str(), r.bytes, r.us, gbs, 100.0 * gbs / copyGBs);
  fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ks = {1, 4, 8, 32};
  std::vector<std::string> dtypes = {"f32", "bf16"}, layouts = {"square", "batch"};
  double gib = 1.0;
  int reps = 20;
  std::vector<std::string> phases = {"pass1", "pass2", "ortho", "pass3", "cublas1", "cublas2"};
  for (int c; (c = getopt(argc, argv, "k:d:s:m:r:p:h")) != -1;) {
    if (c == 'k') {
      ks.clear();
      for (const std::string& t : split(optarg)) ks.push_back(std::atoi(t.c_str()));
    } else if (c == 'd') {
      dtypes = split(optarg);
    } else if (c == 's') {
      gib = std::atof(optarg);
    } else if (c == 'm') {
      layouts = split(optarg);
    } else if (c == 'r') {
      reps = std::atoi(optarg);
    } else if (c == 'p') {
      phases = split(optarg);
    } else {
      fprintf(stderr,
              "usage: %s [-k 1,4,8,32] [-d f32,bf16] [-s GiB of float32 M] [-m square,batch] "
              "[-r repeats] [-p pass1,pass2,ortho,pass3,cublas1,cublas2]\n",
              argv[0]);
      return c == 'h' ? 0 : 2;
    }
  }
  bool ok = gib > 0 && reps > 0 && !ks.empty() && !dtypes.empty() && !layouts.empty();
  for (int k : ks) ok = ok && k >= 1;
  for (const std::string& d : dtypes) ok = ok && (d == "f32" || d == "bf16");
  for (const std::string& l : layouts) ok = ok && (l == "square" || l == "batch");
  ok = ok && !phases.empty();
  for (const std::string& p : phases)
    ok = ok && (p == "pass1" || p == "pass2" || p == "ortho" || p == "pass3" || p == "cublas1" ||
                p == "cublas2");
  auto timed = [&](const char* phase) {
    return std::find(phases.begin(), phases.end(), phase) != phases.end();
  };
  if (!ok) {
    fprintf(stderr,
            "%s: -k: ranks >= 1; -d: f32,bf16; -m: square,batch; "
            "-p: pass1,pass2,ortho,pass3,cublas1,cublas2; -s, -r: positive\n",
            argv[0]);
    return 2;
  }

  int devices = 0;
  const cudaError_t de = cudaGetDeviceCount(&devices);
  if (de != cudaSuccess || devices == 0) {
    fprintf(stderr, "lowrank_cuda_kernel_perf: no CUDA device: %s\n",
            de != cudaSuccess ? cudaGetErrorString(de) : "cudaGetDeviceCount returned 0");
    return 1;
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const uint64_t elems = uint64_t(gib * (1ull << 30) / 4);

  // Buffers for the largest layout: G and out in up to 4 B per element, E in float32.
  uint64_t maxElems = 0;
  for (const std::string& l : layouts) {
    uint64_t n = 0;
    for (const Shape& s : layoutShapes(l, elems)) n += uint64_t(s.rows) * s.cols;
    maxElems = std::max(maxElems, n);
  }
  size_t freeB = 0, totalB = 0;
  CHECK(cudaMemGetInfo(&freeB, &totalB));
  if (3 * 4 * maxElems + (64ull << 20) > freeB) {
    fprintf(stderr, "lowrank_cuda_kernel_perf: needs %.1f GiB of device memory, %.1f GiB free\n",
            12.0 * maxElems / (1ull << 30), double(freeB) / (1ull << 30));
    return 1;
  }
  void *g = nullptr, *out = nullptr;
  float *e = nullptr, *bad = nullptr;
  CHECK(cudaMalloc(&g, 4 * maxElems));
  CHECK(cudaMalloc(&out, 4 * maxElems));
  CHECK(cudaMalloc(&e, 4 * maxElems));
  CHECK(cudaMalloc(&bad, sizeof(float)));
  cublasHandle_t blas = nullptr;
  CHECK_BLAS(cublasCreate(&blas));
  // Plain float32 arithmetic, as the kernels (no TF32 tensor-core rounding).
  CHECK_BLAS(cublasSetMathMode(blas, CUBLAS_PEDANTIC_MATH));

  // The reference: a float4 copy of one float32 M (elems), read + write.
  const uint64_t n4 = elems / 4;
  const double copyUs = timeUs(reps, [&] {
    return run(copyKernel, unsigned(prop.multiProcessorCount) * 8, 512,
               static_cast<const float4*>(g), static_cast<float4*>(out), n4);
  });
  const double copyBytes = 2.0 * 16 * n4, copyGBs = copyBytes / (copyUs * 1e-6) / 1e9;

  printf(
      "# lowrank_cuda_kernel_perf: %s, %d SMs, %.0f GiB; float32 M of %.2f GiB; mean of %d runs\n",
      prop.name, prop.multiProcessorCount, double(prop.totalGlobalMem) / (1ull << 30),
      4.0 * elems / (1ull << 30), reps);
  printf("# copy kernel (read + write %.2f GiB): %.1f us, %.1f GB/s\n", copyBytes / (1ull << 30),
         copyUs, copyGBs);
  const char* noSolver = nullptr;
  const bool solver = lowrank::cuda::detail::denseQrApi(&noSolver) != nullptr;
  printf("# orthonormalize, k > 32: %s%s\n", solver ? "cuSOLVER QR" : "one CUDA block per matrix: ",
         solver ? "" : noSolver);
  printf(
      "# bytes: pass1 G + 2 E, pass2 E, pass3 2 E + out (error feedback on); total = the three "
      "passes, orthonormalize excluded\n");
  printf("#%7s %7s %4s %5s %14s %11s %9s %7s\n", "layout", "phase", "k", "dtype", "bytes",
         "time(us)", "GB/s", "of copy");

  for (const std::string& layout : layouts) {
    const std::vector<Shape> shapes = layoutShapes(layout, elems);
    uint64_t count = 0;
    for (const Shape& s : shapes) count += uint64_t(s.rows) * s.cols;
    for (const std::string& dname : dtypes) {
      const lowrankDataType_t dt = dname == "f32" ? lowrankFloat32 : lowrankBfloat16;
      const double gb = dt == lowrankFloat32 ? 4 : 2;
      fill(g, dt, count, 1, 1.f);
      fill(e, lowrankFloat32, count, 2, 0.1f);
      for (int k : ks) {
        // Whole tensors as blocks: row blocks = column blocks; P and Qt one after another.
        std::vector<cu::BlockDesc> blocks;
        std::vector<cu::OrthoDesc> ortho;
        uint64_t offset = 0, pCount = 0, qCount = 0, pqElems = 0;
        for (const Shape& s : shapes) {
          const uint32_t kk = std::min<uint32_t>(uint32_t(k), std::min(s.rows, s.cols));
          cu::BlockDesc d;
          d.offset = offset;
          d.valid = uint64_t(s.rows) * s.cols;
          d.ld = s.cols;
          d.rows = s.rows;
          d.cols = s.cols;
          d.k = kk;
          d.p = pCount;
          d.qt = qCount;
          d.qld = s.cols;
          d.limit = INFINITY;
          blocks.push_back(d);
          cu::OrthoDesc o;
          o.offset = pCount;
          o.n = s.rows;
          o.k = kk;
          o.rowStride = kk;
          o.colStride = 1;
          ortho.push_back(o);
          offset += d.valid;
          pCount += uint64_t(s.rows) * kk;
          qCount += uint64_t(kk) * s.cols;
          pqElems += uint64_t(s.rows) * kk;
        }
        float *p = nullptr, *qt = nullptr;
        CHECK(cudaMalloc(&p, 4 * pCount));
        CHECK(cudaMalloc(&qt, 4 * qCount));
        fill(p, lowrankFloat32, pCount, 3, 1.f);
        fill(qt, lowrankFloat32, qCount, 4, 0.01f);
        cu::BlockTable* bt = nullptr;
        cu::OrthoTable* ot = nullptr;
        CHECK(cu::createBlockTable(blocks.data(), blocks.size(), &bt));
        CHECK(cu::createOrthoTable(ortho.data(), ortho.size(), &ot));
        CHECK(cudaMemset(bad, 0, sizeof(float)));

        const double n = double(count);
        auto rowOf = [&](const char* phase, double bytes, auto f) {
          return Row{layout, phase, dname, k, bytes, timed(phase) ? timeUs(reps, f) : -1.0};
        };
        const Row rows[4] = {
            rowOf("pass1", n * (gb + 8),
                  [&] { return cu::errorFeedbackAndP(bt, g, dt, e, qt, p, bad, nullptr); }),
            rowOf("pass2", n * 4, [&] { return cu::computeQ(bt, g, dt, e, p, qt, nullptr); }),
            rowOf("ortho", 8.0 * pqElems, [&] { return cu::orthonormalize(ot, p, 0.0, nullptr); }),
            rowOf("pass3", n * (8 + gb),
                  [&] {
                    return cu::decompressAndUpdateError(bt, e, p, qt, 1.f, out, dt, nullptr, 0.f,
                                                        nullptr);
                  }),
        };
        for (const Row& r : rows)
          if (r.us >= 0) printRow(r, copyGBs);
        // cuBLAS, per tensor. Row-major M (rows x cols) is column-major M^T; P row-major is
        // column-major P^T (ld k); Qt row-major is column-major Q (ld cols).
        auto gemms = [&](bool secondPass) {
          const float one = 1.f, zero = 0.f;
          const float* m = static_cast<const float*>(g);
          for (const cu::BlockDesc& d : blocks) {
            const int rr = int(d.rows), cc = int(d.cols), kk = int(d.k);
            const cublasStatus_t st =
                secondPass ? cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, cc, kk, rr, &one,
                                         m + d.offset, cc, p + d.p, kk, &zero, qt + d.qt, cc)
                           : cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, kk, rr, cc, &one,
                                         qt + d.qt, cc, m + d.offset, cc, &zero, p + d.p, kk);
            if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
          }
          return cudaGetLastError();
        };
        if (dt == lowrankFloat32)
          for (const char* phase : {"cublas1", "cublas2"})
            if (timed(phase))
              printRow({layout, phase, dname, k, n * 4,
                        timeUs(reps, [&] { return gemms(std::string(phase) == "cublas2"); })},
                       copyGBs);
        if (rows[0].us >= 0 && rows[1].us >= 0 && rows[3].us >= 0)
          printRow({layout, "total", dname, k, rows[0].bytes + rows[1].bytes + rows[3].bytes,
                    rows[0].us + rows[1].us + rows[3].us},
                   copyGBs);
        cu::destroy(bt);
        cu::destroy(ot);
        CHECK(cudaFree(p));
        CHECK(cudaFree(qt));
      }
    }
  }
  CHECK(cudaDeviceSynchronize());
  cudaFree(g);
  cudaFree(out);
  cudaFree(e);
  cudaFree(bad);
  cublasDestroy(blas);
  return 0;
}
