"""GateConfig validation and JSON round trip."""

import pytest

from hf_gate_attention import GateConfig


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("variant", "gate", "output, value, qk"),
        ("granularity", "channelwise", "headwise, elementwise"),
        ("init", "zeros", "identity, paper"),
        ("top_k", 0, "None or an int >= 1"),
        ("top_k", True, "None or an int >= 1"),
        ("top_k", 1.5, "None or an int >= 1"),
        ("top_k_unit", "group", "head, kv_group"),
        ("layers", [], "None or a non-empty list"),
        ("layers", [0, -1], "None or a non-empty list"),
        ("layers", "0", "None or a non-empty list"),
    ],
)
def test_invalid_values_name_the_field_and_the_accepted_values(field, value, accepted):
    with pytest.raises(ValueError, match=rf"GateConfig\.{field}=.*accepted values: {accepted}"):
        GateConfig(**{field: value})


def test_json_round_trip_and_normalised_layers():
    config = GateConfig(
        variant="qk",
        granularity="elementwise",
        init="paper",
        top_k=2,
        top_k_unit="kv_group",
        layers=[3, 1, 3],
    )
    assert config.layers == (1, 3)
    assert GateConfig.from_json_string(config.to_json_string()) == config
    assert GateConfig.from_dict(config.to_dict()) == config
    assert config.to_dict()["layers"] == [1, 3]


def test_unknown_fields_are_refused():
    with pytest.raises(ValueError, match="Unknown GateConfig field"):
        GateConfig.from_dict({"variant": "output", "gate_size": 3})
    with pytest.raises(ValueError, match=r"Unknown GateConfig field.*granulrity"):
        GateConfig().replace(granulrity="headwise")


def test_the_backend_is_not_part_of_the_config():
    """How a gate runs is chosen by patch/from_pretrained; only old checkpoints carry a `backend` entry."""
    assert "backend" not in GateConfig().to_dict()
    with pytest.raises(ValueError, match=r"Unknown GateConfig field\(s\): backend"):
        GateConfig.from_dict({"variant": "qk", "backend": "triton"})
    old = {"variant": "qk", "granularity": "headwise", "init": "paper", "top_k": None, "layers": None}
    assert GateConfig.from_saved({**old, "backend": "triton"}) == GateConfig.from_dict(old)
    assert GateConfig.from_dict(old).top_k_unit == "head"  # saved before top_k_unit existed


def test_identity_init_scales_the_sigmoid_by_two():
    assert GateConfig().gate_scale == 2.0
    assert GateConfig(init="paper").gate_scale == 1.0
