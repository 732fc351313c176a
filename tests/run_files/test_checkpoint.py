"""Server checkpoints (fedsm_core.run_files.checkpoint): exact round trip, atomic writes, resume checks."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import fedsm_core.run_files.bundle
from fedsm_core.config import RunConfig
from fedsm_core.run_files.checkpoint import (
    AFTER_TRAINING,
    BEFORE_THE_KEY,
    CHECKPOINT_FORMAT,
    RESUMABLE_CHANGES,
    check_resumable,
    from_storable,
    load_checkpoint,
    save_checkpoint,
    to_storable,
)

SITES = ("site-a", "site-b", "site-c")


def _state() -> dict:
    return {
        "global": {"conv.weight": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
                   "bn.num_batches_tracked": np.array(5, dtype=np.int64)},
        "personalized": {
            "site-a": {"w": np.array([0.1, 0.2, 1e-300], dtype=np.float64)},
            "site-b": {"w": np.array([-0.0, np.pi, 3.0], dtype=np.float64)},
        },
        "selector-optimizer": {},
        "missed": [[2, "site-b", "no reply"], [3, "site-a", "non-finite values in 'global': ['w']"]],
        "latest-lists": {"val": {"site-a": {"dice-super-sweep": [0.25, 0.5]}}},
        "mixed": [np.array([1, 2], dtype=np.int32), 2.5, "text", [np.array([True, False])]],
        "gamma": 0.3,
    }


def _assert_equal_exactly(got, expected) -> None:
    if isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected)
        for key in expected:
            _assert_equal_exactly(got[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, list) and len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _assert_equal_exactly(g, e)
    else:
        assert type(got) is type(expected) and got == expected


def test_save_and_load_round_trip_nested_state_exactly(tmp_path):
    # Prepare
    state = _state()
    metrics = [(1, "val", "site-a", "dice", 0.5), (1, "val", "site-b", "dice", 0.25)]

    # Execute
    path = save_checkpoint(tmp_path / "run" / "checkpoint.pt", 3, {"lr": 0.002, "seed": 1}, SITES, "FedSM", state,
                           metrics)
    loaded = load_checkpoint(path)

    # Assert
    assert path == tmp_path / "run" / "checkpoint.pt" and path.is_file()
    assert loaded["format"] == CHECKPOINT_FORMAT
    assert loaded["round"] == 3 and loaded["strategy"] == "FedSM"
    assert loaded["run-config"] == {"lr": 0.002, "seed": 1}
    assert loaded["sites"] == list(SITES)
    assert loaded["metrics"] == [list(row) for row in metrics]
    _assert_equal_exactly(loaded["state"], _state())


def test_the_file_loads_with_weights_only(tmp_path):
    # Prepare
    path = save_checkpoint(tmp_path / "checkpoint.pt", 1, {"lr": 0.002}, SITES, "FedAvg", _state(), [])

    # Execute
    payload = torch.load(path, map_location="cpu", weights_only=True)

    # Assert: plain values and tensors, no pickled NumPy objects
    assert payload["format"] == CHECKPOINT_FORMAT and payload["round"] == 1
    weight = payload["state"]["global"]["conv.weight"]
    assert isinstance(weight, torch.Tensor) and weight.dtype == torch.float32
    torch.testing.assert_close(weight, torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7, rtol=0, atol=0)
    assert payload["state"]["missed"] == _state()["missed"]


def test_a_batch_norm_counter_stored_as_a_numpy_scalar_loads_with_weights_only(tmp_path):
    # Aggregated batch-norm state holds num_batches_tracked as np.int64 (a FedBN run's checkpoint did).
    state = {"global": {"bn.num_batches_tracked": np.int64(26), "bn.running_mean": np.zeros(2, np.float32)}}
    path = save_checkpoint(tmp_path / "checkpoint.pt", 3, {"lr": 0.002}, SITES, "FedBN", state, [])

    loaded = load_checkpoint(path)["state"]["global"]

    assert int(loaded["bn.num_batches_tracked"]) == 26 and loaded["bn.num_batches_tracked"].dtype == np.int64


def test_to_storable_copies_arrays_and_from_storable_turns_tuples_into_lists():
    # Prepare
    array = np.array([1.0, 2.0])

    # Execute
    stored = to_storable({"a": array, "t": (array, 1)})
    array[0] = 99.0  # later changes to the live state must not reach the checkpoint
    restored = from_storable(stored)

    # Assert
    np.testing.assert_array_equal(restored["a"], [1.0, 2.0])
    assert isinstance(restored["t"], list) and restored["t"][1] == 1
    np.testing.assert_array_equal(restored["t"][0], [1.0, 2.0])


def test_a_failed_write_keeps_the_previous_checkpoint_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    # Prepare
    path = save_checkpoint(tmp_path / "checkpoint.pt", 1, {"lr": 0.002}, SITES, "FedSM", _state(), [])
    before = path.read_bytes()
    written: list[str] = []

    def full_disk(payload, target, *args, **kwargs):
        written.append(str(target))
        with open(target, "wb") as handle:
            handle.write(b"PK\x03\x04 partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fedsm_core.run_files.bundle, "torch", types.SimpleNamespace(save=full_disk))

    # Execute
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, 2, {"lr": 0.002}, SITES, "FedSM", {"global": {"w": np.zeros(2)}}, [])

    # Assert
    assert written and written[0] != str(path)  # the partial file was a temporary one beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
    assert path.read_bytes() == before
    monkeypatch.undo()
    loaded = load_checkpoint(path)
    assert loaded["round"] == 1
    _assert_equal_exactly(loaded["state"], _state())


def test_a_failed_first_write_leaves_nothing(tmp_path, monkeypatch):
    # Prepare
    def crash(payload, target, *args, **kwargs):
        with open(target, "wb") as handle:
            handle.write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(fedsm_core.run_files.bundle, "torch", types.SimpleNamespace(save=crash))

    # Execute
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "checkpoint.pt", 1, {}, SITES, "FedSM", {}, [])

    # Assert
    assert list(tmp_path.iterdir()) == []


def test_a_new_checkpoint_replaces_the_previous_one(tmp_path):
    # Prepare
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, 1, {}, SITES, "FedSM", {"global": {"w": np.zeros(2)}}, [])

    # Execute
    save_checkpoint(path, 2, {}, SITES, "FedSM", {"global": {"w": np.ones(2)}}, [])

    # Assert
    loaded = load_checkpoint(path)
    assert loaded["round"] == 2
    np.testing.assert_array_equal(loaded["state"]["global"]["w"], [1.0, 1.0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_loading_a_missing_path_names_it(tmp_path):
    # Prepare
    path = tmp_path / "nowhere" / "checkpoint.pt"

    # Execute / Assert
    with pytest.raises(FileNotFoundError) as raised:
        load_checkpoint(path)
    assert str(path) in str(raised.value)


def test_loading_garbage_bytes_names_the_path(tmp_path):
    # Prepare
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"\x00\x01 this is not a checkpoint \xff" * 10)

    # Execute / Assert
    with pytest.raises(ValueError) as raised:
        load_checkpoint(path)
    assert str(path) in str(raised.value) and "not a readable checkpoint" in str(raised.value)


def test_loading_a_truncated_checkpoint_names_the_path(tmp_path):
    # Prepare
    path = save_checkpoint(tmp_path / "checkpoint.pt", 1, {}, SITES, "FedSM", _state(), [])
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    # Execute / Assert
    with pytest.raises(ValueError, match="not a readable checkpoint") as raised:
        load_checkpoint(path)
    assert str(path) in str(raised.value)


def test_loading_another_torch_file_is_refused(tmp_path):
    # Prepare
    path = tmp_path / "super_model.pt"
    torch.save({"format": "fedsm-super-model/1", "global": {}}, path)

    # Execute / Assert
    with pytest.raises(ValueError, match="not a FedSM checkpoint") as raised:
        load_checkpoint(path)
    assert str(path) in str(raised.value)


def _checkpoint(round_: int = 2, **changes) -> dict:
    return {"round": round_, "run-config": RunConfig.from_mapping(changes).to_mapping(), "sites": list(SITES)}


def _config(**changes) -> dict:
    return RunConfig.from_mapping(changes).to_mapping()


def test_the_resumable_keys_are_the_documented_ones():
    # Assert: nothing that shapes training may change silently
    assert RESUMABLE_CHANGES == {"num-server-rounds", "resume-from", "output-dir", "round-timeout", "device",
                                 "torch-threads", "min-replies",
                                 "stop-window", "stop-min-gain", "stop-min-rounds", "stop-check-every"}
    assert RESUMABLE_CHANGES <= set(RunConfig().to_mapping())


def test_an_unchanged_config_is_resumable():
    # Execute / Assert: no exception
    check_resumable(_checkpoint(2), _config(), SITES, 30, "ck.pt")


def test_changes_in_resumable_keys_are_allowed():
    # Prepare
    changed = _config(**{"num-server-rounds": 50, "resume-from": "runs/x/checkpoint.pt", "output-dir": "elsewhere",
                         "round-timeout": 10.0, "device": "cpu", "torch-threads": 2, "min-replies": 2,
                         "stop-window": 20, "stop-min-gain": 0.01, "stop-min-rounds": 30, "stop-check-every": 10})
    assert all(changed[key] != _config()[key] for key in RESUMABLE_CHANGES)

    # Execute / Assert: no exception
    check_resumable(_checkpoint(2), changed, SITES, 50, "ck.pt")


def test_a_changed_lr_is_refused_naming_the_key_and_both_values():
    # Execute / Assert
    with pytest.raises(ValueError) as raised:
        check_resumable(_checkpoint(2, lr=0.002), _config(lr=0.001), SITES, 30, "runs/a/checkpoint.pt")
    message = str(raised.value)
    assert "lr: 0.002 -> 0.001" in message
    assert "runs/a/checkpoint.pt" in message
    assert "selector-lr" not in message  # only what changed is named


@pytest.mark.parametrize("key", sorted(set(RunConfig().to_mapping()) - RESUMABLE_CHANGES))
def test_a_change_in_any_other_key_is_refused(key):
    # Prepare
    saved = _config()
    current = dict(saved)
    value = saved[key]
    current[key] = (not value) if isinstance(value, bool) else value + (1 if isinstance(value, (int, float)) else "-x")

    # Execute / Assert
    with pytest.raises(ValueError, match="differs from the checkpoint") as raised:
        check_resumable({"round": 2, "run-config": saved, "sites": list(SITES)}, current, SITES, 30, "ck.pt")
    assert f"{key}: {saved[key]!r} -> {current[key]!r}" in str(raised.value)


def test_a_key_the_checkpoint_predates_takes_the_value_from_before_it(monkeypatch):
    # Prepare: a checkpoint saved before the key selector-weighting existed
    saved = _config()
    del saved["selector-weighting"]
    checkpoint = {"round": 2, "run-config": saved, "sites": list(SITES)}

    # Execute / Assert: by convention the key's default is what runs did before it: resumable
    check_resumable(checkpoint, _config(), SITES, 30, "ck.pt")
    # once the default no longer reproduces the old behaviour, BEFORE_THE_KEY names it: a change, unless asked for
    monkeypatch.setitem(BEFORE_THE_KEY, "selector-weighting", "size")
    with pytest.raises(ValueError, match="selector-weighting: 'size' -> 'equal'"):
        check_resumable(checkpoint, _config(), SITES, 30, "ck.pt")
    check_resumable(checkpoint, _config(**{"selector-weighting": "size"}), SITES, 30, "ck.pt")


@pytest.mark.parametrize("sites", [("site-a", "site-b"), ("site-a", "site-b", "site-d"),
                                   ("site-b", "site-a", "site-c")])
def test_different_sites_are_refused(sites):
    # Execute / Assert
    with pytest.raises(ValueError, match="sites") as raised:
        check_resumable(_checkpoint(2), _config(), sites, 30, "ck.pt")
    assert "site-c" in str(raised.value) or "site-d" in str(raised.value)


def test_a_checkpoint_past_the_last_round_is_refused():
    # Execute / Assert
    with pytest.raises(ValueError, match="round 31 of a run of 30 rounds"):
        check_resumable(_checkpoint(31), _config(), SITES, 30, "ck.pt")


def test_a_checkpoint_of_the_last_round_may_finish_with_other_after_training_keys():
    # Prepare: a checkpoint of round 30 before FedSM's final fine-tuning (the stopping rule ended the rounds)
    changed = {"fine-tune-passes": 0, "fine-tune-gamma": "validation"}
    assert AFTER_TRAINING == set(changed) and all(_config()[key] != value for key, value in changed.items())

    # Execute / Assert: finishing it (no round left) may change them; continuing it may not
    check_resumable(_checkpoint(30), _config(**changed), SITES, 30, "ck.pt")
    with pytest.raises(ValueError, match="fine-tune-passes: 30 -> 0.* too where the checkpoint is from the last round"):
        check_resumable(_checkpoint(29), _config(**changed), SITES, 30, "ck.pt")


def test_a_checkpoint_that_holds_fine_tuned_models_finishes_only_as_it_was():
    # Prepare: the fine-tuning ran before this checkpoint was saved (a run of fixed length)
    checkpoint = {**_checkpoint(30), "state": {"fine-tuned": {"round": 30, "sites": []}}}

    # Execute / Assert: the same settings finish it; other fine-tuning settings would mislabel its models
    check_resumable(checkpoint, _config(), SITES, 30, "ck.pt")
    with pytest.raises(ValueError, match="already fine-tuned .*fine-tune-passes = 30.* fine-tune-passes = 0"):
        check_resumable(checkpoint, _config(**{"fine-tune-passes": 0}), SITES, 30, "ck.pt")


def test_a_checkpoint_one_round_before_the_end_is_resumable():
    # Execute / Assert: no exception
    check_resumable(_checkpoint(29), _config(), SITES, 30, "ck.pt")


def test_fedsm_extra_may_extend_its_extra_rounds_but_not_move_the_model_rounds():
    from fedsm_core.config import RunConfig
    from fedsm_core.run_files.checkpoint import check_resumable

    saved = RunConfig(strategy="fedsm-extra", num_server_rounds=4, extra_rounds=2).to_mapping()
    checkpoint = {"run-config": saved, "sites": ["a", "b"], "round": 3}
    check_resumable(checkpoint, {**saved, "extra-rounds": 5}, ["a", "b"], 9, "ckpt")
    with pytest.raises(ValueError, match="num-server-rounds: 4 -> 6"):
        check_resumable(checkpoint, {**saved, "num-server-rounds": 6}, ["a", "b"], 8, "ckpt")
