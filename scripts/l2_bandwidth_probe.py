"""Probe (device tool, H100): the L2 -> SM read bandwidth ceiling, and what this Triton's Gluon offers
for clusters and TMA multicast. A Triton kernel whose programs read a buffer that fits in L2 again
and again (16-byte vectors, summed so the loads stay), timed by CUDA-graph replay; HBM (a buffer of
8x the L2) for comparison. Prints bytes read per second for each buffer size and program count.

    python3 scripts/l2_bandwidth_probe.py [OUT]
"""

import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gemmkit.tools.timing import time_graphs_us  # noqa: E402


@triton.jit
def read_kernel(src, out, n_words, passes, BLOCK: tl.constexpr):
    """Program p reads blocks p, p + P, ... of src (int32) in pass 0, blocks p + 1, p + 1 + P, ... in pass 1,
    and so on (never the same addresses twice in a row), bypassing L1 (.cg: the L2 serves every load)."""
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    step = progs * BLOCK
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in range(passes):
        for start in range(((pid + i * 7) % progs) * BLOCK, n_words, step):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(src + offs, mask=offs < n_words, other=0, cache_modifier=".cg")
    tl.store(out + pid * BLOCK + tl.arange(0, BLOCK), acc)


def main():
    out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
    props = torch.cuda.get_device_properties(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MB", file=out, flush=True)
    try:
        from triton.experimental.gluon.language.nvidia.hopper import tma
        for name in ("async_copy_global_to_shared", "async_load"):
            if hasattr(tma, name):
                print(f"gluon hopper tma.{name}{inspect.signature(getattr(tma, name))}", file=out)
        from triton.experimental import gluon
        print(f"gluon.jit options: {sorted(k for k in inspect.signature(gluon.jit).parameters)}", file=out)
        import triton.backends.nvidia.compiler as nvc
        fields = getattr(nvc.CUDAOptions, "__dataclass_fields__", {})
        print(f"CUDAOptions cluster/cta fields: {sorted(k for k in fields if 'cluster' in k or 'cta' in k)}", file=out)
    except Exception as e:  # noqa: BLE001 - a probe reports and goes on
        print(f"gluon API: {type(e).__name__}: {e}", file=out)
    sms = props.multi_processor_count
    for mb, passes in ((24, 20), (400, 1)):
        words = mb * (1 << 20) // 4
        src = torch.randint(0, 100, (words,), device="cuda", dtype=torch.int32)
        for per_sm in (4, 8, 16):
            progs, block = sms * per_sm, 1024
            sink = torch.empty(progs * block, device="cuda", dtype=torch.int32)
            call = [lambda: read_kernel[(progs,)](src, sink, words, passes, BLOCK=block, num_warps=4)]
            (us,) = time_graphs_us(call, rep_ms=20, retries=5)
            print(f"buffer {mb:4d} MB x {passes:2d} passes, {progs:5d} programs ({per_sm} per SM): {us:8.1f} us, "
                  f"{mb * passes * (1 << 20) / us / 1e6:6.2f} TB/s read", file=out, flush=True)


if __name__ == "__main__":
    main()
