// --device auto|cpu|gpu: device selection against made-up machines (no driver, an old GPU, too little
// free memory, several GPUs, NVRTC missing, a model with types the GPU cannot run) with the spec's
// messages, the memory estimate, and the real machine's answer when it has no NVIDIA driver.
#include <gtest/gtest.h>

#include "jit/cuda/cuda_device.h"
#include "jit/cuda/device_select.h"
#include "jit/cuda/driver.h"
#include "jit/cuda/weight_pack.h"
#include "model/arch.h"
#include "common/error.h"
#include "model/gguf.h"
#include "support.h"

namespace dllm::test {
namespace {

namespace jc = dllm::jit::cuda;
constexpr uint64_t GiB = uint64_t{1} << 30;
constexpr const char* kNoGpu =
    "no GPU found: the GPU backend needs an NVIDIA GPU with compute capability 8.0 or newer (run with --device cpu)";

jc::DeviceInfo gpu(int ordinal, const char* name, int major, int minor, uint64_t free_bytes) {
  jc::DeviceInfo d;
  d.ordinal = ordinal;
  d.name = name;
  d.cc_major = major;
  d.cc_minor = minor;
  d.sm_count = 80;
  d.total_bytes = free_bytes + GiB;
  d.free_bytes = free_bytes;
  return d;
}

jc::GpuProbe machine(std::vector<jc::DeviceInfo> devices, bool nvrtc = true) {
  jc::GpuProbe p;
  p.driver_loaded = !devices.empty();
  if (devices.empty()) p.driver_error = "cannot load libcuda.so.1";
  p.devices = std::move(devices);
  p.nvrtc_loaded = nvrtc;
  if (!nvrtc) p.nvrtc_error = "cannot load NVRTC (the CUDA run-time compiler); tried libnvrtc.so";
  return p;
}

std::string error_of(const std::string& req, uint64_t need, const jc::GpuProbe& p, const std::string& unsupported = {}) {
  try {
    jc::select_device(req, need, p, unsupported);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 1);
    return e.what();
  }
  return "(no error)";
}

TEST(GpuSelect, CpuIsAlwaysTheCpu) {
  const jc::DeviceChoice c = jc::select_device("cpu", 5 * GiB, machine({gpu(0, "NVIDIA H200", 9, 0, 100 * GiB)}));
  EXPECT_EQ(c.device, jc::DeviceKind::Cpu);
  EXPECT_EQ(c.reason, "--device cpu");
}

TEST(GpuSelect, NoGpu) {
  EXPECT_EQ(error_of("gpu", GiB, machine({})), kNoGpu);
  const jc::DeviceChoice c = jc::select_device("auto", GiB, machine({}));
  EXPECT_EQ(c.device, jc::DeviceKind::Cpu);
  EXPECT_EQ(c.reason, std::string("--device auto fell back to the CPU: ") + kNoGpu);
}

TEST(GpuSelect, TooOldGpu) {
  const auto m = machine({gpu(0, "NVIDIA GeForce GTX 1080", 6, 1, 7 * GiB)});
  EXPECT_EQ(error_of("gpu", GiB, m),
            "GPU 0 (NVIDIA GeForce GTX 1080) has compute capability 6.1: the GPU backend needs 8.0 or newer "
            "(run with --device cpu)");
  EXPECT_EQ(jc::select_device("auto", GiB, m).device, jc::DeviceKind::Cpu);
  // 7.5 (Turing) is too old as well.
  EXPECT_NE(error_of("gpu", GiB, machine({gpu(0, "Tesla T4", 7, 5, 15 * GiB)})).find("compute capability 7.5"),
            std::string::npos);
}

TEST(GpuSelect, TooLittleFreeMemorySaysHowMuchIsNeededAndFree) {
  const auto m = machine({gpu(0, "NVIDIA A10", 8, 6, static_cast<uint64_t>(7.9 * GiB))});
  EXPECT_EQ(error_of("gpu", static_cast<uint64_t>(9.3 * GiB), m),
            "not enough free GPU memory on GPU 0 (NVIDIA A10): the model needs 9.3 GiB, 7.9 GiB is free "
            "(run with --device cpu)");
  const jc::DeviceChoice c = jc::select_device("auto", static_cast<uint64_t>(9.3 * GiB), m);
  EXPECT_EQ(c.device, jc::DeviceKind::Cpu);
  EXPECT_NE(c.reason.find("the model needs 9.3 GiB, 7.9 GiB is free"), std::string::npos) << c.reason;
}

TEST(GpuSelect, UsableGpuIsPreferredByAutoAndNamedInTheReason) {
  const auto m = machine({gpu(0, "NVIDIA H200", 9, 0, 139 * GiB)});
  for (const char* req : {"auto", "gpu"}) {
    const jc::DeviceChoice c = jc::select_device(req, 6 * GiB, m);
    EXPECT_EQ(c.device, jc::DeviceKind::Gpu);
    EXPECT_EQ(c.gpu_ordinal, 0);
    EXPECT_EQ(c.reason, "GPU 0 (NVIDIA H200), compute capability 9.0, 139.0 GiB free, the model needs 6.0 GiB");
  }
}

TEST(GpuSelect, FirstGpuThatFitsAmongSeveral) {
  const auto m = machine({gpu(0, "Old", 7, 0, 30 * GiB), gpu(1, "Small", 8, 0, 2 * GiB), gpu(2, "Big", 8, 9, 40 * GiB)});
  const jc::DeviceChoice c = jc::select_device("gpu", 10 * GiB, m);
  EXPECT_EQ(c.gpu_ordinal, 2);
  // None fits: the message names the first capable GPU.
  EXPECT_EQ(error_of("gpu", 50 * GiB, m).rfind("not enough free GPU memory on GPU 1 (Small)", 0), 0u);
}

TEST(GpuSelect, NvrtcMissing) {
  const auto m = machine({gpu(0, "NVIDIA L4", 8, 9, 20 * GiB)}, false);
  EXPECT_EQ(error_of("gpu", GiB, m).rfind("the GPU backend needs NVRTC (libnvrtc.so from the CUDA toolkit", 0), 0u);
  EXPECT_EQ(jc::select_device("auto", GiB, m).device, jc::DeviceKind::Cpu);
}

TEST(GpuSelect, ModelWithoutGpuKernels) {
  const auto m = machine({gpu(0, "NVIDIA L4", 8, 9, 20 * GiB)});
  const std::string why = "tensor output.weight is F16: the GPU backend has matrix kernels for Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0 "
                          "(run with --device cpu)";
  EXPECT_EQ(error_of("gpu", GiB, m, why), why);
  const jc::DeviceChoice c = jc::select_device("auto", GiB, m, why);
  EXPECT_EQ(c.device, jc::DeviceKind::Cpu);
  EXPECT_EQ(c.reason, "--device auto fell back to the CPU: " + why);
}

TEST(GpuSelect, BadValueIsAUsageError) {
  try {
    jc::select_device("tpu", GiB, machine({}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_STREQ(e.what(), "flag --device must be auto, cpu or gpu, got 'tpu'");
  }
}

TEST(GpuSelect, MemoryEstimateCoversThePackedWeights) {
  const auto file = gguf::File::open(data_path("models/tiny-llada-Q4_K_M.gguf"));
  const model::HParams hp = model::read_hparams(*file);
  const model::ModelTensors t = model::check_tensors(*file, hp);
  uint64_t packed = 0;
  for (const auto& l : t.layers) {
    for (const gguf::TensorInfo* m : {l.wq, l.wk, l.wv, l.wo, l.ffn_gate, l.ffn_up, l.ffn_down}) {
      packed += jc::packed_layout(*m).device_bytes();
    }
  }
  packed += jc::packed_layout(*t.output).device_bytes();
  const uint64_t small = jc::gpu_memory_needed(hp, t, 64), large = jc::gpu_memory_needed(hp, t, 4096);
  EXPECT_GT(small, packed);
  EXPECT_GT(large, small);  // the workspace grows with the canvas
  EXPECT_LT(small, packed + (uint64_t{600} << 20));
}

TEST(GpuSelect, ThisMachineWithoutADriverHasNoGpu) {
  if (jc::Driver::get()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  EXPECT_NE(jc::Driver::load_error().find("libcuda.so.1"), std::string::npos) << jc::Driver::load_error();
  const jc::GpuProbe p = jc::probe_gpus();
  EXPECT_FALSE(p.driver_loaded);
  EXPECT_TRUE(p.devices.empty());
  try {
    jc::select_device("gpu", GiB);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), kNoGpu);
  }
  EXPECT_EQ(jc::select_device("auto", GiB).device, jc::DeviceKind::Cpu);
  try {
    jc::CudaDevice::open(0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), kNoGpu);
  }
}

}  // namespace
}  // namespace dllm::test
