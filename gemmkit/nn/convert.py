"""`convert(model, scheme)`: replace a model's nn.Linear modules by gemmkit layers, in place."""

from __future__ import annotations

import dataclasses
import fnmatch
import warnings

from torch import nn

from .layers import _DTYPES, BlockFP8Linear, FP8Linear, Int4Linear, Int8Linear, Linear, MXFP4Linear
from .mlp import SCHEMES as MLP_SCHEMES, GatedMLP, mlp_linears
from .moe import SCHEMES as MOE_SCHEMES, MoEExperts, experts_weights

# scheme name -> layer class (with from_linear(linear, **options) and unsupported(linear));
# a new scheme ("fp8_block", "int4", ...) is one entry here.
SCHEMES = {
    "bf16": Linear,
    "fp8": FP8Linear,
    "int8": Int8Linear,
    "fp8_block": BlockFP8Linear,
    "int4": Int4Linear,  # options: group_size=128, symmetric=False
    "mxfp4": MXFP4Linear,
}


@dataclasses.dataclass
class ConversionReport:
    """What convert() did, by qualified module name."""

    scheme: str
    converted: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)  # by the caller's skip=
    unsupported: dict = dataclasses.field(default_factory=dict)  # name -> why it was left alone
    fused: list = dataclasses.field(default_factory=list)  # gated MLP modules replaced by GatedMLP (fuse_mlp)
    experts: list = dataclasses.field(default_factory=list)  # MoE experts modules replaced by MoEExperts

    def __str__(self) -> str:
        lines = [f"gemmkit.nn.convert(scheme={self.scheme!r}): {len(self.converted)} converted, "
                 f"{len(self.skipped)} skipped, {len(self.unsupported)} left alone (unsupported)"]
        for title, names in (("converted", self.converted), ("skipped", self.skipped),
                             ("fused MLPs", self.fused), ("MoE experts", self.experts)):
            if names:
                lines.append(f"  {title}: {', '.join(names)}")
        lines += [f"  left alone: {name} ({why})" for name, why in self.unsupported.items()]
        return "\n".join(lines)


def _skip_predicate(skip):
    if skip is None:
        return lambda name, module: False
    if callable(skip):
        return skip
    if isinstance(skip, str):
        skip = [skip]
    patterns = list(skip)
    if not all(isinstance(p, str) for p in patterns):
        raise TypeError("skip must be None, a list of fnmatch patterns or a predicate (name, module) -> bool")
    return lambda name, module: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _dtype_unsupported(linear: nn.Linear, dtype) -> str | None:
    """Why from_linear would refuse this layer's activations' dtype (None: it takes it)."""
    if dtype is None and linear.weight.dtype not in _DTYPES:
        return (f"its weight is {str(linear.weight.dtype).replace('torch.', '')}: pass dtype=torch.bfloat16 or "
                "torch.float16 (the activations' dtype) to convert it")
    return None


def _by_object(model, cls) -> list:
    """(module, every qualified name it has) of the model's modules of `cls`: a module held at several paths (tied,
    shared) once, with all of them."""
    found = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if name and isinstance(module, cls):
            found.setdefault(id(module), (module, []))[1].append(name)
    return list(found.values())


def _replace(model, names, layer) -> None:
    """`layer` at each of the qualified names (one object: a shared module stays shared)."""
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, layer)


def _fuse_mlps(model, scheme, skipped, report, dtype=None) -> None:
    """Replace each gated MLP module (gate_proj/up_proj or gate_up_proj, down_proj, act_fn) by a
    GatedMLP of the scheme, unless skipped (the module or one of its linears, at any of its paths) or unsupported."""
    for module, names in _by_object(model, nn.Module):
        if not hasattr(module, "down_proj") or not hasattr(module, "act_fn"):
            continue
        if not (hasattr(module, "gate_up_proj") or (hasattr(module, "gate_proj") and hasattr(module, "up_proj"))):
            continue
        if any(skipped(name, module) or any(skipped(f"{name}.{n}", m) for n, m in module.named_children())
               for name in names):
            continue
        found = mlp_linears(module)
        if isinstance(found, str):
            continue  # its linears are converted one by one
        try:
            layer = GatedMLP.from_module(module, scheme=scheme, dtype=dtype)
        except (TypeError, ValueError):
            continue
        _replace(model, names, layer)
        report.fused.extend(names)


def _convert_experts(model, scheme, skipped, report, dtype=None) -> None:
    """Replace each transformers-style MoE experts module (3-D gate_up_proj / down_proj, act_fn: moe.experts_weights)
    by a MoEExperts of the scheme, unless skipped; schemes without grouped kernels and modules MoEExperts cannot take
    are reported as left alone."""
    todo = []
    for module, names in _by_object(model, nn.Module):
        if isinstance(experts_weights(module), str):
            continue
        if any(skipped(name, module) for name in names):
            report.skipped.extend(names)
        elif scheme not in MOE_SCHEMES:
            report.unsupported.update(dict.fromkeys(
                names, f"MoE experts: scheme {scheme!r} has no grouped kernels (MoEExperts takes {MOE_SCHEMES})"))
        elif why := MoEExperts.unsupported(module, scheme, dtype):
            report.unsupported.update(dict.fromkeys(names, f"MoE experts: {why}"))
        else:
            todo.append((module, names))
    for module, names in todo:
        _replace(model, names, MoEExperts.from_module(module, scheme=scheme, dtype=dtype))
        report.experts.extend(names)


def convert(model: nn.Module, scheme: str = "fp8", skip=None, fuse_mlp: bool = False, experts: bool = True,
            **options) -> ConversionReport:
    """Replace every nn.Linear in `model` (exactly nn.Linear, not subclasses, which may be used
    by their parent in other ways) by the scheme's gemmkit layer, in place.

    scheme: a key of SCHEMES ("bf16", "fp8", "int8", "fp8_block", "int4", "mxfp4"). skip: fnmatch patterns on
    qualified module
    names (e.g. ["lm_head", "*.gate"]) or a predicate (name, module) -> bool; those stay
    nn.Linear. Layers the scheme cannot take (e.g. 8-bit with in/out features not multiples of
    16) stay too, with one warning naming them. options: passed to the layer's from_linear
    (e.g. dtype=). fuse_mlp=True (schemes "bf16", "fp8"): first replace each Llama/Qwen-style
    gated MLP module (attributes gate_proj + up_proj or gate_up_proj, down_proj, act_fn) by a
    gemmkit.nn.GatedMLP (the gate and up GEMMs fused, two launches per MLP); its linears are then
    not converted one by one. experts=True (default; schemes "bf16", "fp8", "fp8_block"): each mixture-of-experts
    experts module of transformers' form (3-D gate_up_proj (E, 2I, H) and down_proj (E, H, I), act_fn, called as
    experts(hidden_states, top_k_index, top_k_weights): Mixtral, Qwen3-MoE, ...) is replaced by a
    gemmkit.nn.MoEExperts (moe_mlp: inference only), the router left as it is; with other schemes such modules are
    left alone and reported. Returns a ConversionReport (MLPs replaced: report.fused, experts: report.experts)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r} is not one of {sorted(SCHEMES)}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if type(model) is nn.Linear:
        raise TypeError("model is itself an nn.Linear, which cannot be replaced in place: use "
                        f"gemmkit.nn.SCHEMES[{scheme!r}].from_linear(linear)")
    if options.get("dtype") is not None and options["dtype"] not in _DTYPES:
        raise TypeError(f"dtype={options['dtype']}: the activations' dtype must be torch.bfloat16 or torch.float16")
    layer_cls, skipped = SCHEMES[scheme], _skip_predicate(skip)
    report = ConversionReport(scheme)
    if fuse_mlp:
        if scheme not in MLP_SCHEMES:
            raise ValueError(f"fuse_mlp=True takes scheme {' or '.join(map(repr, MLP_SCHEMES))}, got {scheme!r}")
        if set(options) - {"dtype"}:  # (GatedMLP would not apply them: the fused and unfused layers would differ)
            extra = sorted(set(options) - {"dtype"})
            raise ValueError(f"fuse_mlp=True takes no options but dtype= (GatedMLP has no {extra}); convert the MLPs "
                             "and the other linears in two calls")
        _fuse_mlps(model, scheme, skipped, report, options.get("dtype"))
    if experts:
        _convert_experts(model, scheme, skipped, report, options.get("dtype"))
    todo = []  # (every layer decided before any is replaced: a refusal leaves the model as it was)
    for module, names in _by_object(model, nn.Linear):
        if any(skipped(name, module) for name in names):
            report.skipped.extend(names)
        elif type(module) is not nn.Linear:
            report.unsupported.update(dict.fromkeys(names, f"{type(module).__name__} is a subclass of nn.Linear"))
        elif why := layer_cls.unsupported(module, **options) or _dtype_unsupported(module, options.get("dtype")):
            report.unsupported.update(dict.fromkeys(names, why))
        else:
            todo.append((module, names))
    for module, names in todo:
        _replace(model, names, layer_cls.from_linear(module, **options))
        report.converted.extend(names)
    if report.unsupported:
        warnings.warn(f"gemmkit.nn.convert(scheme={scheme!r}) left {len(report.unsupported)} layer(s) as "
                      "nn.Linear: " + "; ".join(f"{n} ({why})" for n, why in report.unsupported.items()),
                      stacklevel=2)
    return report
