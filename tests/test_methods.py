"""The table of methods: every row resolves its server and its site round by name, and bad rows are refused."""

from __future__ import annotations

import pytest

from client_app.app import SITE_ROUNDS as CLIENT_SITE_ROUNDS
from fedsm_core.methods import LOCAL_TERMS, METHODS, SERVERS, SITE_ROUNDS, Method
from server_app.strategies.builder import BUILDERS


def test_every_server_and_site_round_name_has_exactly_one_implementation():
    assert set(BUILDERS) == set(SERVERS)
    assert set(CLIENT_SITE_ROUNDS) == set(SITE_ROUNDS)
    assert {row.server for row in METHODS.values()} <= set(BUILDERS)


def test_fedavg_variants_differ_from_fedavg_only_in_their_local_terms():
    fedavg = METHODS["fedavg"]
    for name, terms in (("fedprox", ("proximal",)), ("harmofl", ("amplitude-normalization", "weight-perturbation"))):
        row = METHODS[name]
        assert (row.server, row.site_round, row.family) == (fedavg.server, fedavg.site_round, fedavg.family)
        assert row.local_terms == terms and all(row.adds(term) for term in terms)
    assert not any(fedavg.adds(term) for term in LOCAL_TERMS)


@pytest.mark.parametrize(("fields", "match"), [
    ({"server": "fedsgd"}, "server 'fedsgd' is not one of"),
    ({"site_round": "two-models"}, "site_round 'two-models' is not one of"),
    ({"local_terms": ("momentum",)}, r"local terms \['momentum'\] are not among"),
])
def test_a_row_naming_an_unknown_part_is_refused(fields, match):
    row = {"name": "new", "display": "New", "family": "global", "server": "fedavg", "site_round": "single-model"}
    with pytest.raises(ValueError, match=match):
        Method(**{**row, **fields})


def test_asking_for_an_unknown_local_term_is_an_error_not_false():
    with pytest.raises(ValueError, match="'proximal-term' is not a local term"):
        METHODS["fedprox"].adds("proximal-term")
