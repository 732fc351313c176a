"""The table of methods: one row per method, read by every dispatcher.

The run config checks ``strategy`` against it, the ServerApp builds the
strategy its row names (``server``, resolved in ``server_app/strategies/builder.py``),
the ClientApp runs the site round its row names (``site_round``, resolved in
``client_app/app.py``), local training adds the terms its row names
(``local_terms``), and the experiment scripts take display names, scores and
settings from it. Adding a FedAvg variant means its algorithm file and one row;
a new kind of server or site round adds one entry to the registry that resolves it.

Families
--------
``global``
    One global model trained by every site (FedAvg and its variants); the
    deployed model is the global one.
``fedsm``
    A global model, K personalized models and a selector (FedSM and FedSM-extra);
    the deployed model is the super model.
``site-models``
    One model per site sharing all but some layers (FedBN); each site deploys its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

FAMILIES = ("global", "fedsm", "site-models")
SERVERS = ("fedavg", "scaffold", "fedsm", "fedsm-extra", "fedbn")  # server_app.strategies.builder.BUILDERS
SITE_ROUNDS = ("single-model", "fedsm", "fedsm-extra")  # client_app.app.SITE_ROUNDS
LOCAL_TERMS = ("proximal", "control-variates", "amplitude-normalization", "weight-perturbation")
MODEL_FILES = {"global": "global_model.pt", "fedsm": "super_model.pt", "site-models": "site_models"}


@dataclasses.dataclass(frozen=True)
class Method:
    """One method of the toolkit.

    Attributes
    ----------
    name : str
        Its name in ``strategy`` (or, with ``settings``, in the experiment scripts).
    display : str
        Its name in tables and logs.
    family : str
        One of :data:`FAMILIES`: how the server and the clients run it.
    score : str
        The test metric of what it deploys (``dice-global``, ``dice-super``, ...).
    server : str
        The strategy the ServerApp builds for it (one of :data:`SERVERS`).
    site_round : str
        What a site runs each round (one of :data:`SITE_ROUNDS`).
    local_terms : tuple of str
        What local training always adds (each one of :data:`LOCAL_TERMS`):
        ``proximal`` (FedProx: ``proximal-mu``'s term toward the global model),
        ``control-variates`` (SCAFFOLD: the server's and the site's control
        variates correct every local step), ``amplitude-normalization`` and
        ``weight-perturbation`` (HarmoFL: on whatever those keys say).
    extra_selector : bool
        FedSM-extra: the selector is trained only in ``extra-rounds`` after the
        models, with ``K + 1`` outputs (the global model is one of them).
    settings : mapping
        For a method that is a strategy plus settings (``fedsm-ampnorm``,
        ``knn-per``): the run-config keys that make it; empty for a strategy.
    """

    name: str
    display: str
    family: str
    server: str
    site_round: str
    score: str = "dice-global"
    local_terms: tuple[str, ...] = ()
    extra_selector: bool = False
    settings: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for field, value, allowed in (("family", self.family, FAMILIES), ("server", self.server, SERVERS),
                                      ("site_round", self.site_round, SITE_ROUNDS)):
            if value not in allowed:
                raise ValueError(f"method {self.name}: {field} '{value}' is not one of {list(allowed)}")
        unknown = sorted(set(self.local_terms) - set(LOCAL_TERMS))
        if unknown:
            raise ValueError(f"method {self.name}: local terms {unknown} are not among {list(LOCAL_TERMS)}")

    def adds(self, term: str) -> bool:
        """Whether local training always adds ``term`` (one of :data:`LOCAL_TERMS`) for this method."""
        if term not in LOCAL_TERMS:
            raise ValueError(f"'{term}' is not a local term; known: {list(LOCAL_TERMS)}")
        return term in self.local_terms

    @property
    def model_file(self) -> str:
        """The file (or folder) of the run folder that holds the deployed model."""
        return MODEL_FILES[self.family]

    @property
    def is_strategy(self) -> bool:
        """Whether ``strategy = <name>`` runs it (otherwise it is a strategy with ``settings``)."""
        return not self.settings

    @property
    def strategy(self) -> str:
        """The ``strategy`` value that runs it."""
        return str(self.settings.get("strategy", self.name))


METHODS: dict[str, Method] = {
    method.name: method
    for method in (
        Method("fedsm", "FedSM", "fedsm", "fedsm", "fedsm", score="dice-super"),
        Method("fedavg", "FedAvg", "global", "fedavg", "single-model"),
        Method("fedprox", "FedProx", "global", "fedavg", "single-model", local_terms=("proximal",)),
        Method("scaffold", "SCAFFOLD", "global", "scaffold", "single-model", local_terms=("control-variates",)),
        Method("fedsm-extra", "FedSM-extra", "fedsm", "fedsm-extra", "fedsm-extra", score="dice-super",
               extra_selector=True),
        Method("harmofl", "HarmoFL", "global", "fedavg", "single-model",
               local_terms=("amplitude-normalization", "weight-perturbation")),
        Method("fedbn", "FedBN", "site-models", "fedbn", "single-model"),
        Method("fedsm-ampnorm", "FedSM + AmpNorm", "fedsm", "fedsm", "fedsm", score="dice-super",
               settings={"strategy": "fedsm", "amplitude-normalization": True}),
        Method("knn-per", "kNN-Per", "global", "fedavg", "single-model", score="dice-knn-per",  # FedAvg's model,
               settings={"strategy": "fedavg", "knn-per": True}),  # personalized at test time
        Method("fedsm-knn-per", "FedSM + kNN-Per", "fedsm", "fedsm", "fedsm", score="dice-super-knn",
               settings={"strategy": "fedsm", "knn-per": True}),  # kNN-Per on each image's routed model
        Method("fedsm-softpull", "FedSM (SoftPull's models)", "fedsm", "fedsm", "fedsm", score="dice-super",
               settings={"strategy": "fedsm", "fine-tune-passes": 0}),  # the paper's: no final fine-tuning
    )
}
STRATEGIES = tuple(name for name, method in METHODS.items() if method.is_strategy)


def method(name: str) -> Method:
    """The row of ``name``; ``ValueError`` lists the known names otherwise."""
    if name not in METHODS:
        raise ValueError(f"method '{name}' is not one of {list(METHODS)}")
    return METHODS[name]
