"""Failures raise LlmtError subclasses whose text is the library's message."""
import numpy as np
import pytest

import llmt
from llmt import errors
from conftest import SMALL_MODEL


def test_status_codes_map_to_exception_classes():
    expected = {-1: llmt.InvalidArgument, -2: llmt.OutOfMemory, -3: llmt.IOFailure,
                -4: llmt.CorruptData, -5: llmt.VersionError, -6: llmt.Unsupported,
                -7: llmt.CudaError, -8: llmt.StateError, -9: llmt.NotFound,
                -10: llmt.Busy}
    for status, cls in expected.items():
        e = errors.error_for(status, "message")
        assert type(e) is cls and e.status == status and str(e) == "message"
        assert isinstance(e, llmt.LlmtError)
    assert type(errors.error_for(-100, "m")) is llmt.LlmtError
    assert isinstance(errors.error_for(-1, "m"), ValueError)
    assert isinstance(errors.error_for(-3, "m"), OSError)
    assert isinstance(errors.error_for(-9, "m"), LookupError)


def test_a_bad_configuration_key_names_key_line_and_column(tmp_path):
    with pytest.raises(llmt.InvalidArgument) as e:
        llmt.TrainConfig("model:\n  hidden_size: 64\n  layers: 3\n")
    assert str(e.value) == "<string>:3:3: model.layers: unknown key"
    assert e.value.status == -1

    path = tmp_path / "run.yaml"
    path.write_text("optimizer:\n  lr: fast\n")
    with pytest.raises(llmt.InvalidArgument, match=r"run\.yaml:2:7: optimizer\.lr: 'fast' is "
                                                   r"not a number"):
        llmt.Trainer.from_yaml(None, path)
    with pytest.raises(llmt.InvalidArgument, match=r"<dict>:\d+:\d+: precision: 'fp8' is not "
                                                   r"one of fp32, bf16_mixed"):
        llmt.TrainConfig({"precision": "fp8"})
    with pytest.raises(llmt.IOFailure, match="missing.yaml: cannot open"):
        llmt.TrainConfig(tmp_path / "missing.yaml")


def test_a_token_out_of_range_names_its_position(ctx):
    model = llmt.Model(ctx, **SMALL_MODEL)
    tokens = np.zeros((2, 8), dtype=np.int32)
    tokens[1, 5] = 999
    with pytest.raises(llmt.InvalidArgument) as e:
        model.forward(tokens, np.zeros_like(tokens))
    assert "sequence 1, position 5" in str(e.value) and "999" in str(e.value)


def test_file_errors_name_the_file(ctx, tmp_path):
    missing = tmp_path / "none.bin"
    with pytest.raises(llmt.IOFailure) as e:
        llmt.Loader(ctx, [missing], vocab_size=260)
    assert str(missing) in str(e.value)
    with pytest.raises(llmt.InvalidArgument, match="none_\\*.bin"):
        llmt.Loader(ctx, str(tmp_path / "none_*.bin"), vocab_size=260)
    store = llmt.CheckpointStore(ctx, tmp_path / "ckpt")
    with pytest.raises(llmt.NotFound):
        store.latest()


def test_binding_side_errors(ctx):
    with pytest.raises(TypeError, match="unexpected keyword argument 'hidden'"):
        llmt.Model(ctx, hidden=64)
    with pytest.raises(TypeError, match="unexpected keyword argument 'version'"):
        llmt.Context(version=2)
    with pytest.raises(ValueError, match="precision: 'fp8' is not one of"):
        llmt.Model(ctx, precision="fp8")
    model = llmt.Model(ctx, **SMALL_MODEL)
    with pytest.raises(TypeError, match="integer array"):
        model.forward(np.zeros((1, 4)), np.zeros((1, 4)))
    with pytest.raises(ValueError, match="shape"):
        model.forward(np.zeros(4, dtype=np.int32), np.zeros(4, dtype=np.int32))
    with pytest.raises(ValueError, match="do not fit int32"):
        model.forward(np.full((1, 4), 2**40), np.zeros((1, 4), dtype=np.int32))
    with pytest.raises(ValueError, match=r"expected shape \(64,\)"):
        model.set_param("model.norm.weight", np.zeros(3))
    with pytest.raises(llmt.NotFound, match="no.such"):
        model.get_param("no.such")
    model.close()
    with pytest.raises(llmt.StateError, match="the Model is closed"):
        model.num_params


def test_library_errors_of_the_other_kinds(ctx, tmp_path):
    try:
        llmt.Context(backend="cuda").close()
    except (llmt.Unsupported, llmt.CudaError) as e:
        assert "llmt_context_create" in str(e)  # no plugin, or no usable GPU
    model = llmt.Model(ctx, **SMALL_MODEL)
    ctx.set_budget(ctx.memory_stats()["total"]["current"] + 1024)
    with pytest.raises(llmt.OutOfMemory, match="budget"):
        llmt.Optimizer(model)
    ctx.set_budget(0)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    with pytest.raises(llmt.CorruptData, match=f"{bad}: header: JSON at byte 2"):
        model.load_safetensors(bad)
