"""GPU code generation checked without a GPU: the shared kernel compiled offline for sm_90
(gemmkit.tools.codegen) on the paths the interpreter cannot lower: TMA, persistent, stream-K,
split-K, in-kernel quantization. Each must compile with no local memory (spills), at most 255
registers, and the expected tensor-core instructions (warpgroup MMA for large tiles); the
persistent TMA configs' K loop must cost what a bare tutorial-09 kernel's does. The Gluon kernel
(kernels/gemm_ws.py) is compiled the same way, in the variants core/hopper_ws.py launches, and
the INT4 decode kernel (kernels/gemm_w4_decode.py) in those of core/hopper_w4.py."""

import os
import subprocess
import sys

from gemmkit.tools import codegen


def test_gpu_paths_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # JIT functions, not interpreted
    run = subprocess.run([sys.executable, "-m", "gemmkit.tools.codegen"], env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len([ln for ln in lines if ln.startswith("ok ")]) == (len(codegen.CHECKS) + len(codegen.WS_CHECKS)
                                                                  + len(codegen.W4_CHECKS)
                                                                  + len(codegen.W4_PREFILL_CHECKS)
                                                                  + len(codegen.W4_TILE_CHECKS)), run.stdout


def test_instruction_digest_ignores_addresses_and_source_lines():
    """`codegen --digest`: two binaries whose instructions are the same at other addresses and source lines have
    one digest; another instruction changes it."""
    a = ("\t//## File \"gemm_ws.py\", line 10\n        /*0000*/                   MOV R1, c[0x0][0x28] ;\n"
         "        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;\n")
    b = ("\t//## File \"gemm_ws.py\", line 57\n        /*0100*/                   MOV R1, c[0x0][0x28] ;\n"
         "        /*0110*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;\n")
    c = b.replace("MOV R1", "MOV R2")
    digest = [codegen.instruction_digest(codegen.Binary(0, 0, 0, t, "")) for t in (a, b, c)]
    assert digest[0] == digest[1] != digest[2] and digest[0].endswith(" 2")
