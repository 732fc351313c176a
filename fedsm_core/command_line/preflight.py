"""Settings checked before a run starts: everything knowable without nodes.

``flwr run`` starts a SuperLink, the ServerApp makes a run folder and waits
for every node before a strategy is built; a setting that cannot work (a
SoftPull lambda below 1/K, a missing federation spec, an unknown held-out
site, a data folder that does not exist) used to fail only then.
:func:`check_run` finds these problems from the run config alone, all at once:

- the run config parses (known keys, values in range);
- the dataset resolves to its sites, ``held-out-site`` names one of them, and
  two or more sites remain (``K``);
- ``softpull-lambda`` lies in ``[1/K, 1]`` when FedSM's SoftPull runs;
- ``min-replies`` is at most ``K``;
- every site of a federation spec has a data folder that exists (in
  simulation each node loads the spec's ``path``; in deployment a SuperNode
  may name its own, so a missing ``path`` is then no error);
- ``resume-from`` names an existing file and ``output-dir`` is not a file.

Any number of simulated SuperNodes serves the K sites
(:mod:`server_app.site_assignment`), so their number is not checked.

``fedsm check-config`` prints the result; ``scripts/run-simulation.sh`` calls it
before ``flwr run`` and the ServerApp runs the same checks before it creates
anything.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomllib

from fedsm_core.algorithms.fedsm.softpull import check_lam
from fedsm_core.config import RunConfig
from fedsm_core.data.federation import load_federation, locate_spec
from fedsm_core.data.registry import training_dataset
from fedsm_core.methods import METHODS

# flwr's own pattern for --run-config "k=v k2='text'" (flwr.common.config.parse_config_args)
_PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")


@dataclasses.dataclass(frozen=True)
class RunCheck:
    """What :func:`check_run` found.

    Attributes
    ----------
    site_names : tuple of str
        The sites the run trains on (empty when the dataset did not resolve).
    problems : tuple of str
        One message per problem, each naming the setting, the value and the fix.
    """

    site_names: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """No problems found."""
        return not self.problems


def parse_run_config_overrides(text: str) -> dict[str, Any]:
    """``"k=v k2='text'"`` as ``flwr run --run-config`` reads it (TOML values)."""
    pairs = _PAIR.findall(text)
    leftover = _PAIR.sub("", text).strip()
    if leftover:
        raise ValueError(f"--run-config: '{leftover}' is not key=value; write e.g. \"num-server-rounds=5 lr=0.01\"")
    try:
        return tomllib.loads("\n".join(f'"{key}" = {value}' for key, value in pairs))
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"--run-config '{text}': {error}; strings need quotes, e.g. dataset='x.toml'") from None


def app_defaults(app_dir: Path) -> dict[str, Any]:
    """``[tool.flwr.app.config]`` of ``app_dir/pyproject.toml`` (what ``flwr run`` starts from)."""
    path = Path(app_dir) / "pyproject.toml"
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"cannot read the app's settings from {path} ({error}); "
                         "pass --app with the app's folder") from error
    return dict(document.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))


def _data_problems(config: RunConfig, require_paths: bool) -> list[str]:
    if not config.dataset.endswith(".toml"):
        return []
    spec = load_federation(locate_spec(config.dataset))
    problems = []
    for site in spec.sites:
        if site.name == config.held_out_site:
            continue
        if site.path is None:
            if require_paths:
                problems.append(f"site '{site.name}' of {spec.file} has no 'path': in simulation each node loads the "
                                "spec's path; add path = \"<folder>\" to its [[sites]] table")
        elif not site.path.is_dir():
            problems.append(f"site '{site.name}' of {spec.file}: data folder {site.path} does not exist; fix its "
                            "'path' (relative paths start at the spec's folder)")
    return problems


def _site_problems(config: RunConfig, site_names: tuple[str, ...]) -> list[str]:
    problems, num_sites = [], len(site_names)
    if METHODS[config.strategy].family == "fedsm" and config.personalization == "softpull":
        try:
            check_lam(config.softpull_lambda, num_sites)
        except ValueError as error:
            problems.append(str(error))
    if config.aggregation == "krum":
        # Krum needs 2f + 3 replies; SoftPull's Krum runs over the K - 1 other sites, so FedSM needs one more
        extra = 1 if METHODS[config.strategy].family == "fedsm" else 0
        needed = 2 * config.krum_byzantine + 3 + extra
        if num_sites < needed:
            problems.append(f"aggregation = 'krum' with krum-byzantine = {config.krum_byzantine} needs at least "
                            f"{needed} sites, the run has {num_sites}; lower krum-byzantine or use 'trimmed-mean' "
                            "or 'median'")
    unknown = [site for site in config.attack_settings.sites if site not in site_names]
    if unknown:
        problems.append(f"attack = '{config.attack}' names {unknown}, which are not sites of the run "
                        f"{list(site_names)}")
    if config.min_replies > num_sites:
        problems.append(f"min-replies = {config.min_replies} is more than the {num_sites} sites of the run; "
                        f"set it to {num_sites} or less")
    return problems


def _file_problems(config: RunConfig) -> list[str]:
    problems = []
    if config.resume_from and not Path(config.resume_from).expanduser().is_file():
        problems.append(f"resume-from = '{config.resume_from}' does not exist; pass the checkpoint.pt of an "
                        "earlier run folder, or leave resume-from empty")
    output = Path(config.output_dir).expanduser()
    if output.exists() and not output.is_dir():
        problems.append(f"output-dir = '{config.output_dir}' is a file; pass a folder")
    return problems


def check_run(values: Mapping[str, Any] | RunConfig, require_paths: bool = False) -> RunCheck:
    """Every problem of a run's settings that can be found without nodes.

    Parameters
    ----------
    values : mapping or RunConfig
        The run config (kebab-case keys, as ``flwr run`` passes it) or a parsed one.
    require_paths : bool
        Whether every site of a federation spec must name its data folder
        (simulation); in deployment SuperNodes may name their own.
    """
    try:
        config = values if isinstance(values, RunConfig) else RunConfig.from_mapping(values)
    except (TypeError, ValueError) as error:
        return RunCheck((), (str(error),))
    problems = _file_problems(config)
    try:
        info = training_dataset(config.dataset, config.held_out_site)
        problems += _data_problems(config, require_paths)
    except (OSError, ValueError) as error:
        return RunCheck((), (*problems, str(error)))
    problems += _site_problems(config, tuple(info.site_names))
    return RunCheck(info.site_names, tuple(problems))


def require_valid_run(config: RunConfig) -> tuple[str, ...]:
    """The ServerApp's start: the sites, or a ValueError listing every problem before anything is created."""
    result = check_run(config)
    if not result.ok:
        raise ValueError("the run's settings cannot work; nothing was started:\n- " + "\n- ".join(result.problems)
                         + "\nCheck settings with: fedsm check-config --run-config \"...\"")
    return result.site_names
