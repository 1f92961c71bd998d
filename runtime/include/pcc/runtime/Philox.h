//===- Philox.h - the counter-based random numbers of dropout ---*- C++ -*-===//
//
// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011): a keyed bijection of 128-bit counters, so any element's
// random number is computed on its own, on the CPU or the GPU, in any order,
// and the backward pass draws again exactly the mask the forward pass drew
// instead of saving it.
//
// Dropout's numbers: key = the run's seed (64 bits); counter = (element
// index / 4, micro-batch, the op's stream, step); each call gives four
// uniforms, one per element of a group of four.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_PHILOX_H
#define PCC_RUNTIME_PHILOX_H

#include <cstdint>

#ifdef __CUDACC__
#define PCC_PHILOX_HD __host__ __device__
#else
#define PCC_PHILOX_HD
#endif

namespace pccrt {

struct Philox4 {
  uint32_t v[4];
};

PCC_PHILOX_HD inline void philoxMul(uint32_t a, uint32_t b, uint32_t &hi,
                                    uint32_t &lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

/// Ten rounds of Philox-4x32 on `counter` under `key`.
PCC_PHILOX_HD inline Philox4 philox4x32(Philox4 counter, uint32_t key0,
                                        uint32_t key1) {
  const uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  const uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philoxMul(m0, counter.v[0], hi0, lo0);
    philoxMul(m1, counter.v[2], hi1, lo1);
    Philox4 next;
    next.v[0] = hi1 ^ counter.v[1] ^ key0;
    next.v[1] = lo1;
    next.v[2] = hi0 ^ counter.v[3] ^ key1;
    next.v[3] = lo0;
    counter = next;
    key0 += w0;
    key1 += w1;
  }
  return counter;
}

/// A uniform float in [0, 1) from 24 random bits (exact in float).
PCC_PHILOX_HD inline float uniformFromBits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

/// The four uniforms of group `group` (elements 4 group .. 4 group + 3) of a
/// dropout op.
PCC_PHILOX_HD inline Philox4 dropoutBits(uint64_t seed, uint64_t group,
                                         uint32_t microbatch, uint32_t stream,
                                         uint32_t step) {
  Philox4 counter{{static_cast<uint32_t>(group), microbatch, stream, step}};
  // Groups beyond 2^32 (tensors over 16 Gi elements) fold their high bits
  // into the micro-batch word.
  counter.v[1] ^= static_cast<uint32_t>(group >> 32) << 16;
  return philox4x32(counter, static_cast<uint32_t>(seed),
                    static_cast<uint32_t>(seed >> 32));
}

} // namespace pccrt

#endif // PCC_RUNTIME_PHILOX_H
