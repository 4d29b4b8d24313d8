// Host entry to the persistent kernel (megakernel.cu).
#pragma once

#include <cuda_runtime.h>

#include "megakernel/kernel_params.h"

namespace loom::megakernel {

// Launches one block per SM (num_sms blocks, all co-resident or an error).
cudaError_t LaunchMegakernel(const KernelParams& params, uint32_t num_sms, uint32_t smem_bytes, cudaStream_t stream);

}  // namespace loom::megakernel
