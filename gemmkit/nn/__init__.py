"""nn.Module drop-ins for nn.Linear (Linear, FP8Linear, Int8Linear, BlockFP8Linear, Int4Linear, MXFP4Linear), for
gated MLPs (GatedMLP) and MoE experts modules (MoEExperts), and `convert`, which swaps them into a model. Importing
gemmkit.nn registers the custom ops (gemmkit.library)."""

from .. import library  # noqa: F401  (torch.ops.gemmkit.*: torch.compile sees the layers' ops)
from .convert import SCHEMES, ConversionReport, convert
from .layers import BlockFP8Linear, FP8Linear, GemmLayer, Int4Linear, Int8Linear, Linear, MXFP4Linear
from .mlp import GatedMLP
from .moe import MoEExperts

__all__ = ["SCHEMES", "BlockFP8Linear", "ConversionReport", "FP8Linear", "GatedMLP", "GemmLayer", "Int4Linear",
           "Int8Linear", "Linear", "MXFP4Linear", "MoEExperts", "convert"]
