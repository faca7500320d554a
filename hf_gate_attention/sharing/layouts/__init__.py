"""Gated attention published in other layouts: the gate packed into a wider `q_proj`, converted to and from
ours (`attn_gate.weight (H*w, hidden)`, `attn_gate.bias (H*w,)`, variant `output`, `init="paper"`).

Shapes: `H` query heads, `KV` key/value heads, `G = H // KV` query heads per key/value group, `D` head_dim,
`w` = 1 (headwise) or `D` (elementwise). Both layouts gate the attention output with `sigmoid(gate)` before
`o_proj`, which is our `variant="output", init="paper"` gate with the gate rows of `q_proj` as its weight.

- `"paper"` (Qiu et al., github.com/qiuzh20/gated_attention, `model_type: "qwen3"` with the flags
  `headwise_attn_output_gate` / `elementwise_attn_output_gate`): `q_proj: (H*D + H*w, hidden)` laid out per
  key/value group, `[G*D query rows | G*w gate rows]` for each of the `KV` groups.
- `"qwen3_next"` (transformers' `Qwen3NextAttention`, also Qwen3.5): `q_proj: (2*H*D, hidden)` laid out per
  head, `[D query rows | D gate rows]` for each of the `H` heads; always elementwise.

One module per layout, on the packing both share (`packing`: `split_q_proj`, `pack_q_proj`): whole paper
checkpoints load with `paper.load_paper_checkpoint` (also through `hf_gate_attention.from_pretrained`) and
are written with `paper.save_in_paper_layout`; a Qwen3-Next layer converts at state-dict level
(`qwen3_next.qwen3_next_attention_to_ours` / `qwen3_next.ours_to_qwen3_next_attention`); a whole patched
qwen3 causal LM is written as a transformers Qwen3.5 text checkpoint (`Qwen3_5ForCausalLM`, every layer full
attention) with `qwen3_5.write_qwen3_5_checkpoint` / `qwen3_5.save_as_qwen3_5`, and read back with
`qwen3_5.load_qwen3_5_checkpoint`.
"""

from .packing import LAYOUTS, pack_q_proj, q_proj_widths, split_q_proj
from .paper import (
    HUB_KWARGS,
    PAPER_ARCHITECTURE,
    PAPER_FLAGS,
    PAPER_MODEL_TYPES,
    PAPER_ONLY_KEYS,
    QWEN3_ONLY_KEYS,
    config_from_paper,
    config_to_paper,
    is_paper_config,
    load_paper_checkpoint,
    ours_state_dict_to_paper,
    paper_checkpoint_contents,
    paper_granularity,
    paper_state_dict_to_ours,
    save_in_paper_layout,
    write_paper_layout,
)
from .qwen3_5 import (
    QWEN3_5_ARCHITECTURE,
    is_qwen3_5_config,
    load_qwen3_5_checkpoint,
    qwen3_5_config,
    qwen3_5_state_dict,
    save_as_qwen3_5,
    write_qwen3_5_checkpoint,
)
from .qwen3_next import (
    QWEN3_NEXT_MATCHING_FIELDS,
    check_qwen3_next_match,
    ours_to_qwen3_next_attention,
    qwen3_next_attention_to_ours,
)

__all__ = [
    "HUB_KWARGS",
    "LAYOUTS",
    "PAPER_ARCHITECTURE",
    "PAPER_FLAGS",
    "PAPER_MODEL_TYPES",
    "PAPER_ONLY_KEYS",
    "QWEN3_5_ARCHITECTURE",
    "QWEN3_NEXT_MATCHING_FIELDS",
    "QWEN3_ONLY_KEYS",
    "check_qwen3_next_match",
    "config_from_paper",
    "config_to_paper",
    "is_paper_config",
    "is_qwen3_5_config",
    "load_paper_checkpoint",
    "load_qwen3_5_checkpoint",
    "ours_state_dict_to_paper",
    "ours_to_qwen3_next_attention",
    "pack_q_proj",
    "paper_checkpoint_contents",
    "paper_granularity",
    "paper_state_dict_to_ours",
    "q_proj_widths",
    "qwen3_5_config",
    "qwen3_5_state_dict",
    "qwen3_next_attention_to_ours",
    "save_as_qwen3_5",
    "save_in_paper_layout",
    "split_q_proj",
    "write_paper_layout",
    "write_qwen3_5_checkpoint",
]
