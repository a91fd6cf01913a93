"""TrainConfig.set: one key at a time, checked as the YAML loader checks it."""
import pytest

import llmt


def test_set_one_key():
    cfg = llmt.TrainConfig()
    assert cfg.set("optimizer.lr", 3e-4) is cfg
    assert cfg.struct.optimizer.lr == pytest.approx(3e-4)
    cfg.set("train.steps", 7).set("precision", "bf16_mixed")
    assert cfg.struct.steps == 7
    assert "precision: bf16_mixed" in cfg.to_yaml()
    cfg.set("checkpoint.async", False)
    assert "async: false" in cfg.to_yaml()
    # Refused, naming the key and value, and nothing changed.
    with pytest.raises(llmt.InvalidArgument, match="train.steps"):
        cfg.set("train.steps", -5)
    with pytest.raises(llmt.InvalidArgument, match="stesp"):
        cfg.set("train.stesp", 3)
    assert cfg.struct.steps == 7
    with pytest.raises(TypeError):
        cfg.set("train.steps", [1])
