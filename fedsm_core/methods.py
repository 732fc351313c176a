"""The table of methods: one row per method, read by every dispatcher.

The run config checks ``strategy`` against it, the ServerApp builds a
strategy by its ``family``, the ClientApp picks a trainer by ``family``, and
the experiment scripts take display names, scores and settings from it.
Adding a method means one row here plus its algorithm file (and, for a new
family, one builder and one trainer).

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
    harmonized : bool
        HarmoFL: amplitude normalization and weight perturbation always on,
        whatever ``amplitude-normalization`` and ``weight-perturbation`` say.
    proximal : bool
        FedProx: local steps add ``proximal-mu``'s term toward the global model.
    control_variates : bool
        SCAFFOLD: server and site control variates correct every local step.
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
    score: str = "dice-global"
    harmonized: bool = False
    proximal: bool = False
    control_variates: bool = False
    extra_selector: bool = False
    settings: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"method {self.name}: family '{self.family}' is not one of {list(FAMILIES)}")

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
        Method("fedsm", "FedSM", "fedsm", score="dice-super"),
        Method("fedavg", "FedAvg", "global"),
        Method("fedprox", "FedProx", "global", proximal=True),
        Method("scaffold", "SCAFFOLD", "global", control_variates=True),
        Method("fedsm-extra", "FedSM-extra", "fedsm", score="dice-super", extra_selector=True),
        Method("harmofl", "HarmoFL", "global", harmonized=True),
        Method("fedbn", "FedBN", "site-models"),
        Method("fedsm-ampnorm", "FedSM + AmpNorm", "fedsm", score="dice-super",
               settings={"strategy": "fedsm", "amplitude-normalization": True}),
        Method("knn-per", "kNN-Per", "global", score="dice-knn-per",  # FedAvg's model, personalized at test time
               settings={"strategy": "fedavg", "knn-per": True}),
    )
}
STRATEGIES = tuple(name for name, method in METHODS.items() if method.is_strategy)


def method(name: str) -> Method:
    """The row of ``name``; ``ValueError`` lists the known names otherwise."""
    if name not in METHODS:
        raise ValueError(f"method '{name}' is not one of {list(METHODS)}")
    return METHODS[name]
