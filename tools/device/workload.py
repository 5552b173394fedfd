"""Workloads for the device check of `gpuq record` (tools/device/record_check.sh).

  exact N      N launches of torch.cuda._sleep (exactly one kernel each), in NVTX steps of 100
  gemm STEPS   a GEMM-bound bf16 MLP step, STEPS times; prints the median step time
  profiled     gemm steps with torch.profiler recording steps 20-30 (coexistence)
Prints `start_ns=` (realtime, before the first launch) and `done_ns=` lines.
"""
import statistics
import sys
import time

import torch

def steps(n, body):
    times = []
    for i in range(n):
        torch.cuda.nvtx.range_push(f"ProfilerStep#{i}")
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        body(i)
        b.record()
        torch.cuda.nvtx.range_pop()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times

def main():
    mode, n = sys.argv[1], int(sys.argv[2])
    torch.cuda.init()
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    w = [torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    torch.cuda.synchronize()
    print(f"start_ns={time.time_ns()}", flush=True)
    if mode == "exact":
        for s in range(0, n, 100):
            torch.cuda.nvtx.range_push(f"ProfilerStep#{s // 100}")
            for _ in range(min(100, n - s)):
                torch.cuda._sleep(1000)
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    elif mode in ("gemm", "profiled"):
        def body(i):
            y = x
            for m in w:
                y = torch.relu(y @ m)
        steps(20, body)  # warm-up
        if mode == "profiled":
            from torch.profiler import ProfilerActivity, profile, schedule
            with profile(activities=[ProfilerActivity.CUDA],
                         schedule=schedule(wait=20, warmup=0, active=10, repeat=1)) as prof:
                def stepped(i):
                    body(i)
                    prof.step()
                t = steps(n, stepped)
            kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
            print(f"torch_profiler_gpu_events={kernels}")
        else:
            t = steps(n, body)
        print(f"median_step_ms={statistics.median(t):.4f}")
    print(f"done_ns={time.time_ns()}", flush=True)

if __name__ == "__main__":
    main()
