"""The whole app in this process: the real ServerApp main loop talks to the real ClientApp handlers.

What ``flwr run .`` adds on top (a SuperLink, Ray, one worker process per node)
is the transport, tested by the few real ``flwr run`` smoke tests. Everything
the app itself does runs here, in seconds instead of about half a minute:
discovery, every strategy's rounds, per-site state kept between rounds, the
test evaluation, the run folder and the checkpoint. The fast integration
tests run on it, and so does the robustness study (its attacks live in the
ClientApp).

Messages are copied both ways (as the transport would serialize them), so a
ClientApp that changed an array in place could never reach the server's copy.
An exception in a handler becomes an error reply, as Flower's runtime makes it.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from flwr.app import Context, Error, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from client_app.app import app as client_app
from fedsm_core.command_line.preflight import app_defaults, parse_run_config_overrides
from server_app.app import main as server_main

ROOT = Path(__file__).resolve().parents[1]
FIRST_NODE_ID = 100
CLIENT_APP_EXCEPTION = 4  # flwr's ErrorCode.CLIENT_APP_RAISED_EXCEPTION


class InProcessGrid:
    """``num_nodes`` simulated SuperNodes, each with its own Context, as ``flwr run .`` starts them."""

    def __init__(self, run_config: Mapping[str, object], num_nodes: int) -> None:
        self.contexts = {
            FIRST_NODE_ID + k: Context(run_id=1, node_id=FIRST_NODE_ID + k, state=RecordDict(),
                                       node_config={"partition-id": k, "num-partitions": num_nodes},
                                       run_config=dict(run_config))
            for k in range(num_nodes)
        }
        # (message type, node) of each message sent; never the messages, whose weights would pile up over
        # a long run (a 100-round run held gigabytes of them)
        self.sent: list[tuple[str, int]] = []
        self.log: list[str] = []  # what the run logged through Flower's logger
        self._next_id = 0

    def get_node_ids(self) -> list[int]:
        """The connected nodes."""
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        """Each message handled by its node's ClientApp, in order; one reply per message."""
        return [self._handle(message) for message in messages]

    def _handle(self, message: Message) -> Message:
        self._next_id += 1
        message.metadata.__dict__["_message_id"] = f"message-{self._next_id}"
        node = message.metadata.dst_node_id
        self.sent.append((message.metadata.message_type, node))
        delivered = Message(copy.deepcopy(message.content), dst_node_id=node,
                            message_type=message.metadata.message_type)
        delivered.metadata.__dict__["_message_id"] = message.metadata.message_id
        try:
            reply = client_app(delivered, self.contexts[node])
            answer = Message(copy.deepcopy(reply.content), reply_to=message)
        except Exception as error:  # noqa: BLE001 - Flower's runtime turns any ClientApp exception into an error reply
            answer = Message(Error(CLIENT_APP_EXCEPTION, f"{type(error).__name__}: {error}"), reply_to=message)
        return answer


def run_config_of(overrides: str | Mapping[str, object], runs: Path) -> dict[str, object]:
    """The app's ``[tool.flwr.app.config]`` with ``overrides`` (``flwr run --run-config`` text or a mapping)."""
    extra = parse_run_config_overrides(overrides) if isinstance(overrides, str) else dict(overrides)
    return {**app_defaults(ROOT), "output-dir": str(runs), **extra}


def run_app(runs: Path, overrides: str | Mapping[str, object], num_nodes: int = 6) -> InProcessGrid:
    """Run the ServerApp's main loop against ``num_nodes`` in-process nodes; the run folder goes under ``runs``."""
    run_config = run_config_of(overrides, runs)
    grid = InProcessGrid(run_config, num_nodes)
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    handler = _LineCollector(grid.log)
    logging.getLogger("flwr").addHandler(handler)
    try:
        server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    finally:
        logging.getLogger("flwr").removeHandler(handler)
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
    return grid


class _LineCollector(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
