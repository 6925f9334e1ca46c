// gpu_allreduce_bench: NCCL all-reduce (sum, fp32, in place) bus bandwidth through NcclCommunicator, one thread
// and one GPU per rank, W = the device count (or --world), sizes 8 B .. 1 GiB doubling, as nccl-tests'
// all_reduce_perf -b 8 -e 1G -f 2 reports it: algbw = bytes / time, busbw = algbw * 2 (W - 1) / W.
// Compare with the PyTorch script in docs/gpu.md (torch.distributed.all_reduce over NCCL). Exit 2 without a GPU.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "real/communicator_nccl.h"
#include "real/cuda_check.h"
#include "real/device.h"
#include "real/device_context.h"
#include "real/kv_store.h"

using namespace ddpcheck;

int main(int argc, char** argv) {
  int world = real::DeviceCount();
  int iters = 20, warmup = 5;
  int64_t max_bytes = int64_t{1} << 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--world")) world = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--max-bytes")) max_bytes = std::atoll(argv[i + 1]);
  }
  if (real::DeviceCount() == 0) {
    std::fprintf(stderr, "gpu_allreduce_bench: no CUDA device\n");
    return 2;
  }
  std::printf("# ddpcheck gpu_allreduce_bench: %s\n# W=%d iters=%d warmup=%d\n",
              real::ProvenanceLine(real::GetProvenance()).c_str(), world, iters, warmup);
  std::printf("%12s %12s %10s %10s %10s\n%12s %12s %10s %10s %10s\n", "size", "count", "time", "algbw", "busbw", "(B)",
              "(elements)", "(us)", "(GB/s)", "(GB/s)");
  auto store = std::make_shared<real::MemoryKvStore>();
  std::vector<std::vector<double>> times(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<real::DeviceContext> ctx;
      if (!real::DeviceContext::Create(r, &ctx).ok()) std::abort();
      std::unique_ptr<real::NcclCommunicator> comm;
      core::Status st = real::NcclCommunicator::Create(store, "bench", r, world, ctx.get(), std::chrono::seconds(120), &comm);
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        std::abort();
      }
      float* buf = nullptr;
      DDPCHECK_CUDA(cudaMalloc(&buf, static_cast<size_t>(max_bytes)));
      DDPCHECK_CUDA(cudaMemset(buf, 0, static_cast<size_t>(max_bytes)));
      for (int64_t bytes = 8; bytes <= max_bytes; bytes *= 2) {
        const core::Span span{buf, bytes / 4, core::DType::kFloat32};
        for (int i = 0; i < warmup; ++i) (void)comm->AllReduceSum(span, "warmup");
        (void)comm->Barrier("start");
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) (void)comm->AllReduceSum(span, "bench");
        (void)comm->Synchronize();
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        times[static_cast<size_t>(r)].push_back(us / iters);
      }
      cudaFree(buf);
    });
  }
  for (auto& t : threads) t.join();
  size_t k = 0;
  for (int64_t bytes = 8; bytes <= max_bytes; bytes *= 2, ++k) {
    double us = 0;
    for (const auto& t : times) us = std::max(us, t[k]);  // the slowest rank's time
    const double algbw = static_cast<double>(bytes) / (us * 1e3);
    const double busbw = algbw * 2.0 * (world - 1) / world;
    std::printf("%12lld %12lld %10.1f %10.2f %10.2f\n", static_cast<long long>(bytes),
                static_cast<long long>(bytes / 4), us, algbw, busbw);
  }
  std::printf("# OK\n");
  return 0;
}
