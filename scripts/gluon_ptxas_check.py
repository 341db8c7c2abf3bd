"""Device check: compile scripts/gluon_blockscale_probe.py's kernel (deferred promotion: two products
in turn, `warpgroup_mma_wait(num_outstanding=1)`) and print ptxas's verdict on its wgmma pipeline
(`ptxas -v`, Triton's own ptxas) and the PTX wait counts: ptxas 12.x serializes every wgmma of a
function where non-wgmma instructions read an in-flight group's accumulator registers within a
pipeline stage (C7514), which the deferred promotion does by design.

    python3 scripts/gluon_ptxas_check.py
"""

import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402

import gluon_blockscale_probe as probe  # noqa: E402
from gemmkit.tools.registry import get_op  # noqa: E402

inp = get_op("a8w8_blockscale").make_inputs(512, 512, 1024, "e4m3", "cuda")
probe.run(inp["x"], inp["w"], inp["xs"], inp["ws"], (64, 128, 128), 3, True, 4)
for promote in (True, 2):  # the warp-specialized kernel with its scale loads, and without them
    probe.run_ws(inp["x"], inp["w"], inp["xs"], inp["ws"], 128, 4, False, promote)
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
for kernel in (probe.blockscale_kernel, probe.blockscale_ws_kernel):
    for cache in kernel.device_caches.values():
        for k in cache[0].values():
            print(kernel.__name__, "PTX wgmma waits:", re.findall(r"wgmma.wait_group.sync.aligned (\d+)", k.asm["ptx"]))
            with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                f.write(k.asm["ptx"])
            r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
            print(r.stdout, r.stderr)
            sass = k.asm.get("sass", "") if hasattr(k.asm, "get") else ""
            print("  SASS: QGMMA", len(re.findall(r"QGMMA", sass)), "DEPBAR", len(re.findall(r"WARPGROUP.DEPBAR", sass)),
                  "BAR.SYNC", len(re.findall(r"BAR.SYNC", sass)), "LDG", len(re.findall(r"LDG", sass)))
