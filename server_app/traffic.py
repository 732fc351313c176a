"""Bytes on the wire and wall time of every exchange the ServerApp makes.

The payload of a message is measured from its records, as they are sent:

* ArrayRecord: the length of each Array's serialized ``data`` (NumPy's
  ``.npy`` bytes: the values plus a header of about 128 bytes per array);
* ConfigRecord and MetricRecord: 8 bytes per number, 1 per bool, the length
  of strings and bytes, element by element for lists (Flower's own
  ``count_bytes`` convention, which fails on empty lists);
* the record and entry keys are not counted.

This is the payload, not the size of the gRPC frames: protobuf adds a few
bytes per entry, and the transport its own framing.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Self

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from app_protocol.records import METRICS as METRICS_RECORD
from app_protocol.records import SITE_SECONDS

TRAFFIC_FILE = "traffic.csv"
TIMING_FILE = "timing.csv"
TRAFFIC_COLUMNS = ("round", "stage", "site", "direction", "bytes", "array-bytes")
# ``ended`` is Unix time (s): it lines a part up with samples taken by other tools (GPU use, memory).
# ``site`` is set on the rows a site reported itself (part ``train-site``: its time on a training message).
TIMING_COLUMNS = ("round", "part", "seconds", "ended", "site")
SITE_TRAIN = "train-site"
SENT, RECEIVED = "sent", "received"
NUMBER_BYTES = 8


def value_bytes(value: object) -> int:
    """Approximate payload of one ConfigRecord/MetricRecord value (see the module docstring)."""
    if isinstance(value, list):
        return sum(value_bytes(item) for item in value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, (int, float)):
        return NUMBER_BYTES
    if isinstance(value, (str, bytes)):
        return len(value)
    raise TypeError(f"cannot size a record value of type {type(value).__name__}: {value!r}")


def array_record_bytes(record: ArrayRecord) -> int:
    """Sum of the serialized ``data`` lengths of the record's Arrays."""
    return sum(len(array.data) for array in record.values())


def payload_bytes(content: RecordDict) -> tuple[int, int]:
    """``(total, arrays)``: payload bytes of a RecordDict and the part held in ArrayRecords."""
    arrays = other = 0
    for record in content.values():
        if isinstance(record, ArrayRecord):
            arrays += array_record_bytes(record)
        elif isinstance(record, (ConfigRecord, MetricRecord)):
            other += sum(value_bytes(value) for value in record.values())
        else:
            raise TypeError(f"cannot size a record of type {type(record).__name__}")
    return arrays + other, arrays


class TrafficLog:
    """Per-round, per-site bytes sent and received, and wall time of the parts of each round.

    Rows of ``rows``: ``round, stage, site, direction, bytes, array-bytes``, one
    per message (``stage`` is the message type, or a label such as ``test``).
    Rows of ``timings``: ``round, part, seconds, ended`` (Unix time at the end of the part) and
    ``site``, empty except on the rows of a site's own time.
    """

    def __init__(self) -> None:
        self.rows: list[dict[str, object]] = []
        self.timings: list[dict[str, object]] = []

    def add_messages(self, server_round: int, stage: str, direction: str, messages: Iterable[Message],
                     site_of: Callable[[Message], str] | Mapping[int, str]) -> None:
        """One row per message, labelled with its site.

        ``site_of`` maps a message to its site, or is a node id -> site mapping
        (destination for sent, source for received messages). Replies that
        carry an error instead of content are recorded with 0 bytes.
        """
        for message in messages:
            if callable(site_of):
                site = site_of(message)
            else:
                node = message.metadata.dst_node_id if direction == SENT else message.metadata.src_node_id
                site = site_of.get(node, f"node {node}")
            total, arrays = (0, 0) if message.has_error() else payload_bytes(message.content)
            self.rows.append({"round": server_round, "stage": stage, "site": site,
                              "direction": direction, "bytes": total, "array-bytes": arrays})

    def add_time(self, server_round: int, part: str, seconds: float, ended: float | None = None,
                 site: str = "") -> None:
        """Record the wall time of one part (``train``, ``evaluate``, ``round``, ...) of a round.

        ``ended`` (Unix time) defaults to now, the usual case of a part that just finished.
        """
        ended = time.time() if ended is None else ended
        self.timings.append({"round": server_round, "part": part, "seconds": round(seconds, 4),
                             "ended": round(ended, 3), "site": site})

    def add_site_seconds(self, server_round: int, replies: Iterable[Message],
                         site_of: Callable[[Message], str]) -> None:
        """One ``train-site`` row per training reply that reports its site's own seconds.

        Against the exchange's ``train`` row this splits a round into the sites'
        work and the rest (transfer, queueing, a site waiting for a worker).
        """
        for reply in replies:
            if reply.has_error():
                continue
            seconds = reply.content[METRICS_RECORD].get(SITE_SECONDS) if METRICS_RECORD in reply.content else None
            if isinstance(seconds, (int, float)):
                self.add_time(server_round, SITE_TRAIN, float(seconds), site=site_of(reply))

    def timed(self, server_round: int, part: str) -> _Timer:
        """Context manager that records the wall time of its block as ``part`` of ``server_round``."""
        return _Timer(self, server_round, part)

    def write(self, folder: Path) -> None:
        """Write ``traffic.csv`` and ``timing.csv`` into ``folder``."""
        for name, columns, rows in ((TRAFFIC_FILE, TRAFFIC_COLUMNS, self.rows),
                                    (TIMING_FILE, TIMING_COLUMNS, self.timings)):
            with (Path(folder) / name).open("w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)


class _Timer:
    def __init__(self, log: TrafficLog, server_round: int, part: str) -> None:
        self.log, self.server_round, self.part = log, server_round, part
        self.started = 0.0

    def __enter__(self) -> Self:
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.log.add_time(self.server_round, self.part, time.monotonic() - self.started)
