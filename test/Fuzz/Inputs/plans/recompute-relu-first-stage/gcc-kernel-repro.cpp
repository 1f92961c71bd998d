#include <cstdint>
#include <cstdio>
#if defined(__x86_64__) && defined(__GNUC__)
#define PCC_KERNEL __attribute__((target_clones("arch=x86-64-v3", "default"))) static
#else
#define PCC_KERNEL static
#endif


// Training phase 2 (@stage0_weight_grad)

// CPU


PCC_KERNEL void k0(const float *__restrict x0, const float *__restrict x1, const float *__restrict x2, float *__restrict y0) {
  for (int64_t o = 0; o < 8; ++o)
  for (int64_t j = 0; j < 3; ++j) {
    const int64_t i = o * 3 + j;
    const float t0 = (x1[i] + x0[j]);
    const float t1 = (t0 > static_cast<float>(0) ? t0 : static_cast<float>(0));
    const uint8_t t2 = static_cast<uint8_t>(t1 > 0.000000000e+00f);
    const float t3 = (t2 ? x2[i] : 0.000000000e+00f);
    y0[i] = t3;
  }
}

PCC_KERNEL void k1(float *__restrict y, const float *__restrict x) {
  for (int64_t i = 0; i < 3; ++i)
    y[i] += x[i];
}

PCC_KERNEL void k2(float *__restrict y, const float *__restrict x) {
  for (int64_t i = 0; i < 24; ++i)
    y[i] += x[i];
}


int main(){
  float b[3]={0.152552f,0.003544f,0.0436344f};
  float s0[24]={1.59811f,1.4454f,-0.376512f,1.4454f,4.31231f,-0.277882f,-0.376512f,-0.277882f,1.53373f,0.752088f,1.62783f,-0.183241f,1.58414f,1.41136f,-0.206216f,0.653415f,-1.5446f,-0.246895f,-0.862677f,0.17317f,1.58431f,-0.707877f,-0.287071f,-0.563674f};
  float g[24]={0.0f,0.0f,0.0f,0.0f,0.0f,0.0f,-0.007699f,-0.00460318f,0.0222322f,0.0f,0.0f,0.0f,0.0f,0.0f,0.0f,0.000401847f,-0.00068226f,0.000148377f,-0.00773212f,-0.00462288f,0.0223279f,-0.00437391f,-0.00307777f,0.0120317f};
  float y[24];
  k0(b,s0,g,y);
  float sum[3]={0,0,0};
  for(int o=0;o<8;++o) for(int j=0;j<3;++j) sum[j]+=y[o*3+j];
  printf("%g %g %g\n", sum[0],sum[1],sum[2]);
}
