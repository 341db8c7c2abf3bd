"""The warp-specialized kernel's compiled instructions at another commit, without a GPU: compiles the WS_CHECKS and
W4_TILE_CHECKS of the gemmkit tree DIR (its own codegen and kernels, for sm_90 with the Triton this Python has) and prints each
binary's `gemmkit.tools.codegen.instruction_digest` (this tree's): equal digests, the same machine code.

    git worktree add /tmp/old <commit>
    python3 scripts/instruction_digests.py /tmp/old [--match grouped]
    python3 scripts/instruction_digests.py . [--match grouped]
"""

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gemmkit.tools.codegen import Binary, instruction_digest  # noqa: E402

DUMP = """
import json, sys
from gemmkit.tools import codegen as c
out = {}
for name, (M, N, K, kw, _mma) in c.WS_CHECKS.items():
    if sys.argv[2] in name:
        out[name] = c.compile_ws(M, N, K, **kw).sass
for name, (M, N, K, kw) in c.W4_TILE_CHECKS.items():
    if sys.argv[2] in name:
        out[name] = c.compile_w4_tile(M, N, K, **kw).sass
json.dump(out, open(sys.argv[1], "w"))
"""


def main(argv):
    tree = os.path.abspath(argv[0]) if argv else "."
    match = argv[argv.index("--match") + 1] if "--match" in argv else ""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = tree
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "sass.json")
        subprocess.run([sys.executable, "-c", DUMP, path, match], env=env, cwd=tree, check=True,
                       stderr=subprocess.DEVNULL)
        for name, sass in json.load(open(path)).items():
            print(instruction_digest(Binary(0, 0, 0, sass, "")), name)


if __name__ == "__main__":
    main(sys.argv[1:])
