"""`GateConfig`: which gate to add, where, and how to initialise it: what the gate computes, saved with the
checkpoint. How it runs (the backend) is chosen by `patch`/`from_pretrained` and never saved."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from .families import ATTENTION_KINDS
from .variants import GATE_VARIANTS, GateVariant, names_where

GRANULARITIES = ("headwise", "elementwise")
INITS = ("identity", "paper")
TOP_K_UNITS = ("head", "kv_group")
# fields that old checkpoints saved and that are not part of what the gate computes: dropped on load
LEGACY_FIELDS = ("backend",)
# fields every saved gate config holds (what the saved weights mean): a checkpoint without them is refused
SAVED_FIELDS = ("variant", "granularity", "init")


def _check_choice(name: str, value, accepted) -> None:
    if not isinstance(value, str) or value not in accepted:
        raise ValueError(f"GateConfig.{name}={value!r} is not valid; accepted values: {', '.join(accepted)}")


@dataclass(frozen=True)
class GateConfig:
    """Configuration of the sigmoid gate added to each self-attention block.

    Args:
        variant (`str`, *optional*, defaults to `"output"`):
            Where the gate acts, a name of `core/variants.py`. `"output"` (paper G1): `O' = O * g(X)` on the
            attention output before the output projection. `"value"` (paper G2): `V' = V * g(X)` on the value
            projection's output. `"qk"` (the source article): `g = sigmoid(W_g [q_i; k_i] + b_g)` from query
            and key of position i, scaling row i of the attention weights (equivalently output row i).
        granularity (`str`, *optional*, defaults to `"headwise"`):
            `"headwise"`: one gate value per head; `"elementwise"`: one per channel of each head.
        init (`str`, *optional*, defaults to `"identity"`):
            `"identity"`: zero weights and `g = 2 * sigmoid(z)`, so the patched model computes exactly what it
            computed before (the right start for a pretrained model). `"paper"`: normal init with
            `g = sigmoid(z)` as in Qiu et al. for training from scratch (the gate starts near 0.5).
        top_k (`int`, *optional*):
            Sparse gating: per token, only the `top_k` heads (or key/value groups, see `top_k_unit`) with the
            largest gate values are kept; the others get exactly 0. `None` keeps all heads.
        top_k_sink, top_k_window (`int`, *optional*, default to 0):
            What a unit that top-k drops for a query still reads. Both 0: nothing, its output is 0.
            Otherwise it attends to the first `top_k_sink` and the last `top_k_window` of the keys that query
            may see (attention sinks and a recent window, as DuoAttention's streaming heads) and is gated like
            a kept unit; its keys and values outside those positions are never read. Needs `top_k` and a
            variant whose `dropped_read_keys` is set (`output`, `qk`).
        top_k_unit (`str`, *optional*, defaults to `"head"`):
            What `top_k` selects. `"head"`: query heads (key/value heads for the `value` gate). `"kv_group"`:
            key/value groups of grouped-query attention, scored by the mean gate of their query heads and kept
            or dropped whole, so that a dropped group's keys and values are never read (the decode win). With
            as many key/value heads as query heads both units are the same.
        layers (`tuple[int]`, *optional*):
            Indices of the layers to gate, counted in each stack of blocks (an encoder's and a decoder's
            layers are both numbered from 0); `None` gates every layer.
        attention (`tuple[str]`, *optional*, defaults to `("encoder", "decoder")`):
            Which attention blocks get gates: `"encoder"` (bidirectional self-attention: BERT, ViT, the
            encoder of an encoder-decoder), `"decoder"` (causal self-attention: decoders, the decoder of an
            encoder-decoder), `"cross"` (a decoder's cross-attention to the encoder; its gate is computed from
            the decoder's hidden state, so each decoder token decides how much it takes from the encoder).
            The default gates every self-attention and no cross-attention.
        parts (`tuple[str]`, *optional*):
            Which parts of a composite model get gates, by module name (`"vision_tower"`,
            `"language_model"`, `"encoder"`, `"text_model"`): a block is gated when one of these names is a
            path segment of its module name. `None` (default) gates every part with a known layout.
    """

    # `metadata`: one line of help and the accepted values, from which the command line builds its options
    variant: str = field(
        default="output",
        metadata={
            "help": "where the gate acts: "
            + ", ".join(f"{v.name} ({v.origin})" for v in GATE_VARIANTS.values()),
            "choices": GATE_VARIANTS.keys(),  # a live view: every variant declared in variants.py
        },
    )
    granularity: str = field(
        default="headwise",
        metadata={"help": "one gate per head, or per channel of each head", "choices": GRANULARITIES},
    )
    init: str = field(
        default="identity",
        metadata={
            "help": "identity: computes the ungated model at first; paper: normal init",
            "choices": INITS,
        },
    )
    top_k: int | None = field(
        default=None, metadata={"help": "sparse gating: keep the k largest gates per token (heads or groups)"}
    )
    top_k_unit: str = field(
        default="head",
        metadata={"help": "what top_k keeps: query heads, or whole key/value groups", "choices": TOP_K_UNITS},
    )
    top_k_sink: int = field(
        default=0, metadata={"help": "sparse gating: a dropped unit still attends to the first N keys"}
    )
    top_k_window: int = field(
        default=0, metadata={"help": "sparse gating: a dropped unit still attends to the last N keys"}
    )
    layers: tuple[int, ...] | None = field(
        default=None, metadata={"help": "indices of the layers to gate, e.g. 0,1,5 (default: all)"}
    )

    attention: tuple[str, ...] = field(
        default=("encoder", "decoder"),
        metadata={
            "help": "which attention gets gates, e.g. encoder,decoder,cross (default: all self-attention)",
            "each_of": ATTENTION_KINDS,
        },
    )
    parts: tuple[str, ...] | None = field(
        default=None,
        metadata={"help": "which parts of a composite model, e.g. language_model (default: all)"},
    )

    def __post_init__(self):
        for option in dataclasses.fields(self):
            if "choices" in option.metadata:
                _check_choice(option.name, getattr(self, option.name), option.metadata["choices"])
        if self.top_k is not None and (
            isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1
        ):
            raise ValueError(
                f"GateConfig.top_k={self.top_k!r} is not valid; accepted values: None or an int >= 1"
            )
        for name in ("top_k_sink", "top_k_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"GateConfig.{name}={value!r} is not valid; accepted values: an int >= 0")
        if self.dropped_reads_keys and (self.top_k is None or not self.gate_variant.dropped_read_keys):
            variants = " or ".join(repr(name) for name in names_where(lambda v: v.dropped_read_keys))
            raise ValueError(
                f"GateConfig.top_k_sink/top_k_window={self.top_k_sink}/{self.top_k_window} need top_k and "
                f"variant {variants} (got top_k={self.top_k!r}, variant={self.variant!r}); "
                "otherwise set both to 0"
            )
        if self.layers is not None:
            layers = tuple(self.layers) if isinstance(self.layers, list | tuple) else None
            if not layers or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers):
                raise ValueError(
                    f"GateConfig.layers={self.layers!r} is not valid; accepted values: None or a non-empty "
                    "list of layer indices >= 0"
                )
            object.__setattr__(self, "layers", tuple(sorted(set(layers))))
        self._check_names("attention", ATTENTION_KINDS)
        if self.parts is not None:
            self._check_names("parts", None)

    def _check_names(self, name: str, accepted) -> None:
        """A non-empty list of names (of `accepted`, when given), stored as a sorted tuple."""
        value = getattr(self, name)
        names = tuple(value) if isinstance(value, list | tuple) else None
        if not names or any(
            not isinstance(n, str) or not n or (accepted and n not in accepted) for n in names
        ):
            what = f"names among {', '.join(accepted)}" if accepted else "module names"
            raise ValueError(
                f"GateConfig.{name}={value!r} is not valid; accepted values: a non-empty list of {what}"
            )
        object.__setattr__(self, name, tuple(sorted(set(names))))

    @property
    def gate_variant(self) -> GateVariant:
        """What `variant` names: what the gate multiplies, what it reads, what serves it."""
        return GATE_VARIANTS[self.variant]

    @property
    def dropped_reads_keys(self) -> bool:
        """Whether a unit top-k drops still attends to sink and recent keys (instead of giving 0)."""
        return self.top_k_sink > 0 or self.top_k_window > 0

    @property
    def gate_scale(self) -> float:
        """Multiplier of the sigmoid: 2 for the exact identity start (`2 * sigmoid(0) = 1`), 1 otherwise."""
        return 2.0 if self.init == "identity" else 1.0

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        for name in ("layers", "attention", "parts"):
            data[name] = list(data[name]) if data[name] is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict) -> GateConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"Unknown GateConfig field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**data)

    @classmethod
    def from_saved(cls, data: dict) -> GateConfig:
        """The config saved in a checkpoint's `config.json`, also by older versions (their `backend` entry,
        how the gate ran when saved, is dropped: the backend is chosen at load time)."""
        return cls.from_dict({k: v for k, v in data.items() if k not in LEGACY_FIELDS})

    @classmethod
    def from_checkpoint(cls, data: dict) -> GateConfig:
        """`from_saved` for the config of saved gate weights: every version saved `SAVED_FIELDS`, and without
        them the defaults would give the saved weights another meaning (scale, shape): refused."""
        missing = [name for name in SAVED_FIELDS if name not in data]
        if missing:
            raise ValueError(
                f"the saved gate config {data!r} lacks {', '.join(missing)}: what the saved gates compute is "
                "unknown (the defaults would scale or shape them differently)"
            )
        return cls.from_saved(data)

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json_string(cls, text: str) -> GateConfig:
        return cls.from_dict(json.loads(text))

    def replace(self, **overrides) -> GateConfig:
        """A copy with some fields changed; unknown names raise `ValueError`."""
        return GateConfig.from_dict({**self.to_dict(), **overrides})
