"""Byte accounting of records and the traffic log written to the run folder."""

from __future__ import annotations

import csv
import time

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from support.server_fakes import error_reply, reply

from server_app.traffic import (
    RECEIVED,
    SENT,
    TrafficLog,
    array_record_bytes,
    payload_bytes,
    value_bytes,
)

NPY_HEADER = 128  # NumPy's .npy v1.0 header of these small arrays, padded to 128 bytes


def _content() -> RecordDict:
    return RecordDict({
        "model": ArrayRecord({"a": Array(np.zeros((2, 3), np.float32)), "b": Array(np.zeros(4, np.float64))}),
        "small": ArrayRecord({"c": Array(np.zeros(5, np.int8))}),
        "config": ConfigRecord({"server-round": 3, "split": "val", "flag": True, "sweep": [0.1, 0.2], "empty": []}),
        "metrics": MetricRecord({"loss": 0.5, "curve": [1.0, 2.0, 3.0]}),
    })


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, 8), (0.5, 8), (True, 1), ("val", 3), (b"\x00\x01", 2), ([0.1, 0.2], 16), (["ab", "c"], 3), ([], 0)],
)
def test_value_bytes(value, expected):
    assert value_bytes(value) == expected


def test_array_record_bytes_are_the_serialized_data_lengths():
    # Assert: (128 + 2*3*4) + (128 + 4*8)
    assert array_record_bytes(_content()["model"]) == NPY_HEADER + 24 + NPY_HEADER + 32


def test_payload_bytes_of_a_record_dict_by_hand():
    # Execute
    total, arrays = payload_bytes(_content())

    # Assert: arrays 152 + 160 + (128 + 5) = 445; config 8 + 3 + 1 + 16 + 0 = 28; metrics 8 + 24 = 32
    assert arrays == 445
    assert total == 445 + 28 + 32


def test_an_unsupported_value_is_refused():
    with pytest.raises(TypeError, match="dict"):
        value_bytes({"nested": 1})


def test_the_log_names_the_site_by_direction_and_counts_error_replies_as_empty():
    # Prepare
    sites = {101: "site-a", 102: "site-b"}
    sent = [Message(_content(), message_type=MessageType.TRAIN, dst_node_id=101)]
    replies = [reply(101, {"metrics": MetricRecord({"loss": 0.5})}), error_reply(102, "out of memory")]
    log = TrafficLog()

    # Execute
    log.add_messages(4, "train", SENT, sent, sites)
    log.add_messages(4, "train", RECEIVED, replies, sites)

    # Assert
    assert log.rows == [
        {"round": 4, "stage": "train", "site": "site-a", "direction": "sent", "bytes": 505, "array-bytes": 445},
        {"round": 4, "stage": "train", "site": "site-a", "direction": "received", "bytes": 8, "array-bytes": 0},
        {"round": 4, "stage": "train", "site": "site-b", "direction": "received", "bytes": 0, "array-bytes": 0},
    ]


def test_timed_part_ends_now_in_unix_time():
    # Prepare
    log = TrafficLog()
    before = time.time()

    # Execute
    with log.timed(2, "train"):
        pass

    # Assert
    (row,) = log.timings
    assert row["round"] == 2 and row["part"] == "train"
    assert before - 0.001 <= row["ended"] <= time.time() + 0.001


def test_write_creates_both_csv_files(tmp_path):
    # Prepare
    log = TrafficLog()
    log.add_messages(1, "evaluate", SENT, [Message(_content(), message_type=MessageType.EVALUATE,
                                                   dst_node_id=7)], {})
    log.add_time(1, "round", 2.123456, ended=1_800_000_000.12345)

    # Execute
    log.write(tmp_path)

    # Assert
    with (tmp_path / "traffic.csv").open() as handle:
        assert list(csv.DictReader(handle)) == [
            {"round": "1", "stage": "evaluate", "site": "node 7", "direction": "sent", "bytes": "505",
             "array-bytes": "445"}]
    with (tmp_path / "timing.csv").open() as handle:
        assert list(csv.DictReader(handle)) == [{"round": "1", "part": "round", "seconds": "2.1235",
                                                  "ended": "1800000000.123", "site": ""}]


def test_a_site_s_own_seconds_become_a_train_site_row_and_errors_and_old_replies_none():
    # Prepare: node 101 reports 3.5 s, node 102 replies without the metric (an older ClientApp), node 103 fails
    replies = [reply(101, {"metrics": MetricRecord({"num-examples": 4, "site-seconds": 3.5})}),
               reply(102, {"metrics": MetricRecord({"num-examples": 4})}),
               error_reply(103, "boom")]
    log = TrafficLog()

    # Execute
    log.add_site_seconds(2, replies, lambda message: f"site of node {message.metadata.src_node_id}")

    # Assert
    assert [(r["round"], r["part"], r["seconds"], r["site"]) for r in log.timings] == [
        (2, "train-site", 3.5, "site of node 101")]
