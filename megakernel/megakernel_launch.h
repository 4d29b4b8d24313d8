// Host entry to the persistent kernel (megakernel.cu).
#pragma once

#include <cuda_runtime.h>

#include "megakernel/kernel_params.h"

namespace loom::megakernel {

// Launches one block per SM (num_sms blocks, all co-resident or an error).
cudaError_t LaunchMegakernel(const KernelParams& params, uint32_t num_sms, uint32_t smem_bytes, cudaStream_t stream);

// Whether this build of the kernel has `variant` (isa::KernelVariant). Every build has every variant but the
// debug library that tests/gpu_debug_test.cc links (LOOM_DEBUG_DECODE_VARIANT_ONLY: the decode variant alone, as
// each variant's debug build costs a CPU-minute or more of the fresh-clone test build; -DLOOM_DEVICE_DEBUG=ON
// builds every variant with bounded waits).
bool MegakernelHasVariant(uint32_t variant);

}  // namespace loom::megakernel
