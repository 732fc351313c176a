"""Server checkpoints: the full strategy state after a round, to resume a run.

A checkpoint is a ``torch.save`` dictionary of plain values and tensors
(loadable with ``weights_only=True``), written atomically (temporary file,
then rename), so a crash while writing leaves the previous checkpoint
intact. It holds the round number, the run config, the site list, the
strategy's state (models, personalized models, selector and its moments,
Scaffold's server control variate, gamma, the missed-round log) and the
metrics logged so far. Client seeds are derived from the run's ``seed`` and
the round number, so a resumed round trains exactly as the uninterrupted
run would have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsm_core.methods import METHODS
from fedsm_core.run_files.bundle import write_atomically

CHECKPOINT_FORMAT = "fedsm-checkpoint/1"
CHECKPOINT_FILE = "checkpoint.pt"
# Keys that may differ between the interrupted run and the resumed one.
RESUMABLE_CHANGES = frozenset({
    "num-server-rounds", "resume-from", "output-dir", "round-timeout", "device", "torch-threads", "min-replies",
    # the stopping rule decides when training ends, not what a round does
    "stop-window", "stop-min-gain", "stop-min-rounds", "stop-check-every",
})
# Keys that act only after the last round (FedSM's final fine-tuning). A resume that trains no further round (its
# checkpoint is from round num-server-rounds) may change them, so one trained federation is finished with, say,
# and without fine-tuning; never once the checkpoint holds their result (models already fine-tuned).
AFTER_TRAINING = frozenset({"fine-tune-passes", "fine-tune-gamma"})

# A checkpoint saved before a run-config key existed lacks it. By convention a new key's first default reproduces
# the behaviour from before it, so the key counts as unchanged; once its default changes, the key goes here with
# the value that reproduces the old behaviour (what such a run trained with), so a resume or a study compares it.
BEFORE_THE_KEY: dict[str, Any] = {"fine-tune-gamma": "validation", "min-local-steps": 0}


def with_keys_added_since(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """``saved`` run config plus every key of ``current`` it lacks: the :data:`BEFORE_THE_KEY` value, else current's."""
    return {**{key: BEFORE_THE_KEY.get(key, value) for key, value in current.items() if key not in saved}, **saved}


def to_storable(value: Any) -> Any:
    """NumPy arrays and scalars (also inside dicts, lists and tuples) into tensors for ``torch.save``.

    A scalar too: batch norm's ``num_batches_tracked`` comes back from aggregation as
    ``np.int64``, which ``torch.load(weights_only=True)`` refuses to read.
    """
    if isinstance(value, (np.ndarray, np.generic)):
        return torch.from_numpy(np.array(value, copy=True))
    if isinstance(value, Mapping):
        return {str(k): to_storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_storable(v) for v in value]
    return value


def from_storable(value: Any) -> Any:
    """Inverse of :func:`to_storable`: tensors back into NumPy arrays (tuples come back as lists)."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, Mapping):
        return {k: from_storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_storable(v) for v in value]
    return value


def save_checkpoint(path: str | Path, server_round: int, run_config: Mapping[str, Any], sites: Sequence[str],
                    strategy: str, state: Mapping[str, Any], metrics: Sequence[Sequence[Any]]) -> Path:
    """Write a checkpoint atomically; returns its path."""
    payload = {
        "format": CHECKPOINT_FORMAT,
        "round": int(server_round),
        "run-config": dict(run_config),
        "sites": list(sites),
        "strategy": strategy,
        "state": to_storable(state),
        "metrics": [list(row) for row in metrics],
    }
    return write_atomically(path, payload)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (state as NumPy arrays).

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        When the file is not a readable checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"resume-from = '{path}': no such checkpoint; every run writes "
                                f"<run folder>/{CHECKPOINT_FILE} after each round")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for damaged files
        raise ValueError(f"resume-from = '{path}' is not a readable checkpoint ({type(error).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"resume-from = '{path}' is not a FedSM checkpoint (expected format {CHECKPOINT_FORMAT})")
    payload["state"] = from_storable(payload["state"])
    return payload


def check_resumable(checkpoint: Mapping[str, Any], run_config: Mapping[str, Any], sites: Sequence[str],
                    total_rounds: int, path: str | Path) -> None:
    """Refuse to resume a checkpoint into a run it did not come from.

    A checkpoint from round ``total_rounds`` trains nothing more: the resumed
    run only finishes (what follows the last round, then the test), and may
    change the :data:`AFTER_TRAINING` keys as well, unless the checkpoint
    already holds their result.

    Raises
    ------
    ValueError
        When a run-config key outside :data:`RESUMABLE_CHANGES` differs (a key
        the checkpoint predates: :func:`with_keys_added_since`), the sites
        differ, or the checkpoint is from past ``total_rounds``.
    """
    saved = with_keys_added_since(checkpoint["run-config"], run_config)
    allowed = set(RESUMABLE_CHANGES)
    if str(run_config.get("strategy")) in METHODS and METHODS[str(run_config.get("strategy"))].extra_selector:
        # num-server-rounds is where FedSM-extra switches from models to the selector: only extend the extra rounds.
        allowed = (allowed - {"num-server-rounds"}) | {"extra-rounds"}
    if checkpoint["round"] == total_rounds:
        allowed |= AFTER_TRAINING
    changed = sorted(k for k in set(saved) | set(run_config) if k not in allowed and saved.get(k) != run_config.get(k))
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {run_config.get(k)!r}" for k in changed)
        finish = (f"; {sorted(AFTER_TRAINING)} too where the checkpoint is from the last round (num-server-rounds = "
                  f"{checkpoint['round']})" if AFTER_TRAINING & set(changed) else "")
        raise ValueError(f"resume-from = '{path}': the run config differs from the checkpoint's in {details}; "
                         f"only {sorted(allowed)} may change when resuming{finish}")
    _check_after_training(checkpoint, saved, run_config, path)
    if list(checkpoint["sites"]) != list(sites):
        raise ValueError(f"resume-from = '{path}': checkpoint sites {checkpoint['sites']} differ from this "
                         f"federation's {list(sites)}")
    if checkpoint["round"] > total_rounds:
        raise ValueError(f"resume-from = '{path}': the checkpoint is from round {checkpoint['round']} of a run of "
                         f"{total_rounds} rounds; raise num-server-rounds to continue")


def holds_after_training(state: Mapping[str, Any]) -> bool:
    """Whether a strategy state already holds what follows the last round (FedSM's fine-tuned models)."""
    return state.get("fine-tuned") is not None


def _check_after_training(checkpoint: Mapping[str, Any], saved: Mapping[str, Any], run_config: Mapping[str, Any],
                          path: str | Path) -> None:
    """Refuse other :data:`AFTER_TRAINING` values once the checkpoint's models were fine-tuned (FedSM's state)."""
    changed = sorted(k for k in AFTER_TRAINING if saved.get(k) != run_config.get(k))
    if changed and holds_after_training(checkpoint.get("state") or {}):
        raise ValueError(f"resume-from = '{path}': the checkpoint's personalized models are already fine-tuned "
                         f"(its last round ran with {', '.join(f'{k} = {saved.get(k)!r}' for k in changed)}), so a run "
                         f"with {', '.join(f'{k} = {run_config.get(k)!r}' for k in changed)} cannot finish from it; "
                         f"resume from a checkpoint saved before the fine-tuning (a run the stopping rule ended)")
