// Every opcode family's device code: its consumer entry points and its loader hooks (ops/loader_context.cuh; in
// <family>_hooks.cuh where the family's file is long). The kernel's roles include this one header; a new family's
// header is one line here.
#pragma once

#include "megakernel/ops/attention.cuh"
#include "megakernel/ops/attention_hooks.cuh"
#include "megakernel/ops/conv.cuh"
#include "megakernel/ops/conv_gemm.cuh"
#include "megakernel/ops/elementwise.cuh"
#include "megakernel/ops/flash.cuh"
#include "megakernel/ops/gemm.cuh"
#include "megakernel/ops/matvec.cuh"
#include "megakernel/ops/matvec_hooks.cuh"
#include "megakernel/ops/pack_rows.cuh"
#include "megakernel/ops/sum_splits.cuh"
#include "megakernel/ops/vector.cuh"
