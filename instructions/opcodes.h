// THE opcode table. Every consumer (enum, names, host encoder, validator, cost,
// CPU reference, device dispatcher) expands this one list, so they cannot drift.
//
//   V(Name, ArgsStruct)   ArgsStruct is defined in instructions/instruction.h.
#pragma once

#define LOOM_OPCODE_LIST(V)      \
  V(EMBED, EmbedArgs)            \
  V(RMS_NORM, RmsNormArgs)       \
  V(MATVEC, MatvecArgs)          \
  V(ROPE_KV_APPEND, RopeAppendArgs) \
  V(ATTN_PARTIAL, AttnPartialArgs) \
  V(ATTN_REDUCE, AttnReduceArgs) \
  V(SILU_MUL, SiluMulArgs)       \
  V(ADD, AddArgs)                \
  V(ARGMAX_PARTIAL, ArgmaxPartialArgs) \
  V(ARGMAX_REDUCE, ArgmaxReduceArgs) \
  V(GEMM, GemmArgs) \
  V(PACK_ROWS, PackRowsArgs) \
  V(FLASH_ATTN, FlashAttnArgs) \
  V(IM2COL, ImToColArgs) \
  V(POOL, PoolArgs) \
  V(ELEMENTWISE, ElementwiseArgs) \
  V(SOFTMAX, SoftmaxArgs) \
  V(NORM_ROWS, NormRowsArgs) \
  V(CONV1D, Conv1dArgs) \
  V(DWCONV, DwConvArgs) \
  V(CONV_GEMM, ConvGemmArgs) \
  V(NHWC_BF16, NhwcBf16Args) \
  V(SUM_SPLITS, SumSplitsArgs) \
  V(MATVEC_FP8, MatvecFp8Args) \
  V(MATVEC_W4, MatvecW4Args)
