"""Grid dependency control (programmatic dependent launch, sm_90+): a kernel launched with
launch_pdl=True may start while the kernel before it on the stream still runs, once every
program of that kernel has called gdc_launch_dependents (or exited); gdc_wait then blocks until
the earlier kernel has completed and its writes are visible. Both are no-ops without PDL. Where
this Triton lacks them (older than 3.4), PDL_AVAILABLE is False and the plans do not ask for it.
"""

try:
    from triton.language.extra.cuda.gdc import gdc_launch_dependents, gdc_wait

    PDL_AVAILABLE = True
except ImportError:  # pragma: no cover - Triton < 3.4
    import triton

    PDL_AVAILABLE = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass

__all__ = ["PDL_AVAILABLE", "gdc_launch_dependents", "gdc_wait"]
