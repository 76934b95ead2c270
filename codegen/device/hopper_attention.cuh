#pragma once
// tilejit device library: flash-attention forward main loop for sm_90a (FP8 e4m3 and 16-bit),
// built from the hopper.cuh building blocks. This is what the attention lowering
// (codegen/lower_attention_sm90.cpp) instantiates for the DSL kernel kernels/attention_fp8.cpp,
// and what bench/attention/attn_proto.cu runs directly.
//
//   O[b,h,i,:] = sum_j softmax_j(q_i . k_j * softmax_scale) v_j   (online softmax in exp2)
//
// Inputs (all loaded by TMA into 128B/64B-swizzled shared memory, 4-D tensor maps with the
// per-head sequence as its own dimension so that tails are zero-filled per head, and batch and
// head as two, so that any strides the copy engine takes work -- [B, S, H, D] storage seen as
// [B, H, S, D], a packed QKV's slices -- without a copy):
//   Q  [B, H,   Sq,  D]  K-major           map dims {D, Sq, H, B},    box {W/es, BM, 1, 1}
//   K  [B, Hkv, Skv, D]  K-major           map dims {D, Skv, Hkv, B}, box {W/es, BN, 1, 1}
//   fp8: Vt [B, Hkv, D, Skv_pad] (V transposed: FP8 wgmma needs both operands K-major)
//                                          map dims {Skv, D, Hkv, B}, box {Wv, D, 1, 1}
//   16-bit: V [B, Hkv, Skv, D] natural (MN-major B operand, wgmma transpose bit)
//                                          map dims {D, Skv, Hkv, B}, box {64, BN, 1, 1}
// (W = min(D bytes, 128) for Q/K; Wv = 128, 64 or 32: the widest dividing BN; es = element bytes.)
//
// Scaling (FlashAttention-3's FP8 recipe): descales per (batch, head) -- Q's per query head, K's and
// V's per kv head -- as f32 arrays with strides (0, 0 = per-tensor broadcast; nullptr = 1). The score scale is one constant
// c = (score_scale * q_descale) * k_descale (score_scale = softmax scale * log2 e) applied to
// the raw e4m3 dot product; P = exp2(s*c - (m - 8)) lies in [0, 256] (the fixed power-of-two
// offset puts it in e4m3's range with full relative precision) and is quantized to e4m3 for the
// P.V wgmma; O is divided by the row sums l of that e4m3 P (P.1 on the tensor cores,
// kRowSumMma) or, in kernels that write the LSE, of the f32 P (FADDs), so the offset cancels in
// O = acc / l; the V descale is folded into that final normalization. 16-bit inputs use offset
// 0 and the f32 P's sums. c < 0 (negative descales) works too; c == 0 is not supported (masked
// scores).
//   LSE (natural log) = (m - offset + log2 l) * ln 2; rows without any key: O = 0, LSE = -inf.
// This is exactly kernels/attention_fp8.cpp's computation (the same ascending key blocks of BN,
// the same running max), so the CPU reference executor reproduces every P quantization.
//
// Preconditions: Q/K/V rows 16-byte aligned (TMA); Vt's pad columns [Skv, map width) finite
// (zeros from the quantize pre-pass: P is 0 there, but 0 * NaN would poison O).
//
// Structure (per CTA: one BM = 64*kConsumers row tile of one (b, h); kConsumers = 1, 2 or 3):
//   warpgroup 0 = producer (setmaxnreg.dec; kLeanProducer: one warp after the consumers instead,
//   no setmaxnreg), one thread issues TMA: Q once, then K_j and V_j
//   for j = 0, 1, ... (ascending, the order of the DSL's tile loop, so the online-softmax
//   running max -- and with it every P quantization -- matches the CPU reference executor
//   block for block) through a kStages ring with separate full/empty mbarriers for K and V.
//   warpgroups 1..kConsumers = consumers, 64 query rows each: S = Q.K^T (SS wgmma, f32 acc),
//   masking only on boundary blocks (KV tail, causal diagonal), online softmax on the
//   accumulator registers (quad shuffles), P -> A fragment in registers, O += P.V (RS wgmma).
//   kOverlap: FA3's intra-warpgroup pipelining -- S_{j} = Q.K_j^T and O += P_{j-1}.V_{j-1}
//   are issued together and the softmax of S_j runs while the P.V wgmma is in flight.
//   kSelfLoad (one consumer, the simple schedule): no producer; the consumer warpgroup's first
//   thread loads the first kStages blocks with Q and each later block's K and V while a P.V runs
//   (its own walk over the blocks, kStages ahead), so that three CTAs of 128 threads share an SM.
//   kWgSync: FA3's inter-warpgroup schedule -- named barriers make the consumers take turns
//   (round robin, 2 or 3 consumers) issuing their GEMMs so one's softmax overlaps the others'
//   tensor-core work.
//   kVPerm (fp8 only): the producer warpgroup's other three warps permute every landed Vt stage
//   in shared memory (the keys inside each 16-byte piece, the order acc_to_a_fp8_kperm gives
//   P's k positions) and signal it on a barrier of their own; the consumers' P conversion is
//   then shuffle-free (FA3's trick; FA3 permutes while it transposes V). Otherwise
//   acc_to_a_fp8 (2 shuffles per 32 keys and row). The inputs and the result are the same.
//   kKeysByParity (fp8 only): the permutation is in K's rows instead: each K stage holds the
//   block's even keys, then its odd keys (TMA with a traversal stride of 2 keys), so S's columns
//   come out in the order P's A fragment needs for the natural V (acc_to_a_fp8_keys_by_parity);
//   the masks and score hooks take each column's key from Cfg::key_offset. No V permutation.
//   kExp2Fma (0-8): of every 8 consecutive score registers a thread holds, this many take their
//   exp2 from exp2_fma() (FMA and integer pipes) instead of ex2.approx (the MUFU): the FP8
//   kernels' softmax needs one MUFU op per score, as many as the tensor cores take for its two
//   dots. (H100: slower at every setting; the softmax is bound by issue and latency,
//   not by the MUFU's throughput. Default 0.) kExp2F16: where P goes to e4m3 straight (keys by
//   parity, no LSE) they run two at a time in f16x2 (exp2_f16x2, about 5 instructions a score
//   instead of 9): softcap, whose tanh shares the MUFU, takes 4 of 8 so (H200).
// Causal masking is top-left aligned (key j visible to query i iff j <= i), like
// torch.nn.functional.scaled_dot_product_attention(is_causal=True).
//
// Launch: grid (ceil(Sq/BM), B*H), block kThreads, dynamic smem kSmemBytes (opt in). The
// m-tile index is the fast grid dimension (CTAs that run together share K/V in L2); causal
// tiles run longest first. attn_fwd_device() is the body for code that computes (bh, m_tile)
// itself (the generated kernels: program id = bh * m_tiles + m_tile). Launched with programmatic
// stream serialization (LaunchOptions::start_early) it starts while the previous kernel ends: it
// reads q, k, v and the descales at once and waits (griddep_wait) only before it reads or writes
// O and the LSE. attn_fwd_persistent() is the body of a persistent launch (knob attn_persistent):
// gridDim.x CTAs, each looping over tiles (AttnPersistentTiles), the stage ring and the barriers'
// phases carried from tile to tile, the next tile's Q loaded once the consumers are done with the
// last one's (q_empty), O staged in shared memory rows of its own (Cfg::kOStageBytes past the rest)
// and stored in 16-byte pieces while the next tile's loads run. (H100: stored from
// registers, the stores stalled on the store queue and it ran as fast as a CTA per tile or slower;
// H200, staged: faster over rows of up to 4096 keys, bf16 by 1-8% (4096 / 1024 keys),
// fp8 64 x 128 by about 1%, the default there for plain attention: kernels/attention_fp8.cpp.)

#include "hopper.cuh"
#include "exp2_fma.cuh"
#include "attn_tile_order.cuh"

namespace tj {
namespace dev {

enum AttnOutType : int { ATTN_OUT_BF16 = 0, ATTN_OUT_F16 = 1, ATTN_OUT_E4M3 = 2 };

struct AttnParams {
  int B, H, Hkv;              // heads; kv head of head h = h / (H / Hkv)
  int Sq, Skv;
  void* O;                    // [B, H, Sq, D], element type per kOut; strides in elements
  long long o_sb, o_sh, o_ss, o_sd;
  float* lse;                 // [B, H, Sq] f32 (natural log) or nullptr; strides in elements
  long long lse_sb, lse_sh, lse_ss;
  const float* q_descale;     // [B, H] f32 with strides (0, 0 broadcasts one value), or
  long long qd_sb, qd_sh;     // nullptr (= 1)
  const float* k_descale;     // [B, Hkv], like v_descale
  long long kd_sb, kd_sh;
  const float* v_descale;
  long long vd_sb, vd_sh;
  float score_scale;          // softmax scale * log2(e): q.k -> log2 units (before descales)
  float o_scale;              // e4m3 output: O is multiplied by this before the cast
  float* o_amax;              // e4m3 output: atomic max of |O| (before o_scale), or nullptr
};

template <int kD_, int kBN_, int kStages_, int kConsumers_, int kIn_, int kOut_, bool kCausal_,
          bool kOverlap_ = true, bool kWgSync_ = false, bool kVPerm_ = false, int kDv_ = kD_, int kExp2Fma_ = 0,
          bool kRescaleVote_ = true, bool kLeanProducer_ = false, bool kKeysByParity_ = false,
          bool kF32RowSums_ = true, bool kExp2F16_ = false, bool kMergeOut_ = false, bool kLseOut_ = false,
          bool kSelfLoad_ = false, bool kBlockTable_ = true>
struct AttnCfg {
  static constexpr int kD = kD_;     // head dim of Q and K (the first dot's K dim)
  static constexpr int kDv = kDv_;   // head dim of V and O
  static constexpr int kBN = kBN_;
  static constexpr int kStages = kStages_;
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kIn = kIn_;
  static constexpr int kOut = kOut_;
  static constexpr bool kCausal = kCausal_;
  static constexpr bool kOverlap = kOverlap_;
  static constexpr bool kWgSync = kWgSync_ && (kConsumers_ == 2 || kConsumers_ == 3);
  static constexpr bool kFp8 = (kIn_ == WG_E4M3 || kIn_ == WG_E5M2);
  static constexpr bool kVPerm = kVPerm_ && kFp8 && !kLeanProducer_ && !kKeysByParity_;
  // fp8: each K stage holds the block's even keys, then its odd keys (two TMA loads with a
  // traversal stride of 2), so that S's accumulator holds every thread's A-fragment keys and P
  // converts without shuffles for the natural key order of V (acc_to_a_fp8_keys_by_parity): no
  // V permutation, no warps for it.
  static constexpr bool kKeysByParity = kKeysByParity_ && kFp8;
  // The key of S accumulator register i of lane quad position q, within its block:
  // key_offset(i) + kKeyLaneStep * q.
  static constexpr int kKeyLaneStep = kKeysByParity ? 4 : 2;
  static constexpr int key_offset(int i) {
    return kKeysByParity ? ((i >> 2) < kBN_ / 16 ? 16 * (i >> 2) : 16 * ((i >> 2) - kBN_ / 16) + 1) + 2 * (i & 1)
                         : 8 * (i >> 2) + (i & 1);
  }
  static constexpr int kExp2Fma = kExp2Fma_;   // of every 8 score exp2s, those on the FMA pipes
  // l sums the f32 P (FADDs): fp8 kernels whose LSE is the scores' (with an LSE, not merging).
  static constexpr bool kF32RowSums = kF32RowSums_;
  // O and the LSE hold a running result that this kernel merges its own into by the two logsumexps
  // (kernels/attention_variant.h: merge_into_output); 16-bit O.
  static constexpr bool kMergeOut = kMergeOut_;
  static constexpr bool kLseOut = kLseOut_;   // the kernel writes an LSE (p.lse)
  // Those exp2s two at a time in f16x2 (exp2_f16x2: about 5 FMA / integer instructions a score
  // instead of exp2_fma's 9), for fp8 kernels whose P goes to e4m3 straight (keys by parity: each
  // pair is the two keys one e4m3x2 of P's A fragment holds) and whose row sums come from the
  // tensor cores (no f32 P to add).
  static constexpr bool kExp2F16 = kExp2F16_ && kExp2Fma_ > 0 && kKeysByParity_ && kFp8 && !kF32RowSums_;
  static constexpr bool kRescaleVote = kRescaleVote_;   // skip O's rescale where a warp's alphas are all 1
  // The producer is one warp after the consumer warpgroups instead of a warpgroup before them: no
  // setmaxnreg (every thread has the launch's registers), no V-permuting warps. With one consumer,
  // 160 threads of 128 registers let three CTAs share an SM (with a producer warpgroup, ptxas
  // sized the consumers' wgmmas by the 80 registers of three 256-thread CTAs: C7602).
  static constexpr bool kLeanProducer = kLeanProducer_;
  // No producer warp at all (with kLeanProducer, one consumer): the consumer warpgroup's first
  // thread issues the K and V loads itself while each block's P.V runs, where its warp would wait
  // on the wgmma anyway. 128 threads a CTA: three CTAs' 12 warps are three a scheduler at up to
  // 168 registers (with the producer warp, two CTAs' 10 warps are already three on two of the four
  // schedulers, and ptxas caps them at 168 too). Not with a persistent schedule.
  static constexpr bool kSelfLoad = kSelfLoad_;
  // The block-class table below is in shared memory (kernels with a mask hook need it; a
  // self-loading kernel without one leaves it out, so that three CTAs fit with an LSE or a merge).
  static constexpr bool kBlockTable = kBlockTable_ || !kSelfLoad_;
  // fp8 without an LSE: O is divided by the sums of the e4m3 P the P.V multiplies
  // (kernels/attention_fp8.cpp), each block's from the tensor cores: P.1 as m64n8 wgmmas beside
  // its P.V (B a tile of ones in shared memory), added in f32 once the P.V is done; the softmax
  // loses an FADD per score. (Accumulated across blocks in the wgmma accumulator instead, the sums
  // came out biased low: at S 8192 the output's error grew by up to half.) With an LSE, O and the
  // LSE share the f32 P's sums (FADDs): the FP8 tensor cores' adds are not exact (against f32
  // sums, up to 3% in rows dominated by a few keys; H200), and the LSE is the scores'.
  // Not with a producer warp for several consumers (no setmaxnreg: D 256 spills there, and its
  // output went wrong under compute-sanitizer's timing in 1 run of 2; H200).
  static constexpr bool kRowSumMma = kFp8 && !kF32RowSums && !(kLeanProducer_ && kConsumers_ > 1);
  static constexpr int kOnesBytes = kRowSumMma ? 256 : 0;   // 8 rows x 32 bytes of K, no swizzle

  static constexpr int kEs = kFp8 ? 1 : 2;                  // bytes per element
  static constexpr int kBM = 64 * kConsumers;
  static constexpr int kThreads = kSelfLoad ? 128 * kConsumers : kLeanProducer ? 128 * kConsumers + 32 : 128 * (kConsumers + 1);
  static constexpr int kProducerWg = kLeanProducer ? kConsumers : 0;   // the producer's warpgroup index
  static constexpr int kDBytes = kD * kEs;
  static constexpr int kWq = kDBytes >= 128 ? 128 : kDBytes;   // Q/K swizzle width (bytes)
  static constexpr int kQkSwizzle = kWq == 128 ? SWIZZLE_128B : SWIZZLE_64B;
  static constexpr int kQkBlocks = kDBytes / kWq;
  // fp8 Vt: the widest swizzle whose blocks tile BN (224 = 7 blocks of 32 bytes)
  static constexpr int kWv = kFp8 ? ((kBN % 128 == 0) ? 128 : (kBN % 64 == 0) ? 64 : 32) : 128;
  static constexpr int kVSwizzle = kWv == 128 ? SWIZZLE_128B : kWv == 64 ? SWIZZLE_64B : SWIZZLE_32B;
  static constexpr int kVBlocks = kFp8 ? kBN / kWv : kDv / 64;
  static constexpr int kQBytes = kBM * kDBytes;
  static constexpr int kKBytes = kBN * kDBytes;                // per stage
  static constexpr int kVBytes = kBN * kDv * kEs;               // per stage
  static constexpr int kKStep = 32 / kEs;                      // K elements per wgmma
  static constexpr int kPRegs = kFp8 ? kBN / 8 : kBN / 4;      // A-fragment registers
  static constexpr float kPOffset = kFp8 ? 8.0f : 0.0f;
  // Lazy rescaling (FlashAttention-4's): a row's running max m moves only when a block's max
  // passes it by more than this (log2 units), so that most blocks leave every alpha at 1 and the
  // warp skips the O rescale. P = exp2(s - (m - offset)) then reaches 2^(offset + slack): 430 in
  // fp8 (e4m3's largest is 448), 256 in 16-bit. kernels/attention_fp8.cpp does the same. (H100:
  // bf16 1-3.5% faster, fp8 up to 2.5%, but fp8 ALiBi at S 8192 1.5-2% slower: its
  // max moves at most blocks anyway, and the compare sits between the row max and the exp2s.)
  static constexpr float kRescaleSlack = kFp8 ? 0.75f : 8.0f;
  // The mask classes of a CTA's key blocks, computed once per CTA by all its threads at once into
  // shared memory (reading bytes instead of waiting on a mask's loads block by block), with a bit
  // per entry (class != 0, one ballot per warp) and from those the list of the entries to visit,
  // which the producer and the consumers walk. Up to kClassTable key blocks an entry is one block;
  // past that an entry spans several (ceil(blocks / kClassTable)), classified as a whole. Nothing
  // is classified after the roles split: with classify() in the loops (blocks past the table, as
  // they came), the producer's 24 registers could not hold a block mask's gather and ptxas
  // spilled at every block (H100).
  // (A self-loading kernel's table holds 128, so that three CTAs with a mask hook fit an SM with an
  // LSE and a merge too: rows of up to 128 key blocks still go block by block.)
  static constexpr int kClassTable = kSelfLoad ? 128 : 512;
  static constexpr int kClassWords = kClassTable / 32;
  static constexpr int kProducerRegs = 24;
  // One consumer: 232 + 24 registers per thread pair = 128 per thread at launch, so that two
  // CTAs fit an SM when their shared memory does (the lowering asks for 2 blocks per SM then).
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : kConsumers == 1 ? 232 : 240;
  // kMergeOut: the running LSE of the CTA's rows, read by the producer for the epilogue
  static constexpr int kOldLseBytes = kMergeOut ? 4 * kBM : 0;
  // fp8 kernels that write an LSE from the e4m3 P's sums: each consumer thread's two running row
  // maxima also go to a static shared array at every block and are read back for the LSE, so that
  // they are not live out of the main loop. (Held in registers, ptxas scheduled that main loop's
  // exp2s worse than the one without an LSE: H200, segments of 2048 keys, 361-363 us against
  // 349-350; 350-353 with the maxima stored so. The same slots in the dynamic shared memory, at an
  // address held in a register, gave both loops the worse schedule: 358-360.)
  static constexpr bool kRowMaxInSmem = kRowSumMma && kLseOut;
  // 1024 alignment slack + Q + stages + the ones tile + barriers (q, 5 per stage) + the
  // block-class table and its bits (visited) and the list of visited blocks + the running LSE
  static constexpr int kBlockTableBytes = kBlockTable ? 3 * kClassTable + 4 * kClassWords : 0;
  static constexpr int kSmemBytes =
      1024 + kQBytes + kStages * (kKBytes + kVBytes) + kOnesBytes + (1 + 5 * kStages) * 8 + kBlockTableBytes +
      kOldLseBytes;
  // O is staged in shared memory so that the epilogue stores whole 16-byte pieces of contiguous rows:
  // kOPitch bytes a row (16 of padding: no bank conflicts; kMergeOut keeps the old O's weight there).
  // A CTA per tile stages in the Q tile and K/V stages (free by then); a persistent launch, whose
  // next tile's Q and blocks are loading by then, in kOStageBytes of its own after kSmemBytes (the
  // launch asks for both; 16-byte aligned).
  static constexpr int kOBytes = kOut == ATTN_OUT_E4M3 ? 1 : 2;
  static constexpr int kOPitch = kDv * kOBytes + 16;
  static constexpr int kOStageBytes = 16 + kBM * kOPitch;

  static_assert(kD == 64 || kD == 128 || kD == 256, "Q/K head dim must be 64, 128 or 256");
  static_assert(kDv == 64 || kDv == 128 || kDv == 256, "V head dim must be 64, 128 or 256");
  static_assert(kConsumers >= 1 && kConsumers <= 3, "1, 2 or 3 consumer warpgroups");
  static_assert(kExp2Fma >= 0 && kExp2Fma <= 8, "kExp2Fma counts exp2s of every 8: 0..8");
  static_assert(kIn == WG_E4M3 || kIn == WG_BF16 || kIn == WG_F16, "input type");
  static_assert(kBN % 32 == 0 && kBN >= 64 && kBN <= 256, "BN: multiple of 32 in [64, 256]");
  static_assert(kFp8 || kBN % 16 == 0, "16-bit: BN must be a multiple of 16");
  static_assert(kSmemBytes <= 232448, "shared memory exceeds 227 KB");
  static_assert(kStages >= 1 && kStages <= 8, "stages");
  static_assert(!kMergeOut || kOut != ATTN_OUT_E4M3, "merging into O: a 16-bit O");
  static_assert(!kSelfLoad || (kLeanProducer && kConsumers == 1 && !kOverlap && kStages >= 2),
                "kSelfLoad: one consumer warpgroup, no setmaxnreg, the simple schedule, two stages or more (a "
                "block's V loads while the block before it runs its P.V)");
};

// User code spliced into the main loop (attention variants: kernels/attention_variant.h). The
// sm_90a lowering generates a struct like this from the kernel's score_mod / mask_mod ops;
// NoHooks is the plain kernel.
//   score(s, q, kv, qf, kvf): the modified score, both in natural-log units (s = q.k * descales *
//     scale * ln 2); qf, kvf = q, kv as floats (exact below 2^24), formed without a conversion
//     per element: a hook's int -> float casts of position arithmetic use them
//   keep(q, kv): whether key kv stays visible to query q
//   classify(q_lo, q_hi, kv_lo, kv_hi): what keep() is over that box of positions (interval
//     arithmetic over the mask's ops): 0 never kept (the block is skipped: not loaded, not
//     computed), 1 always kept (no per-element mask), 2 either (mask per element).
//   score_in_factor(), score_out_factor(): the user's score is score(s * in, ...) * out; the main
//     loop folds both into its scales (softcap's 1 / cap and cap).
//   linear_score(d, a, b, g) (kLinearScore): score(s, q, kv) = d s + a kv + b q + g with d, a, b,
//     g the same over the CTA; the main loop then forms the key term once per key column and
//     block and the query term once per row, and score() is not called.
//   kSkipBlocks = false evaluates keep() on every element of every block (block skipping off).
//   causal_prefix(): with a causal Cfg, keys below it are visible to every query too (prefix-LM's
//     kv <= q || kv < prefix): row q's last key is max(q, prefix - 1). 0 for no prefix.
//   kKeepGathers: keep() reads a tensor per element (a gather); the kernel evaluates it in a
//     rolled loop.
struct NoHooks {
  static constexpr bool kScoreMod = false;
  static constexpr bool kMask = false;
  static constexpr bool kSkipBlocks = false;
  static constexpr bool kKeepGathers = false;
  static constexpr bool kLinearScore = false;
  __device__ __forceinline__ float score(float s, int, int, float, float) const { return s; }
  __device__ __forceinline__ float score_in_factor() const { return 1.0f; }
  __device__ __forceinline__ float score_out_factor() const { return 1.0f; }
  __device__ __forceinline__ void linear_score(float& d, float& a, float& b, float& g) const {
    d = 1.0f;
    a = b = g = 0.0f;
  }
  __device__ __forceinline__ bool keep(int, int) const { return true; }
  __device__ __forceinline__ int classify(int, int, int, int) const { return 1; }
  __device__ __forceinline__ int causal_prefix() const { return 0; }
};

namespace attn_detail {

template <bool kValue>
struct Flag {   // a compile-time choice passed to a generic lambda
  static constexpr bool value = kValue;
};

__device__ __forceinline__ float neg_inf() { return __int_as_float((int)0xff800000u); }
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

#if TJ_SM90_ENABLED
// Named barriers 1.. (0 is __syncthreads): `count` threads (multiple of 32) take part. Ids 1..3:
// the kWgSync schedule's; kConsumersBar: all consumer warpgroups; kOldLseBar + c: consumer c
// waits on the producer's first warp for the running LSE (kMergeOut; each on its own, so that the
// consumers do not wait for each other before their old O's loads).
constexpr int kConsumersBar = 4;
constexpr int kOldLseBar = 5;
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}
#endif

// m[h] = min(m[h], min of accumulator row h), quad-reduced (acc_row_max's twin).
template <int N>
__device__ __forceinline__ void acc_row_min(const float* d, float* m) {
  float a = m[0], b = m[1];
#pragma unroll
  for (int i = 0; i < N / 2; i += 4) {
    a = fminf(a, fminf(d[i], d[i + 1]));
    b = fminf(b, fminf(d[i + 2], d[i + 3]));
  }
  a = fminf(a, __shfl_xor_sync(0xffffffffu, a, 1));
  a = fminf(a, __shfl_xor_sync(0xffffffffu, a, 2));
  b = fminf(b, __shfl_xor_sync(0xffffffffu, b, 1));
  b = fminf(b, __shfl_xor_sync(0xffffffffu, b, 2));
  m[0] = a;
  m[1] = b;
}

#if TJ_SM90_ENABLED
// One arrive per consumer warp (lane 0), after this warp's wgmmas that read the stage are done.
__device__ __forceinline__ void release(unsigned long long* bar) {
  if ((threadIdx.x & 31u) == 0u) mbar_arrive(bar);
}
#endif

// A 16-bit O element (bf16 or f16 by the Cfg) and back, two at a time.
template <class Cfg>
__device__ __forceinline__ float out16_to_f32(unsigned short h) {
  return Cfg::kOut == ATTN_OUT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}
template <class Cfg>
__device__ __forceinline__ unsigned f32x2_to_out16x2(float lo, float hi) {
  return Cfg::kOut == ATTN_OUT_BF16 ? f32x2_to_bf16x2(lo, hi) : f32x2_to_f16x2(lo, hi);
}

// 16-bit O[row, col] and O[row, col + 1] (col even) as floats; `row_ptr` points at O[row, 0].
template <class Cfg>
__device__ __forceinline__ void load_out_pair(const AttnParams& p, const char* row_ptr, int col, float& v0,
                                              float& v1) {
  const unsigned short* o = reinterpret_cast<const unsigned short*>(row_ptr);
  const long long e0 = (long long)col * p.o_sd, e1 = e0 + p.o_sd;
  v0 = out16_to_f32<Cfg>(o[e0]);
  v1 = out16_to_f32<Cfg>(o[e1]);
}

// 16-bit O[row, col] and O[row, col + 1] (col even) as they are, the first in the low half.
template <class Cfg>
__device__ __forceinline__ unsigned load_out16x2(const AttnParams& p, const char* row_ptr, int col) {
  if (p.o_sd == 1 && (reinterpret_cast<unsigned long long>(row_ptr) & 3ull) == 0ull)
    return *reinterpret_cast<const unsigned*>(row_ptr + 2 * col);
  const unsigned short* o = reinterpret_cast<const unsigned short*>(row_ptr);
  const long long e0 = (long long)col * p.o_sd;
  return (unsigned)o[e0] | ((unsigned)o[e0 + p.o_sd] << 16);
}

// Eight 16-bit values: piece + w * old, rounded once more.
template <class Cfg>
__device__ __forceinline__ uint4 add_scaled_out(uint4 piece, uint4 old, float w) {
  unsigned* a = reinterpret_cast<unsigned*>(&piece);
  const unsigned* b = reinterpret_cast<const unsigned*>(&old);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float lo =
        fmaf(w, out16_to_f32<Cfg>((unsigned short)(b[i] & 0xffffu)), out16_to_f32<Cfg>((unsigned short)(a[i] & 0xffffu)));
    const float hi = fmaf(w, out16_to_f32<Cfg>((unsigned short)(b[i] >> 16)), out16_to_f32<Cfg>((unsigned short)(a[i] >> 16)));
    a[i] = f32x2_to_out16x2<Cfg>(lo, hi);
  }
  return piece;
}

// Stores O[row, col] and O[row, col + 1] (col even); `row_ptr` points at O[row, 0].
template <class Cfg>
__device__ __forceinline__ void store_out_pair(const AttnParams& p, char* row_ptr, int col,
                                               float v0, float v1) {
  // Pairs as one 4-byte (16-bit O) or 2-byte (e4m3) store where O's rows allow it: a view of O may
  // start at any element.
  constexpr unsigned kPairBytes = Cfg::kOut == ATTN_OUT_E4M3 ? 2u : 4u;
  if (p.o_sd == 1 && (reinterpret_cast<unsigned long long>(row_ptr) & (kPairBytes - 1u)) == 0u) {
    if (Cfg::kOut != ATTN_OUT_E4M3) {
      *reinterpret_cast<unsigned*>(row_ptr + 2 * col) = f32x2_to_out16x2<Cfg>(v0, v1);
    } else {
      *reinterpret_cast<unsigned short*>(row_ptr + col) =
          f32x2_to_e4m3x2(v0 * p.o_scale, v1 * p.o_scale);
    }
  } else {   // strided last dim (rare): element stores
    const long long e0 = (long long)col * p.o_sd, e1 = e0 + p.o_sd;
    if (Cfg::kOut == ATTN_OUT_BF16) {
      reinterpret_cast<unsigned short*>(row_ptr)[e0] = f32_to_bf16(v0);
      reinterpret_cast<unsigned short*>(row_ptr)[e1] = f32_to_bf16(v1);
    } else if (Cfg::kOut == ATTN_OUT_F16) {
      reinterpret_cast<unsigned short*>(row_ptr)[e0] = f32_to_f16(v0);
      reinterpret_cast<unsigned short*>(row_ptr)[e1] = f32_to_f16(v1);
    } else {
      reinterpret_cast<unsigned char*>(row_ptr)[e0] = f32_to_e4m3(v0 * p.o_scale);
      reinterpret_cast<unsigned char*>(row_ptr)[e1] = f32_to_e4m3(v1 * p.o_scale);
    }
  }
}

// A walk over the key blocks a CTA computes (hopper_attention's visit_list: entry e * 4 + class
// covers blocks [e * span, (e + 1) * span)); j is the current block, n_blocks once past the last.
template <bool kMask, bool kSkipBlocks>
struct BlockWalk {
  const unsigned short* list;
  int n_listed, span, n_blocks;
  int j = -1;
  int next_entry = 0;   // the next list entry
  int entry_end = 0;    // the current entry's blocks end here
  int entry_cls = 0;
  // Moves to the next block; returns it and sets its class.
  __device__ __forceinline__ int next(int& cls) {
    if constexpr (!kMask) {
      cls = 1;
      return ++j;
    } else if constexpr (!kSkipBlocks) {
      cls = 2;
      return ++j;
    } else {
      if (j + 1 < entry_end) {   // the entry spans several blocks
        cls = entry_cls;
        return ++j;
      }
      if (next_entry >= n_listed) {
        cls = 0;
        return j = n_blocks;
      }
      const int e = list[next_entry++];
      j = (e >> 2) * span;
      entry_end = min(j + span, n_blocks);
      entry_cls = e & 3;
      cls = entry_cls;
      return j;
    }
  }
};

// A position in the S-stage ring of shared-memory buffers: the stage and the parity of its
// mbarriers' phase. Advanced one block at a time (the stage and phase were t % S and (t / S) & 1
// of a signed block count: about 20 uniform instructions per consumer step in SASS, for two
// counters, where this takes a compare and two selects).
template <int S>
struct RingCursor {
  int stage = 0;
  unsigned phase = 0u;
  __device__ __forceinline__ void advance() {
    if (++stage == S) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace attn_detail

#if TJ_SM90A_ENABLED

// Which query tiles a CTA computes, in order: first(), then next() until it returns false.
// One tile: the launch has a CTA per tile.
struct AttnOneTile {
  static constexpr bool kPersistent = false;
  AttnTile tile;
  __device__ __forceinline__ AttnTile first() const { return tile; }
  __device__ __forceinline__ bool next(AttnTile&) const { return false; }
};
// A persistent launch (fewer CTAs than tiles, as many as fit the GPU at once): programs
// blockIdx.x, blockIdx.x + gridDim.x, ... in attn_tile_natural's order, so the tiles that run
// together are consecutive ones of the same heads (their K and V shared in L2). Each CTA loads its
// next tile's Q and first key blocks while it finishes the last one, and pays its start once.
struct AttnPersistentTiles {
  static constexpr bool kPersistent = true;
  unsigned programs, m_tiles;
  unsigned pid = 0u;
  __device__ __forceinline__ AttnTile first() {
    pid = blockIdx.x;
    return attn_tile_natural(pid, m_tiles);
  }
  __device__ __forceinline__ bool next(AttnTile& t) {
    pid += gridDim.x;
    if (pid >= programs) return false;
    t = attn_tile_natural(pid, m_tiles);
    return true;
  }
};

// The CTA body over the tiles `tiles` gives: query tile m_tile (rows m_tile*BM ...) of head
// bh = b*H + h. A persistent schedule needs a kernel without a mask or score hook (the generated
// kernel sets the hooks up for its one tile, and the block table would need the whole CTA at every
// tile), and it stages O in rows of its own (the rest holds the next tile's Q and blocks by then).
template <class Cfg, class Hooks, class Tiles>
__device__ __forceinline__ void attn_fwd_tiles(const TmaDescriptor* tma_q,
                                               const TmaDescriptor* tma_k,
                                               const TmaDescriptor* tma_v,
                                               const AttnParams& p, Tiles tiles,
                                               const Hooks& hooks) {
  static_assert(!Tiles::kPersistent || (!Hooks::kMask && !Hooks::kScoreMod),
                "a persistent attention kernel takes no mask or score hook");
  static_assert(!Cfg::kSelfLoad || !Tiles::kPersistent, "a self-loading attention kernel takes one tile a CTA");
  static_assert(Cfg::kBlockTable || !Hooks::kMask, "a mask hook needs the block-class table");
  constexpr int S = Cfg::kStages;
  constexpr int BN = Cfg::kBN;
  constexpr int BM = Cfg::kBM;
  constexpr int D = Cfg::kDv;   // V / O columns (Q/K use kDBytes)
  constexpr int WQ = Cfg::kWq;
  constexpr int TY = Cfg::kIn;

  extern __shared__ unsigned char smem_raw[];
  const unsigned raw_addr = smem_u32(smem_raw);
  unsigned char* smem = smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
  unsigned char* sQ = smem;                                     // [kQkBlocks][BM][WQ]
  // persistent: O's staging rows (Cfg::kOStageBytes), past the rest of the layout
  unsigned char* sOStage = smem + ((Cfg::kSmemBytes - 1024 + 15) & ~15);
  unsigned char* sK = sQ + Cfg::kQBytes;                        // [S][kQkBlocks][BN][WQ]
  unsigned char* sV = sK + S * Cfg::kKBytes;                    // [S][...]
  unsigned char* sOnes = sV + S * Cfg::kVBytes;                 // kRowSumMma: [8][32 bytes] of ones
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(sOnes + Cfg::kOnesBytes);
  unsigned long long* q_bar = bars;
  unsigned long long* full_k = bars + 1;
  unsigned long long* full_v = full_k + S;
  unsigned long long* empty_k = full_v + S;
  unsigned long long* empty_v = empty_k + S;
  unsigned long long* vperm_done = empty_v + S;   // kVPerm: stage permuted by the producer's warps 1-3
  // The barrier that says a V stage may be read by the P.V wgmma.
  unsigned long long* v_ready = Cfg::kVPerm ? vperm_done : full_v;
  // Persistent: every consumer warp is done reading the tile's Q (one arrive each), so the
  // producer may load the next tile's. (Static, outside the dynamic layout the lowering sizes.)
  __shared__ unsigned long long q_empty_slot;
  unsigned long long* q_empty = &q_empty_slot;

  // keys this tile needs: [0, n_end); a causal mask's rows see [0, max(q, prefix - 1)]. (Without a
  // prefix the maxes below take -1: the same bounds, and ptxas then formed the causal kernels'
  // boundary test in uniform registers. H200, fp8 causal S 8192 (192 x 96): 893-932
  // TFLOP/s in 4 alternations against 863-904 with the maxes folded away at compile time.)
  const int prefix_last = Cfg::kCausal ? hooks.causal_prefix() - 1 : -1;
  auto with_prefix = [prefix_last](int last) { return max(last, prefix_last); };
  // The tile's head, rows and key blocks (set again at every tile of a persistent schedule)
  AttnTile tile = tiles.first();
  int bh, b, h, hk, m0, n_blocks, m_last, span, entries;
  auto set_tile = [&](const AttnTile& t) {
    bh = t.bh;
    b = bh / p.H;
    h = bh - b * p.H;
    hk = h / (p.H / p.Hkv);
    m0 = t.m_tile * BM;
    const int causal_end = max(m0 + BM, prefix_last + 1);
    const int n_end = (Cfg::kCausal && causal_end < p.Skv) ? causal_end : p.Skv;
    n_blocks = n_end > 0 ? (n_end + BN - 1) / BN : 0;
    // What the mask hook makes of key block j for this CTA's rows (NoHooks: 1, all kept). The
    // producer and the consumers walk the same blocks: the ones not classified 0.
    m_last = (m0 + BM < p.Sq ? m0 + BM : p.Sq) - 1;
    span = n_blocks > Cfg::kClassTable ? (n_blocks + Cfg::kClassTable - 1) / Cfg::kClassTable : 1;
    entries = (n_blocks + span - 1) / span;
  };
  set_tile(tile);
  // Moves to the CTA's next tile, if any (each role's tile loop ends with it; one tile: none).
  auto next_tile = [&]() {
    if constexpr (!Tiles::kPersistent) {
      return false;
    } else {
      if (!tiles.next(tile)) return false;
      set_tile(tile);
      return true;
    }
  };
  unsigned char* class_table = reinterpret_cast<unsigned char*>(vperm_done + S);   // [kClassTable]
  // Entry e of the table: key blocks [e * span, (e + 1) * span) (the last one ends at n_blocks).
  // visit_bits[w] bit i: entry 32 w + i is not classified 0; visit_list[u]: the u-th such entry
  // e and its class, as e * 4 + class.
  unsigned* visit_bits = reinterpret_cast<unsigned*>(class_table + Cfg::kClassTable);
  unsigned short* visit_list = reinterpret_cast<unsigned short*>(visit_bits + Cfg::kClassWords);
  // kMergeOut: the running LSE of rows m0.. (from the producer warp)
  float* old_lse_rows = reinterpret_cast<float*>(class_table + Cfg::kBlockTableBytes);
  int n_listed = 0;   // entries in visit_list

  // The blocks to compute, in ascending order: a walk over visit_list (each thread that walks them
  // has its own) from first_block to n_blocks; `cls` is the block's class (1: no per-element mask
  // hook, 2: keep() on every element).
  auto first_block = [&](int& cls) {
    attn_detail::BlockWalk<Hooks::kMask, Hooks::kSkipBlocks> w{visit_list, n_listed, span, n_blocks};
    w.j = -1;
    w.next(cls);
    return w;
  };

  // Key block j's K / V into stage s, once the stage is free (the producer's loads; kSelfLoad: the
  // consumer warpgroup's first thread's).
  auto load_k = [&](int j, int s) {
    const int n0 = j * BN;
    mbar_arrive_expect_tx(&full_k[s], (unsigned)Cfg::kKBytes);
    unsigned char* k_dst = sK + s * Cfg::kKBytes;
#pragma unroll
    for (int blk = 0; blk < Cfg::kQkBlocks; ++blk) {
      tma_load_4d(k_dst + blk * BN * WQ, tma_k, &full_k[s], blk * (WQ / Cfg::kEs), n0, hk, b);
      if constexpr (Cfg::kKeysByParity)   // the map steps 2 keys: the even ones above, the odd ones here
        tma_load_4d(k_dst + blk * BN * WQ + (BN / 2) * WQ, tma_k, &full_k[s], blk * (WQ / Cfg::kEs), n0 + 1, hk, b);
    }
  };
  auto load_v = [&](int j, int s) {
    const int n0 = j * BN;
    mbar_arrive_expect_tx(&full_v[s], (unsigned)Cfg::kVBytes);
    unsigned char* v_dst = sV + s * Cfg::kVBytes;
    if constexpr (Cfg::kFp8) {
#pragma unroll
      for (int blk = 0; blk < Cfg::kVBlocks; ++blk)
        tma_load_4d(v_dst + blk * D * Cfg::kWv, tma_v, &full_v[s], n0 + blk * Cfg::kWv, 0, hk, b);
    } else {
#pragma unroll
      for (int blk = 0; blk < Cfg::kVBlocks; ++blk)
        tma_load_4d(v_dst + blk * BN * 128, tma_v, &full_v[s], blk * 64, n0, hk, b);
    }
  };

  // kSelfLoad: thread 0's walk over the blocks to load, S blocks ahead of the consumers' (the next
  // K to load), and the block whose V loads next (n_blocks: none).
  int ahead_cls = 0;
  auto ahead = first_block(ahead_cls);
  int v_next = n_blocks;
  // The first S blocks into the empty stages (thread 0; the main loop loads the rest).
  auto load_first_blocks = [&]() {
    ahead = first_block(ahead_cls);
#pragma unroll 1
    for (int st = 0; st < S && ahead.j < n_blocks; ++st, ahead.next(ahead_cls)) {
      load_k(ahead.j, st);
      load_v(ahead.j, st);
    }
  };

  // The next kernel on the stream may start once every CTA is here (if launched to start early):
  // it waits for this one before it touches what this one writes (griddep_wait).
  griddep_launch_dependents();
  const int wg = warpgroup_idx();
  if (threadIdx.x == 0) {
    mbar_init(q_bar, 1);
#pragma unroll 1
    for (int s = 0; s < S; ++s) {
      mbar_init(&full_k[s], 1);
      mbar_init(&full_v[s], 1);
      mbar_init(&empty_k[s], 4 * Cfg::kConsumers);
      mbar_init(&empty_v[s], 4 * Cfg::kConsumers);
      mbar_init(&vperm_done[s], 3);
    }
    if constexpr (Tiles::kPersistent) mbar_init(q_empty, 4 * Cfg::kConsumers);
    fence_mbarrier_init();
    // Q first, by the thread that made the barriers: its load overlaps the block classes below
    // and the warpgroups' register handover.
    prefetch_tma_descriptor(tma_q);
    mbar_arrive_expect_tx(q_bar, (unsigned)Cfg::kQBytes);
#pragma unroll
    for (int blk = 0; blk < Cfg::kQkBlocks; ++blk)
      tma_load_4d(sQ + blk * BM * WQ, tma_q, q_bar, blk * (WQ / Cfg::kEs), m0, h, b);
    if constexpr (Cfg::kSelfLoad) {
      prefetch_tma_descriptor(tma_k);
      prefetch_tma_descriptor(tma_v);
      if constexpr (!Hooks::kMask) load_first_blocks();
    }
  }
  if constexpr (Hooks::kMask && Hooks::kSkipBlocks) {
    // Whole warps per pass (kThreads is a multiple of 32), so every lane takes part in the ballot.
#pragma unroll 1
    for (int base = 0; base < entries; base += Cfg::kThreads) {
      const int e = base + (int)threadIdx.x;
      int cls = 0;
      if (e < entries) {
        const int n0 = e * span * BN;
        const int n_last = min((e + 1) * span * BN, p.Skv) - 1;
        cls = hooks.classify(m0, m_last, n0, n_last);
        class_table[e] = (unsigned char)cls;
      }
      const unsigned bits = __ballot_sync(0xffffffffu, cls != 0);
      if ((threadIdx.x & 31u) == 0u && e < entries) visit_bits[e >> 5] = bits;
    }
    __syncthreads();
    // Each visited entry's rank: the visited entries before it, from the bits.
#pragma unroll 1
    for (int e = (int)threadIdx.x; e < entries; e += Cfg::kThreads) {
      const int cls = class_table[e];
      if (cls == 0) continue;
      int rank = __popc(visit_bits[e >> 5] & ((1u << (e & 31)) - 1u));
#pragma unroll 1
      for (int w = 0; w < (e >> 5); ++w) rank += __popc(visit_bits[w]);
      visit_list[rank] = (unsigned short)(4 * e + cls);
    }
  }
  if constexpr (Cfg::kRowSumMma) {
    // e4m3 1.0 in every byte, so the descriptor's layout does not matter
    if (threadIdx.x < Cfg::kOnesBytes / 4) {
      reinterpret_cast<unsigned*>(sOnes)[threadIdx.x] = 0x38383838u;
      fence_proxy_async_shared();   // the wgmmas read it through the async proxy
    }
  }
  __syncthreads();
  if constexpr (Hooks::kMask && Hooks::kSkipBlocks) {
#pragma unroll 1
    for (int w = 0; w < (entries + 31) >> 5; ++w) n_listed += __popc(visit_bits[w]);
  }
  if constexpr (Cfg::kSelfLoad && Hooks::kMask) {
    if (threadIdx.x == 0) load_first_blocks();   // once the list of blocks is known
  }

  if (wg == Cfg::kProducerWg) {
    // ---------------------------------------------------------------- producer
    if constexpr (!Cfg::kLeanProducer) setmaxnreg_dec<Cfg::kProducerRegs>();
    if (warp_idx_in_warpgroup() == 0 && lane_id() == 0) {
      prefetch_tma_descriptor(tma_k);
      prefetch_tma_descriptor(tma_v);
      attn_detail::RingCursor<S> ring;   // the stage of the next block and its phase
#pragma unroll 1
      for (unsigned tile_it = 0u;; ++tile_it) {
      if constexpr (Tiles::kPersistent) {
        if (tile_it > 0u) {
          // The next tile's Q once every consumer warp's last S = Q.K^T of the last tile is done
          // (q_empty), then its blocks into the stages as they free up.
          mbar_wait(q_empty, (tile_it - 1u) & 1u);
          mbar_arrive_expect_tx(q_bar, (unsigned)Cfg::kQBytes);
#pragma unroll
          for (int blk = 0; blk < Cfg::kQkBlocks; ++blk)
            tma_load_4d(sQ + blk * BM * WQ, tma_q, q_bar, blk * (WQ / Cfg::kEs), m0, h, b);
        }
      }
      int cls = 0;
      auto walk = first_block(cls);
#pragma unroll 1
      for (int j = walk.j; j < n_blocks; j = walk.next(cls), ring.advance()) {
        const int s = ring.stage;
        const unsigned ph = ring.phase;
        mbar_wait(&empty_k[s], ph ^ 1u);
        load_k(j, s);
        mbar_wait(&empty_v[s], ph ^ 1u);
        load_v(j, s);
      }
      if (!next_tile()) break;
      }
    } else if (Cfg::kVPerm && warp_idx_in_warpgroup() >= 1) {
      // Warps 1-3 take each V stage as it lands, in the producer's block order: every 16-byte
      // piece holds keys k0..k0+15 of one d row; word t of the result is keys 2t, 2t+1, 2t+8,
      // 2t+9 (the key order acc_to_a_fp8_kperm packs P in). The swizzle moves whole pieces, so
      // the permutation does not depend on it.
      const int pt = (int)threadIdx.x - 32;
      attn_detail::RingCursor<S> ring;
#pragma unroll 1
      for (;;) {
      int cls = 0;
      auto walk = first_block(cls);
#pragma unroll 1
      for (int j = walk.j; j < n_blocks; j = walk.next(cls), ring.advance()) {
        const int s = ring.stage;
        mbar_wait(&full_v[s], ring.phase);
        uint4* piece = reinterpret_cast<uint4*>(sV + s * Cfg::kVBytes);
#pragma unroll 4
        for (int i = pt; i < Cfg::kVBytes / 16; i += 96) {
          const uint4 w = piece[i];
          piece[i] = make_uint4(byte_perm(w.x, w.z, 0x5410u), byte_perm(w.x, w.z, 0x7632u),
                                byte_perm(w.y, w.w, 0x5410u), byte_perm(w.y, w.w, 0x7632u));
        }
        fence_proxy_async_shared();   // the wgmmas read the stage through the async proxy
        __syncwarp();
        if (lane_id() == 0) mbar_arrive(&vperm_done[s]);
      }
      if (!next_tile()) break;
      }
    }
    // (A persistent kernel's consumers read the running LSE themselves.)
    if constexpr (Cfg::kMergeOut && !Tiles::kPersistent) {
      // The rows' running LSE for the consumers' epilogue, read once this warp has issued its last
      // loads: its latency hides under the consumers' last blocks, and in a launch that starts
      // early (griddep_wait) the previous kernel, which wrote it, has had the longest to finish.
      // (Read by the consumers at their start, it kept the kernel from starting early.) A named
      // barrier hands it over (the consumers' bar.sync): compute-sanitizer's racecheck does not
      // see the order an mbarrier gives plain shared-memory stores.
      if (warp_idx_in_warpgroup() == 0) {
        __syncwarp();
        griddep_wait();
        // All of a lane's loads first, then the stores: one round trip to memory, not BM / 32 (a
        // loop of load and store per row had the consumers wait for it: H100, bf16 segments of
        // 2048 keys 473 us against 451 reading it at their start).
        constexpr int kRowsPerLane = BM / 32;
        float rows[kRowsPerLane];
#pragma unroll
        for (int i = 0; i < kRowsPerLane; ++i) {
          const int row = m0 + lane_id() + 32 * i;
          rows[i] = row < p.Sq ? p.lse[(long long)b * p.lse_sb + (long long)h * p.lse_sh + (long long)row * p.lse_ss]
                               : attn_detail::neg_inf();
        }
#pragma unroll
        for (int i = 0; i < kRowsPerLane; ++i) old_lse_rows[lane_id() + 32 * i] = rows[i];
        __syncwarp();
#pragma unroll
        for (int c = 0; c < Cfg::kConsumers; ++c) attn_detail::named_bar_arrive(attn_detail::kOldLseBar + c, 32 + 128);
      }
    }
    return;
  }

  // ------------------------------------------------------------------ consumers
  if constexpr (!Cfg::kLeanProducer) setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int c = Cfg::kLeanProducer ? wg : wg - 1;
  // kWgSync: consumer c waits on named barrier 1 + c before it issues, then hands the turn on
  const int next_turn = 1 + (c + 1 == Cfg::kConsumers ? 0 : c + 1);
  const int tid = (int)(threadIdx.x & 127u);
  const int r0 = acc_row(0, tid);                   // this thread's rows: rb + r0, rb + r0 + 8
  const int q2 = 2 * (tid & 3);                     // this thread's first O column (of 8)
  const int cq = Cfg::kKeyLaneStep * (tid & 3);     // its first key in a block (Cfg::key_offset)
  // descriptors: Q (this consumer's 64 rows), stage-0 K / V
  // Fenced, so the compiler holds them: it rebuilt one of them from the shared-memory base in
  // every step (7 uniform instructions; holding all three took the fp8 192 x 96 causal main loop
  // from 575 to 570 SASS instructions). Made once before the tiles of a persistent schedule (at
  // every tile, ptxas advanced them in 32-bit halves in the main loop).
  unsigned long long dq0, dk0, dv0;
  auto make_descs = [&]() {
    dq0 = make_desc_kmajor<Cfg::kQkSwizzle>(sQ + 64 * c * WQ);
    dk0 = make_desc_kmajor<Cfg::kQkSwizzle>(sK);
    dv0 = Cfg::kFp8 ? make_desc_kmajor<Cfg::kVSwizzle>(sV) : make_desc_mnmajor<SWIZZLE_128B>(sV, BN * 128, 1024);
    fence_operand(dq0);
    fence_operand(dk0);
    fence_operand(dv0);
  };
  if constexpr (Tiles::kPersistent) make_descs();
  // The stage of the tile's first block and its phase (a persistent schedule's next tile goes on
  // from the last one's).
  attn_detail::RingCursor<S> ring_base;
  // Persistent: this consumer warp is done with the tile's Q (after its last S = Q.K^T wait).
  auto q_done = [&]() {
    if constexpr (Tiles::kPersistent) attn_detail::release(q_empty);
  };
#pragma unroll 1
  for (unsigned tile_it = 0u;; ++tile_it) {
  if constexpr (Tiles::kPersistent) {
    // Carried over the last tile's epilogue (divergent stores), ptxas held the stage in per-thread
    // registers and formed every barrier address and wgmma descriptor of the main loop from them
    // (+200 SASS instructions); a shuffle from lane 0 tells it they are the warp's.
    ring_base.stage = __shfl_sync(0xffffffffu, ring_base.stage, 0);
    ring_base.phase = __shfl_sync(0xffffffffu, ring_base.phase, 0);
  }
  const int rb = m0 + 64 * c;                       // first row of this consumer
  // kMergeOut, persistent: the rows' running LSE, read by each thread for its two rows (at the
  // epilogue of the first tile, after griddep_wait; at the start of the later ones).
  auto load_old_lse = [&](float* out) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = rb + r0 + 8 * hh;
      out[hh] = row < p.Sq ? p.lse[(long long)b * p.lse_sb + (long long)h * p.lse_sh + (long long)row * p.lse_ss]
                           : attn_detail::neg_inf();
    }
  };
  float old_lse_ahead[2];
  if constexpr (Tiles::kPersistent && Cfg::kMergeOut) {
    if (tile_it > 0u) load_old_lse(old_lse_ahead);
  }

  const float qd = p.q_descale ? p.q_descale[(long long)b * p.qd_sb + (long long)h * p.qd_sh] : 1.0f;
  const float kd = p.k_descale ? p.k_descale[(long long)b * p.kd_sb + (long long)hk * p.kd_sh] : 1.0f;
  const float vd = p.v_descale ? p.v_descale[(long long)b * p.vd_sb + (long long)hk * p.vd_sh] : 1.0f;
  // raw dot -> log2 units; the product is formed in the DSL kernel's order (scale*qd)*kd
  const float sc = (p.score_scale * qd) * kd;
  // A score hook works in natural units (sc_nat) and the softmax takes its result to log2 units.
  const float sc_nat = sc * 0.6931471805599453f * hooks.score_in_factor();
  // A linear score hook (d s + a kv + b q + g) in log2 units: s * (sc d) + a' (kv - rb) per element,
  // the key term formed per column and block; b' (q - rb) + (a' + b') rb + g' per row, added to the
  // row max and the exp2 bias. Positions relative to the tile's first row keep the two terms as
  // small as kv - q near the diagonal, where the scores that count are.
  constexpr bool kLinear = Hooks::kScoreMod && Hooks::kLinearScore;
  float lin_sc = sc, lin_a = 0.0f, row_term[2] = {0.0f, 0.0f};
  if constexpr (kLinear) {
    float d, a, b, g;
    hooks.linear_score(d, a, b, g);
    constexpr float kLog2e = 1.4426950408889634f;
    lin_sc = sc * d;
    lin_a = a * kLog2e;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      row_term[hh] = (b * (float)(r0 + 8 * hh) + (a + b) * (float)rb + g) * kLog2e;
  }
  const float scm = kLinear ? 1.0f : Hooks::kScoreMod ? 1.4426950408889634f * hooks.score_out_factor() : sc;
  // Masked scores hold -inf after scaling: the raw value is -inf (scm > 0) or +inf (scm < 0).
  const bool sc_neg = scm < 0.0f;
  const float masked_raw = sc_neg ? -attn_detail::neg_inf() : attn_detail::neg_inf();

  float o[D / 2];
  float s[BN / 2];
  unsigned pa[Cfg::kPRegs];
  float m_run[2] = {attn_detail::neg_inf(), attn_detail::neg_inf()};
  // kRowMaxInSmem: m_run's copy (one slot pair per consumer thread; written at every block)
  __shared__ float row_max_slots[Cfg::kRowMaxInSmem ? 2 * 128 * Cfg::kConsumers : 1];
  const int row_max_slot = (Cfg::kConsumers > 1 ? 256 * c : 0) + 2 * tid;
  float l_run[2] = {0.0f, 0.0f};
  // kRowSumMma: the last P.V block's row sums from the tensor cores (rows r0: 0, 1; r0 + 8: 2, 3)
  float l_blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  acc_fill<D>(o, 0.0f);
#pragma unroll
  for (int i = 0; i < Cfg::kPRegs; ++i) pa[i] = 0u;

  if constexpr (!Tiles::kPersistent) make_descs();
  const unsigned long long d_ones = make_desc_kmajor<SWIZZLE_NONE>(sOnes);

  // S = Q . K_s^T (issue only)
  auto issue_qk = [&](int st) {
    const unsigned long long dk = desc_advance(dk0, (unsigned)(st * Cfg::kKBytes));
#pragma unroll
    for (int k = 0; k < Cfg::kDBytes / 32; ++k) {
      const unsigned blk = (unsigned)((32 * k) / WQ), in = (unsigned)((32 * k) % WQ);
      mma_async_ss<BN, TY, TY>(s, desc_advance(dq0, blk * BM * WQ + in),
                               desc_advance(dk, blk * BN * WQ + in), k > 0 ? 1 : 0);
    }
  };
  // O += P . V_s (issue only)
  auto issue_pv = [&](int st) {
    const unsigned long long dv = desc_advance(dv0, (unsigned)(st * Cfg::kVBytes));
#pragma unroll
    for (int k = 0; k < BN / Cfg::kKStep; ++k) {
      if constexpr (Cfg::kFp8) {
        const unsigned blk = (unsigned)((32 * k) / Cfg::kWv), in = (unsigned)((32 * k) % Cfg::kWv);
        mma_async_rs<D, TY, TY>(o, pa + 4 * k, desc_advance(dv, blk * D * Cfg::kWv + in), 1);
      } else {
        mma_async_rs<D, TY, TY, 1, 1, 1>(o, pa + 4 * k, desc_advance(dv, (unsigned)(k * 16 * 128)),
                                         1);
      }
    }
    if constexpr (Cfg::kRowSumMma) {
#pragma unroll
      for (int k = 0; k < BN / Cfg::kKStep; ++k) mma_async_rs<8, TY, TY>(l_blk, pa + 4 * k, d_ones, k > 0 ? 1 : 0);
    }
  };
  // O times alpha per row (kRowSumMma: l too, which the softmax scales otherwise)
  auto rescale_o = [&](const float* alpha) {
    acc_scale_rows<D>(o, alpha);
    if constexpr (Cfg::kRowSumMma) {
      l_run[0] *= alpha[0];
      l_run[1] *= alpha[1];
    }
  };
  auto fence_o = [&]() {
    fence_acc<D / 2>(o);
    if constexpr (Cfg::kRowSumMma) fence_acc<4>(l_blk);
  };
  // After the wait on a P.V: its block's row sums join l (every column of P.1 is the row's sum)
  auto pv_done = [&]() {
    fence_o();
    if constexpr (Cfg::kRowSumMma) {
      l_run[0] += l_blk[0];
      l_run[1] += l_blk[2];
    }
  };
  // The score hook on block n0, then the masks: the KV end, the causal diagonal, and the mask
  // hook where the block's class is 2.
  auto mask = [&](int n0, int cls) {
    if constexpr (kLinear) {
      // One FFMA per key column (shared by the thread's two rows) and one per element.
      const float col0 = lin_a * (float)(n0 - rb + cq);
#pragma unroll
      for (int i = 0; i < BN / 2; ++i)
        s[i] = fmaf(s[i], lin_sc, fmaf(lin_a, (float)Cfg::key_offset(i), col0));
    } else if constexpr (Hooks::kScoreMod) {
      // Positions as floats: one conversion per row and per block, the column offsets folded in
      // as immediates (an I2F per score element runs at a quarter of the FP32 rate).
      const float rowf = (float)(rb + r0), colf = (float)(n0 + cq);
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) {
        const int row = rb + r0 + 8 * ((i >> 1) & 1);
        const int col = n0 + Cfg::key_offset(i) + cq;
        s[i] = hooks.score(s[i] * sc_nat, row, col, rowf + (float)(8 * ((i >> 1) & 1)),
                           colf + (float)Cfg::key_offset(i));
      }
    }
    const bool tail = n0 + BN > p.Skv;
    const bool diag = Cfg::kCausal && (n0 + BN - 1 > with_prefix(rb));
    const bool hook = Hooks::kMask && cls == 2;
    // Boundary blocks only; branch-free per element (comparisons, a select). The KV end and the
    // causal diagonal are one bound per row, so one comparison per element: with two (and a
    // hook's), ptxas computed every element's predicate before the selects and parked them in
    // registers (P2R, +12% SASS in the causal + hook kernels). The hook's keep() runs only on the
    // blocks its class says it cuts: a diagonal block it keeps whole (causal documents, block
    // masks) takes the bound alone. (With keep() in a second loop after the bound's, ptxas parked
    // the predicates again: documents +5% SASS.)
    if (tail || diag || hook) {
      int last_key[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = rb + r0 + 8 * hh;
        last_key[hh] = Cfg::kCausal ? min(with_prefix(row), p.Skv - 1) : p.Skv - 1;
      }
      auto apply = [&](auto with_hook) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
          const int row = rb + r0 + 8 * ((i >> 1) & 1);
          const int col = n0 + Cfg::key_offset(i) + cq;
          bool bad = col > last_key[(i >> 1) & 1];
          if constexpr (decltype(with_hook)::value) bad |= !hooks.keep(row, col);
          s[i] = bad ? masked_raw : s[i];
        }
      };
      if constexpr (Hooks::kMask && Hooks::kKeepGathers) {
        // keep() gathers (a block mask): evaluated in a rolled loop into bits, then applied. Unrolled
        // per element, its 64-bit index arithmetic set the register peak of the whole loop (H100:
        // the fp8 64 x 64 block mask at 128 registers spilled 192 bytes, loop-carried
        // values reloaded at every block).
        if (hook) {
          unsigned drop[(BN / 2 + 31) / 32];
#pragma unroll
          for (int w = 0; w < (BN / 2 + 31) / 32; ++w) drop[w] = 0u;
#pragma unroll
          for (int w = 0; w < (BN / 2 + 31) / 32; ++w) {
#pragma unroll 1
            for (int b = 0; b < 32 && 32 * w + b < BN / 2; ++b) {
              const int i = 32 * w + b;
              const int row = rb + r0 + 8 * ((i >> 1) & 1);
              const int col = n0 + Cfg::key_offset(i) + cq;
              if (!hooks.keep(row, col)) drop[w] |= 1u << b;
            }
          }
#pragma unroll
          for (int i = 0; i < BN / 2; ++i) {
            const int col = n0 + Cfg::key_offset(i) + cq;
            const bool bad = col > last_key[(i >> 1) & 1] || ((drop[i >> 5] >> (i & 31)) & 1u);
            s[i] = bad ? masked_raw : s[i];
          }
        } else {
          apply(attn_detail::Flag<false>{});
        }
      } else if (Hooks::kMask && hook) {
        apply(attn_detail::Flag<true>{});
      } else {
        apply(attn_detail::Flag<false>{});
      }
    }
  };
  // Online softmax on s (in place -> P); returns the rescale factors of the running O.
  auto softmax = [&](float* alpha) {
    // row max of s * sc = (max of s) * sc for sc >= 0, (min of s) * sc for sc < 0 (uniform)
    float mx[2];
    if (!sc_neg) {
      mx[0] = mx[1] = attn_detail::neg_inf();
      acc_row_max<BN>(s, mx);
    } else {
      mx[0] = mx[1] = -attn_detail::neg_inf();
      attn_detail::acc_row_min<BN>(s, mx);
    }
    float bias[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float m_blk = fmaxf(m_run[hh], kLinear ? mx[hh] + row_term[hh] : mx[hh] * scm);
      const float m_new = m_blk > m_run[hh] + Cfg::kRescaleSlack ? m_blk : m_run[hh];
      const float m_use = m_new == attn_detail::neg_inf() ? 0.0f : m_new;
      alpha[hh] = attn_detail::ex2(m_run[hh] - m_use);
      m_run[hh] = m_new;
      if constexpr (Cfg::kRowMaxInSmem) row_max_slots[row_max_slot + hh] = m_new;
      bias[hh] = kLinear ? Cfg::kPOffset - m_use + row_term[hh] : Cfg::kPOffset - m_use;
    }
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      const float x = fmaf(s[i], scm, bias[(i >> 1) & 1]);
      if constexpr (Cfg::kExp2F16) {
        // register i (< kOdd) and its odd-key partner i + kOdd: one e4m3x2 of P; s[i] holds their
        // f16x2, s[i + kOdd] a 0 (the release predicate ORs every register's bits)
        constexpr int kOdd = BN / 4;
        if (i < kOdd && (i & 7) < Cfg::kExp2Fma) {
          s[i] = __uint_as_float(exp2_f16x2(x, fmaf(s[i + kOdd], scm, bias[(i >> 1) & 1])));
          s[i + kOdd] = 0.0f;
        } else if (!(i >= kOdd && ((i - kOdd) & 7) < Cfg::kExp2Fma)) {
          s[i] = attn_detail::ex2(x);
        }
      } else {
        s[i] = (i & 7) < Cfg::kExp2Fma ? exp2_fma(x) : attn_detail::ex2(x);
      }
    }
    if constexpr (!Cfg::kRowSumMma) {
      float rs[2] = {0.0f, 0.0f};
      acc_row_sum_partial<BN>(s, rs);
      l_run[0] = l_run[0] * alpha[0] + rs[0];
      l_run[1] = l_run[1] * alpha[1] + rs[1];
    }
  };
  auto to_a = [&]() {
    if constexpr (Cfg::kFp8) {
      if constexpr (Cfg::kKeysByParity) acc_to_a_fp8_keys_by_parity<BN, TY, Cfg::kExp2F16 ? Cfg::kExp2Fma : 0>(s, pa);
      else if constexpr (Cfg::kVPerm) acc_to_a_fp8_kperm<BN, TY>(s, pa);
      else acc_to_a_fp8<BN, TY>(s, pa);
    } else if constexpr (TY == WG_BF16) {
      acc_to_a_bf16<BN>(s, pa);
    } else {
      acc_to_a_f16<BN>(s, pa);
    }
  };
  auto fence_pa = [&]() {
#pragma unroll
    for (int i = 0; i < Cfg::kPRegs; ++i) fence_operand(pa[i]);
  };

  mbar_wait(q_bar, tile_it & 1u);

  // The consumers walk the table as the producer does, one list entry per step. (H100:
  // walking the classes in every iteration cost the causal variant 10% more instructions than the
  // built-in causal mask.) (H100: the list read and its move to a uniform register hold
  // 4.5% of the causal variant's stall samples; computing the block and its class instead, for
  // one-run masks whose classify() does not gather, or reading the entry a step ahead, did not make
  // the variants faster.) A ring cursor per block picks the stage and its phase, as in the
  // producer's loop.
  int cls0 = 0;
  auto walk = first_block(cls0);
  const int j0 = walk.j;
  if (j0 < n_blocks) {
    if constexpr (Cfg::kWgSync) {
      // consumer 0 issues first: the last consumer pre-arrives on consumer 0's barrier
      if (c == Cfg::kConsumers - 1) attn_detail::named_bar_arrive(1, 256);
    }
    if constexpr (Cfg::kOverlap) {
      // ---- block j0: S, softmax, P
      int cls_next = 0;
      int j_next = walk.next(cls_next);
      mbar_wait(&full_k[ring_base.stage], ring_base.phase);
      if constexpr (Cfg::kWgSync) attn_detail::named_bar_sync(1 + c, 256);
      wgmma_fence();
      issue_qk(ring_base.stage);
      wgmma_commit();
      if constexpr (Cfg::kWgSync) {
        if (!(c == Cfg::kConsumers - 1 && j_next >= n_blocks)) attn_detail::named_bar_arrive(next_turn, 256);
      }
      fence_acc<BN / 2>(s);
      wgmma_wait<0>();
      fence_acc<BN / 2>(s);
      attn_detail::release(&empty_k[ring_base.stage]);
      mask(j0 * BN, cls0);
      float alpha[2];
      softmax(alpha);
      to_a();
      // ---- steady state (FA3's order): issue S_t = Q.K_t^T; rescale O by alpha_{t-1} while it
      // runs; issue O += P_{t-1}.V_{t-1}; softmax of S_t while the P.V wgmma is in flight; after
      // the wait only the P conversion is left. cur: block t's stage; prev: block t - 1's.
      // (H200: packing P_t into a second buffer before that wait, where the registers
      // allowed, moved bf16 by -2% to +1.5% and fp8 by noise; not kept.)
      attn_detail::RingCursor<S> prev = ring_base, cur = ring_base;
      cur.advance();
      // The mask class of the block after the current one is read with it (shared memory), while
      // the wgmmas run: at the top of the iteration both reads sat before the S = Q.K^T issue
      // (H100: 12% of the causal variant's stall samples, none in the built-in mask).
#pragma unroll 1
      for (int j = j_next, cls = cls_next; j < n_blocks;
           j = j_next, cls = cls_next, prev = cur, cur.advance()) {
        const int st = cur.stage, pst = prev.stage;
        const unsigned ph = cur.phase, pph = prev.phase;
        mbar_wait(&full_k[st], ph);
        mbar_wait(&v_ready[pst], pph);
        if constexpr (Cfg::kWgSync) attn_detail::named_bar_sync(1 + c, 256);
        fence_acc<BN / 2>(s);
        wgmma_fence();
        issue_qk(st);
        wgmma_commit();
        // alpha = 1 exactly when no row max of the warp moved (ex2(0) = 1): the rescale would
        // multiply by 1, so the warp skips it -- most blocks once the running max has settled
        // (H100: causal bf16 / fp8 S 8192 +2-3%). kRescaleVote = false (knob
        // attn_rescale_vote = 0) rescales at every block.
        if (!Cfg::kRescaleVote || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
          rescale_o(alpha);
        fence_o();
        fence_pa();
        wgmma_fence();
        issue_pv(pst);
        wgmma_commit();
        j_next = walk.next(cls_next);
        if constexpr (Cfg::kWgSync) {
          if (!(c == Cfg::kConsumers - 1 && j_next >= n_blocks)) attn_detail::named_bar_arrive(next_turn, 256);
        }
        fence_acc<BN / 2>(s);
        wgmma_wait<1>();
        fence_acc<BN / 2>(s);
        mask(j * BN, cls);
        softmax(alpha);
        // Release K_t only now, predicated on a softmax result (always true: l >= 0 or NaN).
        // ptxas keeps the mbarrier arrive before the wgmma wait below, so this data dependency
        // pins the softmax above the wait in SASS; without it ptxas hoists the wait to the top
        // of the softmax and the P.V wgmma no longer overlaps the exp2s (checked in the SASS:
        // bench/attention/sass_check.py).
        // (kRowSumMma: on the bitwise or of every P, 3-input LOP3s at half an instruction per
        // score; each P is +0, positive or the canonical NaN, so the sign bit stays clear.)
        bool softmax_done;
        if constexpr (Cfg::kRowSumMma) {
          unsigned any = 0u;
#pragma unroll
          for (int i = 0; i < BN / 2; ++i) any |= __float_as_uint(s[i]);
          softmax_done = !(__uint_as_float(any) < -1.0f);
        } else {
          softmax_done = !(l_run[0] < -1.0f || l_run[1] < -1.0f);
        }
        if ((threadIdx.x & 31u) == 0u && softmax_done) mbar_arrive(&empty_k[st]);
        // The volatile fences take the softmax results as operands and volatile asm keeps its
        // order, so the exp2s also stay above the wait at the PTX level.
        fence_acc<BN / 2>(s);
        fence_operand(alpha[0]);
        fence_operand(alpha[1]);
        fence_operand(l_run[0]);
        fence_operand(l_run[1]);
        fence_operand(m_run[0]);
        fence_operand(m_run[1]);
        wgmma_wait<0>();
        pv_done();
        fence_pa();
        attn_detail::release(&empty_v[pst]);
        to_a();
      }
      q_done();
      if constexpr (Tiles::kPersistent) ring_base = cur;
      // ---- last P.V
      {
        const int pst = prev.stage;
        const unsigned pph = prev.phase;
        mbar_wait(&v_ready[pst], pph);
        rescale_o(alpha);
        fence_o();
        fence_pa();
        wgmma_fence();
        issue_pv(pst);
        wgmma_commit();
        wgmma_wait<0>();
        pv_done();
        fence_pa();
        attn_detail::release(&empty_v[pst]);
      }
    } else {
      // ---- simple schedule: S_t, softmax, P_t.V_t, one after the other
      attn_detail::RingCursor<S> cur = ring_base, prev = ring_base;
#pragma unroll 1
      for (int j = j0, cls = cls0; j < n_blocks; prev = cur, cur.advance()) {
        const int st = cur.stage;
        const unsigned ph = cur.phase;
        mbar_wait(&full_k[st], ph);
        if constexpr (Cfg::kWgSync) attn_detail::named_bar_sync(1 + c, 256);
        fence_acc<BN / 2>(s);
        wgmma_fence();
        issue_qk(st);
        wgmma_commit();
        // The next block is looked up while the S wgmma runs. At the top of the iteration the list
        // walk (a shared-memory read and the branches on it) sat on every block's critical path:
        // one consumer warpgroup here is bound by the latency of its chain of steps, not by the
        // tensor cores (H200, fp8 64 x 128 with a producer warp, a mask hook keeping
        // every key: 732 / 815 TFLOP/s at S 2048 / 8192 there, 771 / 887 here; no hook: 809 / 907).
        int cls_next = 0;
        const int j_next = walk.next(cls_next);
        if constexpr (Cfg::kWgSync) {
          if (!(c == Cfg::kConsumers - 1 && j_next >= n_blocks)) attn_detail::named_bar_arrive(next_turn, 256);
        }
        fence_acc<BN / 2>(s);
        wgmma_wait<0>();
        fence_acc<BN / 2>(s);
        attn_detail::release(&empty_k[st]);
        mask(j * BN, cls);
        float alpha[2];
        softmax(alpha);
        rescale_o(alpha);
        to_a();
        mbar_wait(&v_ready[st], ph);
        fence_o();
        fence_pa();
        wgmma_fence();
        issue_pv(st);
        wgmma_commit();
        // kSelfLoad, while the P.V runs: the V of the block whose K went into the last block's stage
        // (every warp released that stage after its last P.V), then the K of the block S ahead into
        // this stage (released after every warp's S wait); its V follows at the next block. (With V's
        // load under the S wgmma instead, the segment variant's main loop had 43 SASS instructions more
        // and ran 3% slower: H100, fp8 S 2048 0.350 vs 0.338-0.339 ms; plain attention the
        // same within noise.)
        if constexpr (Cfg::kSelfLoad) {
          if (threadIdx.x == 0u) {
            if (v_next < n_blocks) {
              mbar_wait(&empty_v[prev.stage], prev.phase);
              load_v(v_next, prev.stage);
            }
            v_next = ahead.j;
            if (ahead.j < n_blocks) {
              mbar_wait(&empty_k[st], ph);
              load_k(ahead.j, st);
              ahead.next(ahead_cls);
            }
          }
        }
        wgmma_wait<0>();
        pv_done();
        fence_pa();
        attn_detail::release(&empty_v[st]);
        j = j_next;
        cls = cls_next;
      }
      q_done();
      if constexpr (Tiles::kPersistent) ring_base = cur;
    }
  } else {
    q_done();
  }

  // ------------------------------------------------------------------ epilogue
  // O and the LSE may still be the previous kernel's on the stream (a launch that starts early):
  // nothing before this point touches them.
  griddep_wait();
  // kMergeOut: the rows' running LSE (from the producer warp; persistent or self-loading kernels'
  // threads read their rows' own; -inf past Sq). The quad's first thread writes the new one at the end.
  float old_lse[2] = {attn_detail::neg_inf(), attn_detail::neg_inf()};
  if constexpr (Cfg::kMergeOut && (Tiles::kPersistent || Cfg::kSelfLoad)) {
    if (tile_it == 0u) {   // (kSelfLoad: no producer warp to read it)
      load_old_lse(old_lse);
    } else {
      old_lse[0] = old_lse_ahead[0];
      old_lse[1] = old_lse_ahead[1];
    }
  } else if constexpr (Cfg::kMergeOut) {
    // (one constant id per branch: with the id in a register ptxas reserves all 16 barriers)
    if (c == 0) attn_detail::named_bar_sync(attn_detail::kOldLseBar, 32 + 128);
    else if (c == 1) attn_detail::named_bar_sync(attn_detail::kOldLseBar + 1, 32 + 128);
    else attn_detail::named_bar_sync(attn_detail::kOldLseBar + 2, 32 + 128);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) old_lse[hh] = old_lse_rows[64 * c + r0 + 8 * hh];
  }
  float inv[2], lse[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    // kRowSumMma: P.1 gave every column of the accumulator the whole row's sum
    const float l = Cfg::kRowSumMma ? l_run[hh] : quad_allreduce_sum(l_run[hh]);
    inv[hh] = l > 0.0f ? vd / l : 0.0f;
    float m_fin = m_run[hh];
    // (volatile: read back, not forwarded from the loop's registers; unwritten where no block was
    // visited, but then l = 0 and the LSE -inf without it)
    if constexpr (Cfg::kRowMaxInSmem) m_fin = reinterpret_cast<volatile float*>(row_max_slots)[row_max_slot + hh];
    const float m_use = m_fin == attn_detail::neg_inf() ? 0.0f : m_fin;
    lse[hh] = l > 0.0f ? (m_use - Cfg::kPOffset + attn_detail::lg2(l)) * 0.6931471805599453f
                       : attn_detail::neg_inf();
  }
  // kMergeOut: O and the LSE hold the rows' attention over other keys (LSE -inf: none yet, O then
  // anything); the new O is this part's times its weight plus the old O times its weight, the
  // weights from the two LSEs (kernels/attention_fp8.cpp's merging epilogue).
  float keep_old[2] = {0.0f, 0.0f};
  if constexpr (Cfg::kMergeOut) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float old = old_lse[hh];
      const float top = fmaxf(old, lse[hh]);
      const float top_safe = top == attn_detail::neg_inf() ? 0.0f : top;
      const float w_part = attn_detail::ex2((lse[hh] - top_safe) * 1.4426950408889634f);
      const float w_old = attn_detail::ex2((old - top_safe) * 1.4426950408889634f);
      const float den = w_part + w_old;
      const float inv_den = den > 0.0f ? 1.0f / den : 0.0f;
      inv[hh] *= w_part * inv_den;
      keep_old[hh] = w_old * inv_den;
      lse[hh] = top_safe + attn_detail::lg2(den) * 0.6931471805599453f;   // den 0: -inf
    }
  }
  acc_scale_rows<D>(o, inv);
  // O through shared memory: the accumulator layout gives each thread 4-byte (16-bit O) or 2-byte
  // (e4m3) pieces of 8 rows per store (half / a quarter of every 32-byte sector), so each warp
  // stages its 16 rows and writes them back as whole 16-byte pieces of contiguous rows. A CTA per
  // tile stages in the Q tile and K/V stages, free once every consumer has left the main loop
  // (their last wgmmas read Q and the last K/V stage); a persistent CTA in its own rows (sOStage),
  // each warp in its 16 (the next tile's loads fill the others).
  constexpr int kOBytes = Cfg::kOBytes;
  constexpr int kOPitch = Cfg::kOPitch;
  constexpr bool kStageO =
      Tiles::kPersistent || Cfg::kBM * kOPitch <= Cfg::kQBytes + S * (Cfg::kKBytes + Cfg::kVBytes);
  const bool stage_o = kStageO && p.o_sd == 1 && (((p.o_ss | p.o_sh | p.o_sb) * kOBytes) & 15) == 0 &&
                       (reinterpret_cast<unsigned long long>(p.O) & 15ull) == 0;   // 16-byte rows
  float amax = 0.0f;
  if (kStageO && stage_o) {
    // Each lane writes kPasses pieces, one every kRowsPerPass rows from row0 + lane / kChunks.
    const int warp = tid >> 5, lane = tid & 31;
    constexpr int kChunks = D * kOBytes / 16;       // 16-byte pieces per row
    constexpr int kRowsPerPass = 32 / kChunks;      // rows one warp writes per pass
    constexpr int kPasses = 16 / kRowsPerPass;
    const int row0 = rb + 16 * warp, chunk = lane % kChunks;
    auto piece_of = [&](int row) {
      return reinterpret_cast<char*>(p.O) +
             ((long long)b * p.o_sb + (long long)h * p.o_sh + (long long)row * p.o_ss) * kOBytes + 16 * chunk;
    };
    // kMergeOut: the old O of the pieces this lane writes (rows that have one: running LSE > -inf),
    // loaded before the wait for the other consumers, all at once. (Loaded in the store loop, each
    // pass's load waited for the previous pass's store: H200, fp8 merging segments of 1024 keys
    // 71.5 us against 56 without the merge, 57.3 loaded here. Copied to shared memory instead, at
    // the consumers' start (cp.async) it slowed the first K/V loads, 61 us; by the producer after
    // its last loads (cp.async.bulk, 16 KB more shared memory per CTA), 63.) Up to 8 pieces (head
    // dims up to 128): 32 registers; more are loaded in the store loop.
    constexpr bool kOldAhead = Cfg::kMergeOut && kPasses <= 8;
    uint4 old_o[kOldAhead ? kPasses : 1];
    if constexpr (kOldAhead) {
      // lane l holds the old LSE of rows l / 4 and l / 4 + 8 of its warp's 16
      const unsigned has0 = __ballot_sync(0xffffffffu, old_lse[0] != attn_detail::neg_inf());
      const unsigned has1 = __ballot_sync(0xffffffffu, old_lse[1] != attn_detail::neg_inf());
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const int r = lane / kChunks + i * kRowsPerPass;
        const bool has = (((r < 8 ? has0 : has1) >> (4 * (r & 7))) & 1u) != 0u;
        if (row0 + r < p.Sq && has) old_o[i] = *reinterpret_cast<const uint4*>(piece_of(row0 + r));
      }
    }
    if constexpr (!Tiles::kPersistent) attn_detail::named_bar_sync(attn_detail::kConsumersBar, 128 * Cfg::kConsumers);
    else __syncwarp();   // every lane has read back the last tile's rows
    // this warp's 16 rows (persistent: written back before this warp stages its next tile's)
    unsigned char* stage = (Tiles::kPersistent ? sOStage : sQ) + (64 * c + 16 * warp) * kOPitch;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      unsigned char* srow = stage + ((lane >> 2) + 8 * hh) * kOPitch;
      const bool real_row = rb + r0 + 8 * hh < p.Sq;   // rows past Sq are staged, never stored
      if (Cfg::kMergeOut && (tid & 3) == 0) *reinterpret_cast<float*>(srow + D * kOBytes) = keep_old[hh];
#pragma unroll
      for (int jj = 0; jj < D / 8; ++jj) {
        const float v0 = o[4 * jj + 2 * hh], v1 = o[4 * jj + 2 * hh + 1];
        if (Cfg::kOut == ATTN_OUT_E4M3) {
          if (real_row) amax = fmaxf(amax, fmaxf(fabsf(v0), fabsf(v1)));
          *reinterpret_cast<unsigned short*>(srow + 8 * jj + q2) = f32x2_to_e4m3x2(v0 * p.o_scale, v1 * p.o_scale);
        } else {
          *reinterpret_cast<unsigned*>(srow + 2 * (8 * jj + q2)) = attn_detail::f32x2_to_out16x2<Cfg>(v0, v1);
        }
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int r = lane / kChunks + i * kRowsPerPass, row = row0 + r;
      if (row < p.Sq) {
        uint4 piece = *reinterpret_cast<const uint4*>(stage + r * kOPitch + 16 * chunk);
        char* dst = piece_of(row);
        if constexpr (Cfg::kMergeOut) {
          const float w = *reinterpret_cast<const float*>(stage + r * kOPitch + D * kOBytes);
          if (w > 0.0f) {
            if constexpr (kOldAhead) piece = attn_detail::add_scaled_out<Cfg>(piece, old_o[i], w);
            else piece = attn_detail::add_scaled_out<Cfg>(piece, *reinterpret_cast<const uint4*>(dst), w);
          }
        }
        *reinterpret_cast<uint4*>(dst) = piece;
      }
    }
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = rb + r0 + 8 * hh;
    if (row < p.Sq && (!kStageO || !stage_o || p.lse)) {
      char* row_ptr = reinterpret_cast<char*>(p.O) +
                      ((long long)b * p.o_sb + (long long)h * p.o_sh + (long long)row * p.o_ss) * kOBytes;
      // Persistent, merging: the row's old O first, all of it (loaded between the stores, each load
      // would wait for the store before it: they may alias).
      constexpr bool kOldFirst = Tiles::kPersistent && Cfg::kMergeOut;
      unsigned old_row[kOldFirst ? D / 8 : 1];   // 16-bit pairs (as floats they spilled)
      if constexpr (kOldFirst) {
        if (keep_old[hh] > 0.0f) {
#pragma unroll
          for (int jj = 0; jj < D / 8; ++jj) old_row[jj] = attn_detail::load_out16x2<Cfg>(p, row_ptr, 8 * jj + q2);
        }
      }
#pragma unroll
      for (int jj = 0; jj < D / 8 && !(kStageO && stage_o); ++jj) {
        float v0 = o[4 * jj + 2 * hh], v1 = o[4 * jj + 2 * hh + 1];
        if (Cfg::kOut == ATTN_OUT_E4M3) amax = fmaxf(amax, fmaxf(fabsf(v0), fabsf(v1)));
        if (Cfg::kMergeOut && keep_old[hh] > 0.0f) {
          float old0, old1;
          if constexpr (kOldFirst) {
            old0 = attn_detail::out16_to_f32<Cfg>((unsigned short)(old_row[jj] & 0xffffu));
            old1 = attn_detail::out16_to_f32<Cfg>((unsigned short)(old_row[jj] >> 16));
          } else {
            attn_detail::load_out_pair<Cfg>(p, row_ptr, 8 * jj + q2, old0, old1);
          }
          v0 = fmaf(keep_old[hh], old0, v0);
          v1 = fmaf(keep_old[hh], old1, v1);
        }
        attn_detail::store_out_pair<Cfg>(p, row_ptr, 8 * jj + q2, v0, v1);
      }
      if (p.lse && (tid & 3) == 0)
        p.lse[(long long)b * p.lse_sb + (long long)h * p.lse_sh + (long long)row * p.lse_ss] = lse[hh];
    }
  }
  if (Cfg::kOut == ATTN_OUT_E4M3 && p.o_amax) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if ((tid & 31) == 0 && amax > 0.0f)
      atomicMax(reinterpret_cast<int*>(p.o_amax), __float_as_int(amax));
  }
  if (!next_tile()) break;
  }   // the tiles
}

// The CTA body for code that computes its tile (bh, m_tile) itself.
template <class Cfg, class Hooks = NoHooks>
__device__ __forceinline__ void attn_fwd_device(const TmaDescriptor* tma_q, const TmaDescriptor* tma_k,
                                                const TmaDescriptor* tma_v, const AttnParams& p, int bh,
                                                int m_tile, const Hooks& hooks = Hooks()) {
  attn_fwd_tiles<Cfg, Hooks>(tma_q, tma_k, tma_v, p, AttnOneTile{AttnTile{bh, m_tile}}, hooks);
}

// A persistent launch's CTA body: `programs` = B*H*m_tiles tiles over gridDim.x CTAs.
template <class Cfg>
__device__ __forceinline__ void attn_fwd_persistent(const TmaDescriptor* tma_q, const TmaDescriptor* tma_k,
                                                    const TmaDescriptor* tma_v, const AttnParams& p,
                                                    unsigned programs, unsigned m_tiles) {
  attn_fwd_tiles<Cfg, NoHooks>(tma_q, tma_k, tma_v, p, AttnPersistentTiles{programs, m_tiles}, NoHooks());
}

// Grid: (ceil(Sq / BM), B * H). Causal tiles run longest first.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attn_fwd_kernel(const __grid_constant__ TmaDescriptor tma_q,
                    const __grid_constant__ TmaDescriptor tma_k,
                    const __grid_constant__ TmaDescriptor tma_v, const AttnParams p) {
  const int m_tile = Cfg::kCausal ? (int)(gridDim.x - 1u - blockIdx.x) : (int)blockIdx.x;
  attn_fwd_device<Cfg>(&tma_q, &tma_k, &tma_v, p, (int)blockIdx.y, m_tile);
}

#endif  // TJ_SM90A_ENABLED

}  // namespace dev
}  // namespace tj
