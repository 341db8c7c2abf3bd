"""Hash the SASS of every gemmkit.tools.codegen check path (instructions only: addresses, encodings
and line information dropped), to tell whether a source change altered any compiled kernel.

Run in two trees and compare the outputs (no GPU; Triton's ptxas for sm_90):
    env -u TRITON_INTERPRET PYTHONPATH=. python scripts/sass_compare.py > new.txt
    (cd OLD_TREE && env -u TRITON_INTERPRET PYTHONPATH=. python /path/to/scripts/sass_compare.py) > old.txt
    diff old.txt new.txt
A path the tree cannot compile prints ERR (older trees lack some checks' arguments)."""

import hashlib
import re

from gemmkit.core.config import GemmConfig
from gemmkit.tools import codegen as c


def sass_hash(sass: str) -> str:
    ops = [re.sub(r"/\*.*?\*/", "", line).strip() for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    return hashlib.sha1("\n".join(ops).encode()).hexdigest()[:16]


for name, (M, N, K, cfg, kw, _) in c.CHECKS.items():
    cfg = GemmConfig.from_dict(cfg)
    try:
        if "tile_map" in kw:
            b = c.compile_grouped(M, N, K, cfg, **kw)
        elif kw.get("packed"):
            b = c.compile_packed(M, N, K, cfg, **kw)
        else:
            b = c.compile_gemm(M, N, K, cfg, **kw)
        print(sass_hash(b.sass), name, flush=True)
    except Exception as e:  # noqa: BLE001
        print("ERR", name, str(e).splitlines()[0][:80] if str(e) else type(e).__name__, flush=True)
