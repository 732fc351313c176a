"""The comparison script on its in-process methods (centralized and local)."""

from __future__ import annotations

import pytest

from experiments.comparison_table import read_long_csv
from experiments.compare import main, parse_overrides

TINY = "num-server-rounds=1 image-size=32 data-scale=0.1 max-local-steps=1"


def test_overrides_take_toml_values():
    assert parse_overrides('lr=0.002 selector-negatives=false dataset="synthetic-fundus" encoder=resnet18') == {
        "lr": 0.002, "selector-negatives": False, "dataset": "synthetic-fundus", "encoder": "resnet18",
    }
    with pytest.raises(ValueError, match="not key=value"):
        parse_overrides("lr")


def test_centralized_and_local_rows_cover_every_site_and_the_table_lists_them(tmp_path):
    # Execute
    main(["--methods", "centralized", "local", "--seeds", "0", "--run-config", TINY, "--out", str(tmp_path)])

    # Assert
    rows = read_long_csv(tmp_path / "results.csv")
    methods = ["Centralized", *[f"Local-{k}" for k in range(1, 7)]]
    columns = {f"site-{k}" for k in range(1, 7)} | {"pooled"}
    for method in methods:
        assert {r["site"] for r in rows if r["method"] == method} == columns
    assert all(0.0 <= float(r["value"]) <= 1.0 for r in rows)
    table = (tmp_path / "table.md").read_text()
    for method in methods:
        assert f"| {method} |" in table
    assert (tmp_path / "curves.png").exists()


def test_a_bad_setting_fails_before_training(tmp_path):
    with pytest.raises(ValueError, match="image-size = 48"):
        main(["--methods", "centralized", "--seeds", "0", "--run-config", "image-size=48", "--out", str(tmp_path)])


def test_rows_are_labelled_by_the_normalization_that_ran():
    from experiments.compare import method_label
    from fedsm_core.config import RunConfig

    assert method_label("FedBN", RunConfig(strategy="fedbn")) == "FedBN"
    assert method_label("FedAvg", RunConfig(strategy="fedavg")) == "FedAvg"
    assert method_label("FedAvg", RunConfig(strategy="fedavg", segmentation_norm="batch")) == "FedAvg (BatchNorm)"
    assert method_label("Centralized", RunConfig(segmentation_norm="batch")) == "Centralized (BatchNorm)"
