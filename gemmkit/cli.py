"""The `gemmkit` command: bench, bench-model, tune, configs, demo."""

from __future__ import annotations

import os
import sys

USAGE = """usage: gemmkit <command> [options]

commands:
  bench   time gemmkit against the torch baseline on model shapes (on a machine without a GPU:
          a CPU demo under the Triton interpreter instead)
  tune    measure candidate configs on the GPU and write the op's JSON config table (yours, by default)
  configs show: which config a call would use and where it came from (your table, the shipped
          one, or derived from the device); no GPU needed
  bench-model  a Llama-style model converted by gemmkit.nn per scheme: logit differences,
          prefill and decode latency (eager, compiled, CUDA graph); without a GPU a CPU smoke run
  demo    run the kernels on the CPU through the Triton interpreter, checked against torch

`gemmkit <command> --help` for the options of each."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("bench", "bench-model", "demo") and "triton.language" not in sys.modules:
        import torch

        if not torch.cuda.is_available():
            # their CPU fallback runs the kernels interpreted: Triton decides that when it defines
            # its jit functions (its own triton.language ones too), so before anything imports them
            os.environ.setdefault("TRITON_INTERPRET", "1")
    if cmd == "bench":
        from .tools.bench import main as run
    elif cmd == "tune":
        from .tools.tune import main as run
    elif cmd == "configs":
        from .tools.configs import main as run
    elif cmd == "bench-model":
        from .tools.bench_model import main as run
    elif cmd == "demo":
        from .tools.demo import main as run
    else:
        print(f"unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
