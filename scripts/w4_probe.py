"""Probe: ways to run the 4-bit weight K loop on Hopper (standalone kernel, not gemmkit's).

Each variant computes y = x @ dequant(w).T for INT4 weights packed two per byte along K (gemmkit's
layout: element 2j in the low nibble of byte j) with one bf16 scale per row and GROUP-wide K group
and an optional uint8 zero point. Variants (constexprs):
- SPLIT: "join" unpacks the tile into (BN, BK) with tl.join (today's kernel), "eo" keeps the even
  (low nibble) and odd (high nibble) halves apart and pairs them with the even / odd columns of x
  (two dots of K = BK / 2; the sum over K does not care about the order of K).
- SWAP: compute the (BN, BM) tile of y^T = w @ x^T, so the dequantized weight is the tensor-core
  instruction's register operand and the token count is its N (no padding of small M to 64).
- DEQ: 0 = int -> fp32 convert, fp32 fma, cvt to bf16 (today); 1 = fp32 from the bits
  (0x4B000000 | q = 2^23 + q), exact subtract, fp32 multiply, cvt; 2 = bf16 from the bits
  (0x4300 | q = 128 + q), exact bf16 subtract and bf16 multiply (no conversions).

`python scripts/w4_probe.py compile` (no GPU; Triton's ptxas for sm_90): SASS counts per variant.
`python scripts/w4_probe.py bench --out DIR` (GPU): times against F.linear on bf16 weights and
gemmkit.gemm_a16w4, checks results.
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import sys
from pathlib import Path

import triton
import triton.language as tl

from gemmkit.kernels.packed import _NIBBLES_BF16, _decode_ptx


@triton.jit
def _unpack_magic2(p):
    """gemmkit.kernels.packed's nibble decoder (0x4300 | q), two bytes at a time instead of four
    (the dot operand layout holds K pairs)."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 t, u;
        cvt.u32.u16 t, $2;
        prmt.b32 t, t, 0, 0x1100;
        lop3.b32 $0, t, 0x000F000F, 0x43004300, 0xEA;
        shr.u32 u, t, 4;
        lop3.b32 $1, u, 0x000F000F, 0x43004300, 0xEA;
        }
        """,
        constraints="=r,=r,h", args=[p], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)


@triton.jit
def _deq(q, s, z, DEQ: tl.constexpr):
    """(q - z) * s as bf16: q uint8 codes (R, C), s (R, 1) scales fp32, z (R, 1) zero points fp32."""
    if DEQ == 0:
        out = (q.to(tl.float32) * s - z * s).to(tl.bfloat16)
    elif DEQ == 1:
        v = (q.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - (z + 8388608.0)
        out = (v * s).to(tl.bfloat16)
    else:
        v = (q.to(tl.int16) | 0x4300).to(tl.bfloat16, bitcast=True)
        out = (v - (z + 128.0).to(tl.bfloat16)) * s.to(tl.bfloat16)
    return out


@triton.jit
def w4_probe_kernel(x, wq, ws, wz, y, M, N, K, stride_xm, stride_wn, stride_sn, stride_ym,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                    SPLIT_K: tl.constexpr, SWAP: tl.constexpr, DEQ: tl.constexpr, SPLIT: tl.constexpr,
                    HAS_ZERO: tl.constexpr, XLOAD: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rn = pid_n * BN + tl.arange(0, BN)
    rm = pid_m * BM + tl.arange(0, BM)
    rb = tl.arange(0, BK // 2)
    k_tiles = K // BK
    per = tl.cdiv(k_tiles, SPLIT_K)
    lo_t = pid_k * per
    hi_t = tl.minimum(lo_t + per, k_tiles)
    if SWAP:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    n_ok = rn < N
    m_ok = rm < M
    for kt in range(lo_t, hi_t):
        p = tl.load(wq + rn[:, None] * stride_wn + (kt * (BK // 2) + rb)[None, :], mask=n_ok[:, None], other=0)
        g = (kt * BK) // GROUP
        s = tl.load(ws + rn * stride_sn + g, mask=n_ok, other=0).to(tl.float32)[:, None]
        if HAS_ZERO:
            z = tl.load(wz + rn * stride_sn + g, mask=n_ok, other=0).to(tl.float32)[:, None]
        else:
            z = tl.full((BN, 1), 8.0, tl.float32)
        if SPLIT == "eo" and DEQ >= 3:
            if DEQ == 3:
                v_e, v_o = _decode_ptx(p, _NIBBLES_BF16, True)  # gemmkit's decoder
            else:
                v_e, v_o = _unpack_magic2(p)
            zb = (z + 128.0).to(tl.bfloat16)
            sb = s.to(tl.bfloat16)
            w_e = (v_e - zb) * sb
            w_o = (v_o - zb) * sb
        if SPLIT == "eo":
            if DEQ < 3:
                w_e = _deq(p & 15, s, z, DEQ)
                w_o = _deq(p >> 4, s, z, DEQ)
            if XLOAD == "strided":
                ke = kt * BK + 2 * rb
                x_e = tl.load(x + rm[:, None] * stride_xm + ke[None, :], mask=m_ok[:, None], other=0.0)
                x_o = tl.load(x + rm[:, None] * stride_xm + (ke + 1)[None, :], mask=m_ok[:, None], other=0.0)
            elif XLOAD == "pairs":  # x as int32 words (x[2j], x[2j + 1]), split in registers
                xw = tl.load(x.to(tl.pointer_type(tl.int32)) + rm[:, None] * (stride_xm // 2) + (kt * (BK // 2) + rb)[None, :],
                             mask=m_ok[:, None], other=0)
                x_e = (xw & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
                x_o = (xw >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
            else:  # "halves": the weight layout puts a tile's first K half in the low nibbles
                kh = kt * BK + rb
                x_e = tl.load(x + rm[:, None] * stride_xm + kh[None, :], mask=m_ok[:, None], other=0.0)
                x_o = tl.load(x + rm[:, None] * stride_xm + (kh + BK // 2)[None, :], mask=m_ok[:, None], other=0.0)
            if SWAP:
                acc = tl.dot(w_e, x_e.T, acc)
                acc = tl.dot(w_o, x_o.T, acc)
            else:
                acc = tl.dot(x_e, w_e.T, acc)
                acc = tl.dot(x_o, w_o.T, acc)
        else:
            q = tl.reshape(tl.join(p & 15, p >> 4), (BN, BK))
            w = _deq(q, s, z, DEQ)
            rk = kt * BK + tl.arange(0, BK)
            xt = tl.load(x + rm[:, None] * stride_xm + rk[None, :], mask=m_ok[:, None], other=0.0)
            if SWAP:
                acc = tl.dot(w, xt.T, acc)
            else:
                acc = tl.dot(xt, w.T, acc)
    if SWAP:
        out = acc.T
    else:
        out = acc
    ptrs = y + rm[:, None] * stride_ym + rn[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        tl.store(ptrs, out.to(y.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(ptrs, out, mask=mask, sem="relaxed")


VARIANTS = {  # name: (SPLIT, SWAP, DEQ[, XLOAD])
    "join-noswap-deq0": ("join", False, 0),
    "join-swap-deq0": ("join", True, 0),
    "eo-noswap-deq0": ("eo", False, 0),
    "eo-swap-deq0": ("eo", True, 0),
    "eo-swap-deq1": ("eo", True, 1),
    "eo-swap-deq2": ("eo", True, 2),
    "eo-noswap-deq2": ("eo", False, 2),
    "join-swap-deq2": ("join", True, 2),
    "eo-swap-asm": ("eo", True, 3),
    "eo-noswap-asm": ("eo", False, 3),
    "eo-swap-asm-pairs": ("eo", True, 3, "pairs"),
    "eo-swap-asm-halves": ("eo", True, 3, "halves"),
    "eo-noswap-asm-halves": ("eo", False, 3, "halves"),
    "eo-swap-deq2-halves": ("eo", True, 2, "halves"),
    "eo-swap-asm2-halves": ("eo", True, 4, "halves"),
    "eo-noswap-asm-pairs": ("eo", False, 3, "pairs"),
    "eo-noswap-asm2-pairs": ("eo", False, 4, "pairs"),
    "eo-noswap-asm-halves-z": ("eo", False, 3, "halves", True),
    "eo-noswap-asm2-halves": ("eo", False, 4, "halves"),
    "eo-noswap-deq2-halves": ("eo", False, 2, "halves"),
}


def _variant(name):
    v = VARIANTS[name]
    return v[0], v[1], v[2], (v[3] if len(v) > 3 else "strided"), (v[4] if len(v) > 4 else False)


def compile_variant(name, BM, BN, BK, warps, stages, split_k=1, zero=False):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    split, swap, deq, xload, _ = _variant(name)
    sig = {"x": "*bf16", "wq": "*u8", "ws": "*bf16", "wz": "*u8", "y": "*fp32" if split_k > 1 else "*bf16",
           "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_sn": "i32",
           "stride_ym": "i32"}
    const = dict(BM=BM, BN=BN, BK=BK, GROUP=128, SPLIT_K=split_k, SWAP=swap, DEQ=deq, SPLIT=split, HAS_ZERO=zero, XLOAD=xload)
    params = [p.name for p in w4_probe_kernel.params]
    for k in const:
        sig[k] = "constexpr"
    constants = {(params.index(k),): v for k, v in const.items()}
    attrs = {(params.index(k),): [["tt.divisibility", 16]] for k in ("x", "wq", "ws", "wz", "y", "K", "stride_xm",
                                                                     "stride_wn", "stride_sn", "stride_ym")}
    sig = {p: sig[p] for p in params}
    c = triton.compile(ASTSource(w4_probe_kernel, sig, constants, attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=stages))
    return c


def sass_counts(cubin: bytes) -> dict:
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    path = Path("/tmp/w4probe.cubin")
    path.write_bytes(cubin)
    sass = subprocess.run([str(tools / "cuobjdump"), "-sass", str(path)], capture_output=True, text=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass)
    keys = ["HGMMA", "HMMA", "LDS", "STS", "LDSM", "STSM", "I2F", "F2F", "F2FP", "HADD2", "HFMA2", "HMUL2",
            "FADD", "FMUL", "FFMA", "LOP3", "PRMT", "SHF", "LDG", "LDGSTS", "BAR", "IMAD", "SEL", "I2FP"]
    out = {}
    for k in keys:
        n = sum(1 for o in ops if o.split(".")[0] == k)
        if n:
            out[k] = n
    out["total"] = len(ops)
    res = subprocess.run([str(tools / "cuobjdump"), "-res-usage", str(path)], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", res)
    if m:
        out["regs"], out["stack"] = int(m.group(1)), int(m.group(2))
    return out


def cmd_compile(args):
    for name in args.variants or VARIANTS:
        for BM, BN, BK, warps, stages in ((16, 128, 128, 4, 4), (128, 128, 128, 8, 3)):
            try:
                c = compile_variant(name, BM, BN, BK, warps, stages)
                counts = sass_counts(c.asm["cubin"])
                print(f"{name:18s} BM={BM:3d} BN={BN} BK={BK} w={warps} s={stages} smem={c.metadata.shared} "
                      f"{counts}")
            except Exception as e:  # noqa: BLE001
                print(f"{name:18s} BM={BM} failed: {str(e).splitlines()[0][:200]}")


def cmd_bench(args):
    import torch

    import gemmkit
    from gemmkit import quant

    torch.manual_seed(0)
    dev = "cuda"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []

    def time_graph(fn, rep_ms=8):
        fn()
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(10):
                    fn()
        torch.cuda.synchronize()
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        g.replay()
        torch.cuda.synchronize()
        st.record()
        g.replay()
        en.record()
        torch.cuda.synchronize()
        once = st.elapsed_time(en) / 10
        reps = max(3, int(rep_ms / max(once, 1e-3) / 10))
        st.record()
        for _ in range(reps):
            g.replay()
        en.record()
        torch.cuda.synchronize()
        return st.elapsed_time(en) / reps / 10 * 1e3

    shapes = [(4096, 14336), (8192, 8192)]
    small = [(16, 128, 128, 4, 3), (16, 128, 256, 4, 3), (16, 64, 256, 4, 4)]
    configs = {1: small, 16: small,
               1024: [(128, 128, 128, 8, 3), (256, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4)]}
    for (N, K), M in itertools.product(shapes, (16,)):
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05
        wq, s, z = quant.quantize_int4(w, group_size=128, symmetric=True)
        wd = quant.dequantize_int4(wq, s, z, group_size=128).to(torch.bfloat16)
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        ref = (x.double() @ wd.double().T)
        t_base = time_graph(lambda: torch.nn.functional.linear(x, wd))
        t_gk = time_graph(lambda: gemmkit.gemm_a16w4(x, wq, s, z, group_size=128))
        lines.append(f"N={N} K={K} M={M}: cuBLAS bf16 {t_base:.1f} us, gemmkit a16w4 {t_gk:.1f} us "
                     f"({t_base / t_gk:.2f}x)")
        s16 = s.to(torch.bfloat16).contiguous()
        wq_a, s_a, z_a = quant.quantize_int4(w, group_size=128, symmetric=False)
        sa16 = s_a.to(torch.bfloat16).contiguous()
        t_gka = time_graph(lambda: gemmkit.gemm_a16w4(x, wq_a, s_a, z_a, group_size=128))
        lines.append(f"   gemmkit asymmetric {t_gka:.1f} us")
        for cfg in (dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=256, SPLIT_K=4, num_warps=4, num_stages=3),
                    dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=4, num_warps=4, num_stages=3)):
            t_c = time_graph(lambda: gemmkit.gemm_a16w4(x, wq, s, z, group_size=128, config=cfg))
            lines.append(f"   gemmkit symmetric {cfg['BLOCK_K']} sk4 {t_c:.1f} us")
        refs_h = {}
        ref_h = None
        for name, (BM, BN, BK, warps, stages) in itertools.product(args.variants or VARIANTS, configs[M]):
            split, swap, deq, xload, has_zero = _variant(name)
            zq = z_a if has_zero else None
            ref_v = ref_h if xload == "halves" and BK not in refs_h else None
            if xload == "halves":
                if (BK, has_zero) not in refs_h:
                    wh = halves_weight(wq_a if has_zero else wq, s_a if has_zero else s, BK, z=zq)
                    refs_h[BK, has_zero] = x.double() @ wh.double().T
                ref_v = refs_h[BK, has_zero]
            else:
                ref_v = ref
            n_tiles = triton.cdiv(N, BN) * triton.cdiv(M, BM)
            split_k = 1
            if n_tiles < 132:
                split_k = max(1, min(132 * 2 // n_tiles, K // BK // 4, 16))
            yb = torch.empty(M, N, device=dev, dtype=torch.float32 if split_k > 1 else torch.bfloat16)
            grid = (triton.cdiv(N, BN), triton.cdiv(M, BM), split_k)

            def run():  # split-K partial sums are added to y: the check zeroes it first, the timing not
                w4_probe_kernel[grid](x, wq_a if zq is not None else wq, sa16 if zq is not None else s16, zq, yb, M,
                                      N, K, x.stride(0), wq.stride(0), s16.stride(0),
                                      yb.stride(0), BM=BM, BN=BN, BK=BK, GROUP=128, SPLIT_K=split_k, SWAP=swap,
                                      DEQ=deq, SPLIT=split, HAS_ZERO=zq is not None, XLOAD=xload, num_warps=warps,
                                      num_stages=stages)
            try:
                yb.fill_(float("nan"))
                if split_k > 1:
                    yb.zero_()
                run()
                torch.cuda.synchronize()
                err = ((yb.double() - ref_v).norm() / ref_v.norm()).item()
                t = time_graph(run)
            except Exception as e:  # noqa: BLE001
                lines.append(f"   {name} {BM}x{BN}x{BK} w{warps} s{stages}: failed {str(e).splitlines()[0][:150]}")
                continue
            gbs = (N * K / 2 + N * K / 128 * 2) / t / 1e3
            lines.append(f"   {name:18s} {BM}x{BN}x{BK} w{warps} s{stages} sk{split_k}: {t:7.1f} us "
                         f"{t_base / t:5.2f}x cuBLAS {gbs:6.0f} GB/s err {err:.1e}")
        print("\n".join(lines[-1 - len(configs[M]) * len(args.variants or VARIANTS):]), flush=True)
    (out / "w4_probe.txt").write_text("\n".join(lines) + "\n")


def halves_weight(wq, s, BK, group=128, z=None):
    """The bf16 (N, K) weight that packed bytes `wq` hold in the "halves" layout: in each BK tile,
    byte j's low nibble is element j and its high nibble element BK / 2 + j (symmetric, zero 8)."""
    import torch

    N, KB = wq.shape
    t = wq.view(N, KB // (BK // 2), BK // 2)
    q = torch.cat([t & 15, t >> 4], dim=2).reshape(N, 2 * KB).float()
    zz = 8 if z is None else z.float().repeat_interleave(group, dim=1)
    return ((q - zz) * s.float().repeat_interleave(group, dim=1)).to(torch.bfloat16)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["compile", "bench"])
    ap.add_argument("--variants", nargs="*")
    ap.add_argument("--out", default="/tmp/w4probe")
    args = ap.parse_args(argv)
    {"compile": cmd_compile, "bench": cmd_bench}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
