"""The ServerApp's start: on a federation whose every site takes a few minibatches a round it suggests more."""

from __future__ import annotations

import server_app.app as server_app

RUN = "num-server-rounds=1 image-size=32 data-scale=0.1 eval-every=1 strategy='fedavg' batch-size=8"


def test_a_federation_of_short_rounds_is_told_about_min_local_steps(in_process_app, monkeypatch):
    # Prepare: the ServerApp's log lines, as formatted
    lines: list[str] = []
    flower_log = server_app.log
    monkeypatch.setattr(server_app, "log", lambda level, msg, *args: (lines.append(msg % args),
                                                                      flower_log(level, msg, *args)))

    # Execute: one round on six sites of a few images each (data-scale 0.1: one or two minibatches of 8)
    in_process_app(RUN)

    # Assert
    hints = [line for line in lines if line.startswith("Hint: every site takes fewer than 4 minibatches a round")]
    assert len(hints) == 1 and "min-local-steps = 8" in hints[0] and "site-6" in hints[0], lines[:12]
