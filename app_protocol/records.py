"""The message protocol between ServerApp and ClientApp (record keys and codecs).

Both apps import this module, so every record key is defined once.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.app.message.array import SType

GLOBAL = "global"
PERSONAL = "personal"
PERSONALIZED = "personalized"
SELECTOR = "selector"
SELECTOR_OPTIMIZER = "selector-optimizer"
CONFIG = "config"
METRICS = "metrics"
SITE_SECONDS = "site-seconds"  # in a training reply's metrics: wall seconds the site spent on the message
SITE = "site"
ROUTE = "route"  # {"site-name": ...}: the site a message is for (a simulated node may serve several)
NODE = "node"  # a node's identity: its node config's site-name, or its partition-id and num-partitions
SERVER_CONTROL = "server-control"
CONTROL_DELTA = "control-delta"
CLIENT_CONTROL_STATE = "scaffold-client-control"
PERSONAL_STATE = "personalization-client-state"
SELECTOR_MOMENTS_STATE = "selector-moments"  # the selector's Adam moments, kept at the site (selector-moments = local)
# a site's Adam state: kept at the site (local) or averaged by the server (averaged)
OPTIMIZER_STATE = "global-optimizer"
SELECTOR_STATISTICS = "selector-statistics"
# What a QUERY message asks for (its CONFIG's ASK): which site the node is, or selector statistics.
ASK = "ask"
ASK_SITE = "site"
ASK_NODE = "node"  # which site the node is named as, or its simulated partition
ASK_MODELS = "needed-models"  # which personalized models a split's images can be routed to
NEEDED_MODELS = "needed-models"
DEVICE_STATE = "device-logged"
OVERLAY_DIR = "overlay-dir"  # test evaluation: where a simulated site writes its report images
SEPARATOR = "|"


def to_record(weights: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Pack a ``name -> array`` dictionary into an ArrayRecord."""
    return ArrayRecord({key: encode_array(value) for key, value in weights.items()})


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """Unpack an ArrayRecord into a ``name -> array`` dictionary."""
    return {key: decode_array(array) for key, array in record.items()}


NPY_MAGIC = b"\x93NUMPY"
C_ORDER = b"'fortran_order': False"
LONGEST_HEADER_1_0 = 65535  # np.save switches to format 2.0 above this (never for a model's arrays)


def encode_array(value: np.ndarray) -> Array:
    """``Array(value)``, byte for byte, about 3x faster: the ``.npy`` header is built once per dtype and shape.

    Flower's ``Array(ndarray)`` runs ``np.save``, which formats the header of
    every array anew: a site packs a few hundred arrays per model and several
    models per reply. Here the header comes from a cache and the C-ordered
    data follows it as ``np.save`` writes it; an object array, or a header
    that needs format 2.0, goes through Flower's own path.
    """
    value = np.require(value, requirements="C")
    if value.dtype.hasobject:
        return Array(value)
    header = _npy_header(value.dtype.str, tuple(value.shape))
    if len(header) > LONGEST_HEADER_1_0:
        return Array(value)
    return Array(dtype=str(value.dtype), shape=tuple(value.shape), stype=SType.NUMPY,
                 data=b"".join((header, value.data)))


@functools.lru_cache(maxsize=4096)
def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The version 1.0 ``.npy`` header np.save writes for a C-ordered array of ``dtype`` and ``shape``."""
    buffer = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue()


def decode_array(array: Array) -> np.ndarray:
    """``array.numpy()``, about 5x faster for the C-ordered arrays this app sends; a writable copy.

    Flower's ``Array.numpy`` runs ``np.load``, which parses every ``.npy``
    header with ``ast.literal_eval``: half of the ServerApp's aggregation of a
    FedSM round with six sites (about 2,400 arrays). Here the dtype and shape come from the
    Array's own fields and the data after the header is copied out as is;
    an array in Fortran order, or with a header this does not recognise,
    goes through ``np.load``. A dtype or shape that does not match the data
    raises ``ValueError`` either way.
    """
    data = array.data
    if array.stype != SType.NUMPY or data[:6] != NPY_MAGIC or data[6] not in (1, 2):
        return array.numpy()
    size_bytes = 2 if data[6] == 1 else 4
    start = 8 + size_bytes + int.from_bytes(data[8:8 + size_bytes], "little")
    if C_ORDER not in data[8 + size_bytes:start]:
        return array.numpy()
    try:
        dtype = np.dtype(array.dtype)
    except TypeError as error:
        raise ValueError(f"array of unknown dtype {array.dtype!r}") from error
    if dtype.hasobject:
        raise ValueError(f"array of dtype {dtype}: object arrays are not accepted")
    values = np.frombuffer(data, dtype=dtype, offset=start)
    return values.reshape(tuple(array.shape)).copy()


def models_to_record(models: Sequence[Mapping[str, np.ndarray]]) -> ArrayRecord:
    """Pack several weight dictionaries into one record, keys ``"<index>|<name>"``."""
    return ArrayRecord(
        {f"{index}{SEPARATOR}{key}": encode_array(value)
         for index, weights in enumerate(models) for key, value in weights.items()}
    )


def models_to_record_subset(models: Sequence[Mapping[str, np.ndarray]], indices: Sequence[int]) -> ArrayRecord:
    """Only the models at ``indices`` of ``models``, each under its own index (see :func:`models_to_record`)."""
    return ArrayRecord(
        {f"{index}{SEPARATOR}{key}": encode_array(value)
         for index in sorted(set(indices)) for key, value in models[index].items()}
    )


def models_from_record(record: ArrayRecord, count: int,
                       required: Sequence[int] | None = None) -> list[dict[str, np.ndarray] | None]:
    """Inverse of :func:`models_to_record`: ``count`` slots in index order.

    Every model must be present unless ``required`` names the ones that must;
    the others are ``None`` when the record does not hold them.
    """
    models: list[dict[str, np.ndarray]] = [{} for _ in range(count)]
    for key, array in record.items():
        index, _, name = key.partition(SEPARATOR)
        if not index.isdigit() or int(index) >= count:
            raise ValueError(f"record key '{key}' does not name one of {count} models")
        models[int(index)][name] = decode_array(array)
    needed = range(count) if required is None else required
    empty = [index for index in needed if not models[index]]
    if empty:
        raise ValueError(f"record holds no weights for model(s) {empty} of {count}")
    return [weights or None for weights in models]


def to_metrics(values: Mapping[str, float | list[float]]) -> MetricRecord:
    """Metrics as floats (or lists of floats) in a MetricRecord."""
    return MetricRecord(
        {key: [float(v) for v in value] if isinstance(value, list) else float(value) for key, value in values.items()}
    )


def to_config(values: Mapping[str, int | float | str | bool]) -> ConfigRecord:
    """Plain settings in a ConfigRecord."""
    return ConfigRecord(dict(values))


STATE_KEY = "state-key"  # in the route: which run's site state (SCAFFOLD's c_k, APFL, selector moments) to use


def with_route(content: RecordDict, site: str, state_key: str = "") -> RecordDict:
    """``content`` addressed to ``site`` (a simulated node may serve several sites).

    ``state_key`` names the run whose per-site state the site keeps using: a
    resumed run sends its original run's key, so sites continue their state.
    """
    route: dict[str, str] = {"site-name": site}
    if state_key:
        route[STATE_KEY] = state_key
    return RecordDict({**content, ROUTE: to_config(route)})


def decode_route(content: RecordDict) -> str | None:
    """The site a message is addressed to, or ``None`` when it names none."""
    return str(content[ROUTE]["site-name"]) if ROUTE in content else None


def decode_state_key(content: RecordDict) -> str | None:
    """The run key of the sites' state a message names, or ``None`` (then the site uses its run id)."""
    if ROUTE not in content or STATE_KEY not in content[ROUTE]:
        return None
    return str(content[ROUTE][STATE_KEY])
