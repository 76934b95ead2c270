// The harness's kernel configs (bench/attention/attn_proto.cu), split into groups so that the
// build compiles them in parallel: nvcc -DCONFIG_GROUP=g attn_configs.cu defines
// runners_group_g() with group g's configs. attn_proto.cu (without TJ_SPLIT_BUILD) includes
// this file once with every group.
#include "attn_common.h"

#ifndef CONFIG_GROUP
#define CONFIG_GROUP -1
#endif
#define TJ_GROUP(g) (CONFIG_GROUP < 0 || CONFIG_GROUP == (g))
#define TJ_CAT2(a, b) a##b
#define TJ_CAT(a, b) TJ_CAT2(a, b)
#if CONFIG_GROUP < 0
#define TJ_GROUP_FN runners_all
#else
#define TJ_GROUP_FN TJ_CAT(runners_group_, CONFIG_GROUP)
#endif

// Configs come in causal / non-causal pairs. Naming: <in>_d<D>_bn<BN>_s<stages>[_c3][_ws][_seq][_perm]
//   c3 / c1: 3 / 1 consumer warpgroups (BM 192 / 64; else 2, BM 128), ws: inter-warpgroup schedule (named
//   barriers), seq: no intra-warpgroup overlap, perm: Vt's keys permuted in shared memory (shuffle-free P)
#define E4 WG_E4M3
#define OB ATTN_OUT_BF16
#define RUN2(v, NAME, D, BN, ST, NC, IN, OUT, OVL, WS, PERM)                                   \
  v.push_back(make_runner<AttnCfg<D, BN, ST, NC, IN, OUT, false, OVL, WS, PERM>>(NAME));        \
  v.push_back(make_runner<AttnCfg<D, BN, ST, NC, IN, OUT, true, OVL, WS, PERM>>(NAME "_causal"))

std::vector<Runner> TJ_GROUP_FN() {
  std::vector<Runner> v;
#if TJ_GROUP(0)
  RUN2(v, "e4m3_d128_bn128_s2", 128, 128, 2, 2, E4, OB, true, false, false);
  RUN2(v, "e4m3_d128_bn128_s2_ws", 128, 128, 2, 2, E4, OB, true, true, false);
#endif
#if TJ_GROUP(1)
  RUN2(v, "e4m3_d128_bn128_s2_seq", 128, 128, 2, 2, E4, OB, false, false, false);
  RUN2(v, "e4m3_d128_bn128_s2_perm", 128, 128, 2, 2, E4, OB, true, false, true);
  RUN2(v, "e4m3_d128_bn64_s2_c1", 128, 64, 2, 1, E4, OB, true, false, false);   // the DSL default config
#endif
#if TJ_GROUP(2)
  RUN2(v, "e4m3_d128_bn192_s2", 128, 192, 2, 2, E4, OB, true, false, false);
  RUN2(v, "e4m3_d128_bn128_s3_ws", 128, 128, 3, 2, E4, OB, true, true, false);
#endif
#if TJ_GROUP(3)
  RUN2(v, "e4m3_d64_bn128_s2", 64, 128, 2, 2, E4, OB, true, false, false);
  RUN2(v, "e4m3_d64_bn256_s2", 64, 256, 2, 2, E4, OB, true, false, false);
  RUN2(v, "e4m3_d64_bn128_s2_c3", 64, 128, 2, 3, E4, OB, true, false, false);
#endif
#if TJ_GROUP(4)
  RUN2(v, "e4m3_d256_bn128_s2", 256, 128, 2, 2, E4, OB, true, false, false);
  RUN2(v, "e4m3_d256_bn64_s2", 256, 64, 2, 2, E4, OB, true, false, false);
  v.push_back(make_runner<AttnCfg<128, 128, 2, 2, E4, ATTN_OUT_E4M3, false, true, false, false>>(
      "e4m3_d128_bn128_s2_outfp8"));
#endif
#if TJ_GROUP(5)
  RUN2(v, "bf16_d128_bn128_s2", 128, 128, 2, 2, WG_BF16, OB, true, false, false);
  RUN2(v, "bf16_d64_bn128_s2", 64, 128, 2, 2, WG_BF16, OB, true, false, false);
  RUN2(v, "bf16_d256_bn64_s2", 256, 64, 2, 2, WG_BF16, OB, true, false, false);
  RUN2(v, "bf16_d128_bn128_s2_ws", 128, 128, 2, 2, WG_BF16, OB, true, true, false);
  RUN2(v, "bf16_d128_bn64_s2_c1", 128, 64, 2, 1, WG_BF16, OB, true, false, false);
  v.push_back(make_runner<AttnCfg<128, 128, 2, 2, WG_F16, ATTN_OUT_F16, false, true, false, false>>(
      "f16_d128_bn128_s2"));
#endif
  return v;
}
