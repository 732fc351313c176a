"""The test evaluation's request for the run report's images: encoded by the server, read by the site."""

from __future__ import annotations

import numpy as np

from app_protocol.evaluate_messages import (
    ask_for_overlays,
    decode_evaluation,
    encode_model_evaluation,
    encode_super_model_evaluation,
)


def _weights(value: float) -> dict[str, np.ndarray]:
    return {"w": np.array([value], dtype=np.float32)}


def test_the_overlay_folder_round_trips_with_either_evaluation():
    # Prepare
    single = encode_model_evaluation(_weights(1.0), "test")
    super_model = encode_super_model_evaluation(_weights(1.0), [_weights(0.0), _weights(2.0)], _weights(3.0),
                                                "test", 0.5)

    # Execute
    requests = [decode_evaluation(ask_for_overlays(content, "/runs/r/overlays"), 2)
                for content in (single, super_model)]

    # Assert
    assert [request.overlay_dir for request in requests] == ["/runs/r/overlays"] * 2
    assert requests[1].super_model is not None  # the rest of the request is untouched


def test_no_overlays_unless_asked():
    request = decode_evaluation(encode_model_evaluation(_weights(1.0), "val"), 2)

    assert request.overlay_dir == ""
