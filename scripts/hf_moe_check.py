"""Check (CPU, Triton interpreter; needs transformers >= 5 installed): gemmkit.nn.convert on transformers' own tiny
Qwen3-MoE and Mixtral models with random weights, every MoE scheme and one without grouped kernels: experts modules
replaced by MoEExperts, the logits' relative error against the original model printed.

    python3 scripts/hf_moe_check.py
"""

import copy
import os
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

import gemmkit.nn as gnn  # noqa: E402

SMALL = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             num_experts_per_tok=2)
MODELS = {
    "qwen3_moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(**SMALL, intermediate_size=128, moe_intermediate_size=32,
                                                      num_experts=8, head_dim=16, norm_topk_prob=True)),
    "mixtral": (MixtralForCausalLM, MixtralConfig(**SMALL, intermediate_size=32, num_local_experts=4)),
}
torch.manual_seed(0)
for name, (cls, cfg) in MODELS.items():
    model = cls(cfg).to(torch.bfloat16).eval()
    tokens = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        ref = model(tokens).logits.float()
        for scheme in ["bf16", "fp8", "fp8_block", "int4"]:
            m = copy.deepcopy(model)
            with warnings.catch_warnings():  # (int4: the layers it leaves alone, named in the report)
                warnings.simplefilter("ignore")
                rep = gnn.convert(m, scheme, skip=["lm_head"])
            out = m(tokens).logits.float()
            err = ((out - ref).norm() / ref.norm()).item()
            print(name, scheme, "experts", len(rep.experts), "linears", len(rep.converted), "left",
                  len(rep.unsupported), "rel err %.4f" % err, type(m.model.layers[0].mlp.experts).__name__)
