// The fp32 products of a GPT-2 124M training step (batch 4 x 128) through
// OpenBLAS (the OpenMP build pcc links) and oneDNN's sgemm, row-major,
// alternating call by call, best of 5 after a warm-up each (one call per
// timing, so the smallest shapes are dominated by the clock's resolution:
// see the threshold's numbers in pcc_cpu_matmul_f32); then whether
// each library gives a product's rows the same bits when the rows come in
// two halves and from run to run (what the layouts' bitwise comparisons rely
// on). The numbers that chose oneDNN for pcc_cpu_matmul_f32 are in
// docs/design-notes.md; the step-level comparison is PCC_CPU_SGEMM=openblas
// against the default with bench/mixed_precision.py or pcc-run --profile.
//
//   g++ -O2 bench/gemm_libraries.cpp -o /tmp/gemm_libraries \
//       /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0 -ldnnl \
//       -fopenmp -I/usr/include/x86_64-linux-gnu/openblas-openmp
//   env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=2 /tmp/gemm_libraries

#include <cblas.h>
#include <dnnl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

struct Shape {
  const char *what;
  char ta, tb;
  long m, n, k;
};

void gemm(int library, const Shape &s, const float *a, const float *b, float *c,
          long m) {
  long lda = s.ta == 'N' ? s.k : s.m, ldb = s.tb == 'N' ? s.n : s.k;
  if (library == 0)
    cblas_sgemm(CblasRowMajor, s.ta == 'N' ? CblasNoTrans : CblasTrans,
                s.tb == 'N' ? CblasNoTrans : CblasTrans, m, s.n, s.k, 1.0f, a,
                lda, b, ldb, 0.0f, c, s.n);
  else
    dnnl_sgemm(s.ta, s.tb, m, s.n, s.k, 1.0f, a, lda, b, ldb, 0.0f, c, s.n);
}

} // namespace

int main() {
  const Shape shapes[] = {
      {"qkv   x[512,768] W[768,2304]", 'N', 'N', 512, 2304, 768},
      {"fc    x[512,768] W[768,3072]", 'N', 'N', 512, 3072, 768},
      {"proj  x[512,3072] W[3072,768]", 'N', 'N', 512, 768, 3072},
      {"fc dX dY[512,3072] W^T", 'N', 'T', 512, 768, 3072},
      {"fc dW X^T[768,512] dY[512,3072]", 'T', 'N', 768, 3072, 512},
      {"head  x[512,768] E^T[768,50257]", 'N', 'T', 512, 50257, 768},
      {"head dW dY^T[50257,512] x[512,768]", 'T', 'N', 50257, 768, 512},
      {"1024^3", 'N', 'N', 1024, 1024, 1024},
      // The smallest products (the bundled 64-wide models, attention per
      // head): below 2^18 multiply-adds OpenBLAS is the faster.
      {"attention 128x128x64", 'N', 'T', 128, 128, 64},
      {"64^3", 'N', 'N', 64, 64, 64},
      {"classifier 16x10x512", 'N', 'T', 16, 10, 512},
  };
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (const Shape &s : shapes) {
    std::vector<float> a(s.m * s.k), b(s.k * s.n), c(s.m * s.n);
    for (float &x : a)
      x = normal(rng);
    for (float &x : b)
      x = normal(rng);
    double flops = 2.0 * s.m * s.n * s.k, best[2] = {1e30, 1e30};
    for (int round = 0; round < 6; ++round)
      for (int library = 0; library < 2; ++library) {
        auto t = std::chrono::steady_clock::now();
        gemm(library, s, a.data(), b.data(), c.data(), s.m);
        double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
                .count();
        if (round > 0 && seconds < best[library])
          best[library] = seconds;
      }
    // Row halves (untransposed left operand only: its rows are contiguous).
    const char *halves[2] = {"-", "-"}, *again[2];
    for (int library = 0; library < 2; ++library) {
      std::vector<float> whole(s.m * s.n), twice(s.m * s.n), split(s.m * s.n);
      gemm(library, s, a.data(), b.data(), whole.data(), s.m);
      gemm(library, s, a.data(), b.data(), twice.data(), s.m);
      again[library] = std::memcmp(whole.data(), twice.data(), 4 * whole.size())
                           ? "DIFFER"
                           : "same";
      if (s.ta != 'N')
        continue;
      long h = s.m / 2;
      gemm(library, s, a.data(), b.data(), split.data(), h);
      gemm(library, s, a.data() + h * s.k, b.data(), split.data() + h * s.n,
           s.m - h);
      halves[library] =
          std::memcmp(whole.data(), split.data(), 4 * whole.size()) ? "DIFFER"
                                                                    : "same";
    }
    std::printf("%-36s openblas %6.1f  onednn %6.1f GFLOP/s   rerun %s/%s, "
                "row halves %s/%s\n",
                s.what, flops / best[0] / 1e9, flops / best[1] / 1e9, again[0],
                again[1], halves[0], halves[1]);
  }
}
