"""nn.Module drop-ins for nn.Linear (Linear, FP8Linear, Int8Linear, Int4Linear, MXFP4Linear) and `convert`, which swaps
them into a model. Importing gemmkit.nn registers the custom ops (gemmkit.library)."""

from .. import library  # noqa: F401  (torch.ops.gemmkit.*: torch.compile sees the layers' ops)
from .convert import SCHEMES, ConversionReport, convert
from .layers import FP8Linear, GemmLayer, Int4Linear, Int8Linear, Linear, MXFP4Linear

__all__ = ["SCHEMES", "ConversionReport", "FP8Linear", "GemmLayer", "Int4Linear", "Int8Linear", "Linear", "MXFP4Linear",
           "convert"]
