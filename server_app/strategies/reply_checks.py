"""What the server checks in a site's training reply before anything of it is averaged."""

from __future__ import annotations

from logging import WARNING

import numpy as np
from flwr.app import Message
from flwr.common import log

from app_protocol import records
from fedsm_core.algorithms.server_optimizer import ServerOptimizerSettings
from fedsm_core.models.weights import Weights, check_same_layout
from server_app.discovery import SiteNode


class ReplyChecks:
    """Checks of training replies, shared by every strategy (its base :class:`SiteStrategy`).

    A rejected reply is logged and its site recorded in :attr:`missed` for the
    round; it is never averaged. Client errors, missing keys, wrong shapes and
    NaN/Inf values are rejected; a claimed ``num-examples`` above the count the
    site reported at discovery is capped (:attr:`capped`).

    Attributes
    ----------
    nodes : list of SiteNode
        The run's sites with the counts they reported at discovery.
    missed : list of (round, site, why)
    capped : list of (round, site, claimed, reported)
    """

    nodes: list[SiteNode]
    missed: list[tuple[int, str, str]]
    capped: list[tuple[int, str, int, int]]

    def error_reason(self, reply: Message) -> str:
        """Why an error reply carries no result; strategies say which sender it was."""
        raise NotImplementedError

    def reject(self, server_round: int, site: str, reason: str) -> None:
        """Log a rejected reply and remember that the site missed the round."""
        log(WARNING, "round %d: reply of %s rejected (%s)", server_round, site, reason)
        self.missed.append((server_round, site, reason))

    def decode_weights(
        self, server_round: int, site: str, reply: Message, expected: dict[str, Weights | None]
    ) -> dict[str, Weights] | None:
        """Decode the ArrayRecords named in ``expected`` and check them; ``None`` if rejected.

        A reference of ``None`` accepts any keys and shapes (the selector's Adam
        moments, empty before their first round); the values must still be finite.
        """
        if reply.has_error():
            self.reject(server_round, site, self.error_reason(reply))
            return None
        try:
            decoded = {key: records.from_record(reply.content[key]) for key in expected}
            for key, reference in expected.items():
                if reference is not None:
                    check_same_layout(reference, decoded[key], f"'{key}' from {site}")
        except (KeyError, ValueError) as error:
            self.reject(server_round, site, f"malformed reply: {error}")
            return None
        for key, weights in decoded.items():
            bad = [name for name, value in weights.items() if not np.all(np.isfinite(value))]
            if bad:
                self.reject(server_round, site, f"non-finite values in '{key}': {bad[:3]}")
                return None
        return decoded

    def num_examples(self, server_round: int, site: str, reply: Message) -> int | None:
        """The reply's ``num-examples`` (its training-set size); ``None`` if missing or not positive (rejected)."""
        try:
            value = reply.content[records.METRICS]["num-examples"]
        except KeyError:
            self.reject(server_round, site, "malformed reply: no 'num-examples' metric")
            return None
        if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 1):
            self.reject(server_round, site, f"malformed reply: num-examples = {value!r}, expected >= 1")
            return None
        return self.capped_count(server_round, site, int(value))

    def capped_count(self, server_round: int, site: str, claimed: int) -> int:
        """``claimed``, at most the training images the site reported at discovery (a larger claim is logged).

        A site's weight in every average is its claimed count, so a site that
        claims more than it reported would outweigh the others by that alone.
        """
        reported = next((node.num_train for node in self.nodes if node.site_name == site), None)
        if reported is None or claimed <= reported:
            return claimed
        log(WARNING, "round %d: site %s claims %d training images but reported %d at discovery; counted as %d",
            server_round, site, claimed, reported, reported)
        self.capped.append((server_round, site, claimed, reported))
        return reported

    @staticmethod
    def local_steps(reply: Message) -> float:
        """The local steps a reply reports (``steps`` metric); NaN when it reports none."""
        value = reply.content[records.METRICS].get("steps", float("nan"))
        return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else float("nan")

    def has_steps(self, server_round: int, site: str, reply: Message, settings: ServerOptimizerSettings) -> bool:
        """Whether the reply reports the local steps ``step-normalization`` divides by (rejected and logged if not)."""
        if settings.step_normalization == "none" or self.local_steps(reply) >= 1:
            return True
        self.reject(server_round, site, f"malformed reply: steps = {self.local_steps(reply)!r}, expected >= 1 "
                                        "(step-normalization divides by it)")
        return False
