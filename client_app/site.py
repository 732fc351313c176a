"""Which site a message is for: named by the message, or by the node's config.

In simulation a node may serve several sites: the server assigns the sites
to the nodes it has and names the site in every message (the ``route``
record). In deployment a SuperNode is one site, named by its node config; a
message for another site is then an error.
"""

from __future__ import annotations

from collections.abc import Mapping


def resolve_site_index(node_config: Mapping[str, object], site_names: tuple[str, ...]) -> int:
    """Map a node to a site of the dataset.

    A SuperNode started with ``--node-config "site-name=site-3"`` is that site;
    in simulation the engine sets ``partition-id`` and the node is site
    ``partition-id``. Arrival order never decides.

    Raises
    ------
    ValueError
        When neither key is set, the site name is unknown, or the partition id
        is outside the dataset's sites.
    """
    if "site-name" in node_config:
        name = str(node_config["site-name"])
        if name not in site_names:
            raise ValueError(f"node config site-name = '{name}' is not a site of the dataset {list(site_names)}")
        return site_names.index(name)
    if "partition-id" in node_config:
        index = int(node_config["partition-id"])  # type: ignore[arg-type]
        if not 0 <= index < len(site_names):
            raise ValueError(
                f"partition-id = {index} but the dataset has {len(site_names)} sites {list(site_names)}; "
                f"run the simulation with num-supernodes={len(site_names)}"
            )
        return index
    raise ValueError(
        "this node has neither 'site-name' nor 'partition-id' in its node config; start the SuperNode "
        "with --node-config \"site-name=<one of " + ", ".join(site_names) + ">\""
    )


def node_data_paths(node_config: Mapping[str, object]) -> dict[str, str]:
    """``{site-name: data-path}`` from a SuperNode's node config, or ``{}``.

    In deployment each SuperNode names its own data folder; the federation
    spec then only lists the sites and their sources.

    Raises
    ------
    ValueError
        When ``data-path`` is given without ``site-name``.
    """
    if "data-path" not in node_config:
        return {}
    if "site-name" not in node_config:
        raise ValueError("node config has data-path but no site-name; start the SuperNode with "
                         "--node-config \"site-name='<site>' data-path='<folder>'\"")
    return {str(node_config["site-name"]): str(node_config["data-path"])}


def site_of_message(route: Mapping[str, object] | None, node_config: Mapping[str, object],
                    site_names: tuple[str, ...]) -> int:
    """The index of the site a message is for.

    Parameters
    ----------
    route : mapping or None
        The message's ``route`` record (``{"site-name": ...}``), if it has one.
    node_config : mapping
        The node's config; without a route it decides (:func:`resolve_site_index`).

    Raises
    ------
    ValueError
        When the routed site is unknown, or differs from the site the
        SuperNode was started as.
    """
    if route is None:
        return resolve_site_index(node_config, site_names)
    name = str(route["site-name"])
    if name not in site_names:
        raise ValueError(f"the message is for site '{name}', which is not a site of the dataset {list(site_names)}")
    if "site-name" in node_config and str(node_config["site-name"]) != name:
        raise ValueError(f"this SuperNode is site '{node_config['site-name']}' (its --node-config) but the message "
                         f"is for site '{name}'; start one SuperNode per site, each with its own site-name")
    return site_names.index(name)


def node_identity(node_config: Mapping[str, object]) -> dict[str, int | str]:
    """What a node tells the server about itself: its site name, or its partition (simulation).

    Raises
    ------
    ValueError
        When the node config has neither (the message says how to start the SuperNode).
    """
    if "site-name" in node_config:
        return {"site-name": str(node_config["site-name"])}
    if "partition-id" in node_config and "num-partitions" in node_config:
        return {"partition-id": int(node_config["partition-id"]),  # type: ignore[arg-type]
                "num-partitions": int(node_config["num-partitions"])}  # type: ignore[arg-type]
    raise ValueError("this node has neither 'site-name' nor 'partition-id' in its node config; start the SuperNode "
                     "with --node-config \"site-name=<site>\"")


def node_device(node_config: Mapping[str, object], run_device: str) -> str:
    """The device this node trains on: its node config's ``device``, else the run config's.

    A SuperNode on a machine with several GPUs pins one with
    ``--node-config "... device='cuda:1'"``; every other node keeps the run's
    ``device`` (``auto`` by default).

    Raises
    ------
    ValueError
        When the node config's ``device`` is empty.
    """
    if "device" not in node_config:
        return run_device
    device = str(node_config["device"]).strip()
    if not device:
        raise ValueError("node config device = '' is empty; start the SuperNode with --node-config "
                         "\"... device='cuda:1'\" (or 'cuda', 'cpu', 'auto'), or leave the key out")
    return device
