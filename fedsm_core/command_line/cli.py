"""The ``fedsm`` command: tools that run without Flower.

``fedsm check-data SOURCE ROOT``
    The data doctor on every site folder under ROOT (or on ROOT itself when
    it is one site), e.g. ``fedsm check-data prostate-slices data/ProstateSlice``.
``fedsm check-data --federation SPEC.toml``
    The data doctor on every site of a federation spec.
``fedsm check-data --dataset synthetic-fundus [--data-scale 0.5]``
    Each generated site's split sizes.
``fedsm predict --model FILE --images DIR --out DIR [--modality N] [--route-by image|case]``
    Segment every image of DIR with a super-model bundle or a single model
    (``global_model.pt``, FedBN's ``site_models/<site>.pt``): one mask PNG per
    image, same size, and ``predictions.csv`` with the model that ran. A DIR
    of NIfTI volumes gets one label volume per volume (slice by slice, on the
    input's voxel grid); 4-D volumes need ``--modality``. A bundle routes a
    volume once when its run's ``route-by`` is ``case`` (``--route-by``
    overrides it; 2-D images are always routed one by one). OUT must lie
    outside the images folder; an OUT with earlier results needs ``--overwrite``.

``fedsm check-config [--run-config "k=v ..."]``
    Check a run's settings (the app's pyproject.toml defaults with the
    overrides) before ``flwr run``: the number of sites, softpull-lambda
    against 1/K, data folders, the held-out site (:mod:`fedsm_core.command_line.preflight`).

``fedsm report RUN_FOLDER [--baseline RUN_FOLDER]``
    Rebuild ``report.html`` of a run, also of an unfinished one from its
    ``checkpoint.pt`` (RUN_FOLDER may be the checkpoint file itself).

Exit status: 0 when no errors were found, 1 when the data has errors, 2 for
bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedsm_core.algorithms.fedsm.settings import ROUTE_BY
from fedsm_core.data.doctor import site_folders
from fedsm_core.data.doctor_report import SiteReport, format_reports
from fedsm_core.data.federation import load_federation
from fedsm_core.data.files import DataError
from fedsm_core.data.load_check import check_generated_dataset, check_site_loads
from fedsm_core.data.masks import ENCODINGS
from fedsm_core.data.sources import SOURCES, data_source


def looks_like_site(path: Path, source: str) -> bool:
    """Whether ``path`` is one site folder of ``source`` rather than a folder of sites."""
    if source == "prostate-msd":
        return (path / "imagesTr").is_dir()
    if source == "prostate-nifti":
        return any(p.name.endswith((".nii", ".nii.gz")) for p in path.iterdir())
    return (path / "train").is_dir() or (path / "test").is_dir()


def check_root(source_name: str, root: Path, options: dict[str, object], seed: int = 0) -> list[SiteReport]:
    """Reports for ROOT as one site, or for each of its site folders."""
    source = data_source(source_name)
    merged = source.options(options, "command-line options")
    folders = [root] if root.is_dir() and looks_like_site(root, source_name) else site_folders(root)
    return [inspect_site(source_name, folder, merged, folder.name, seed) for folder in folders]


def inspect_site(source_name: str, path: Path, options: dict[str, object], name: str, seed: int = 0) -> SiteReport:
    """One site's report, judged with the site's own orphan policy, then loaded as training would."""
    report = data_source(source_name).inspect(path, options, name)
    report.orphans_skipped = options.get("on-orphans") == "skip"
    return check_site_loads(report, source_name, path, options, seed)


def check_federation(spec_path: Path, seed: int = 0) -> list[SiteReport]:
    """Reports for every site of a federation spec that names a data path."""
    spec = load_federation(spec_path)
    reports = []
    for site in spec.sites:
        if site.path is None:
            report = SiteReport(site.name, "-", site.source)
            report.errors.append(f"no 'path' in {spec.file}; in deployment the SuperNode's data-path is checked "
                                 "on its own machine with: fedsm check-data SOURCE PATH")
            reports.append(report)
            continue
        reports.append(inspect_site(site.source, site.path, site.options, site.name, seed))
    return reports


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; pass 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of the ``fedsm`` command."""
    parser = argparse.ArgumentParser(prog="fedsm", description="FedSM toolkit commands that run without Flower.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-data", help="check site folders before training (the data doctor)")
    check.add_argument("source", nargs="?", choices=sorted(SOURCES), help="layout of the data")
    check.add_argument("root", nargs="?", type=Path, help="a folder of site folders, or one site folder")
    check.add_argument("--federation", type=Path, help="check every site of this federation spec instead")
    check.add_argument("--dataset", help="report the sites of a generated dataset (e.g. synthetic-fundus) instead")
    check.add_argument("--data-scale", type=float, default=0.5, help="the run's data-scale (generated datasets)")
    check.add_argument("--mask-encoding", choices=sorted(ENCODINGS), help="mask encoding, if not the layout's default")
    check.add_argument("--case-pattern", help="regular expression whose first group is a file's case (patient), "
                                              "if not the layout's default (fedsm_core.data.cases)")
    check.add_argument("--data-seed", type=int, default=0,
                       help="the run's data-seed: it decides the train/validation split the counts show")
    check.add_argument("--on-orphans", choices=["fail", "skip"], default="fail",
                       help="'skip': report orphans without counting them as errors (as training with it would)")
    predict = commands.add_parser("predict", help="segment a folder of images or NIfTI volumes with a run's "
                                                  "model file")
    predict.add_argument("--model", type=Path, required=True,
                         help="super_model.pt of a FedSM run, global_model.pt of a FedAvg, FedProx, SCAFFOLD or "
                              "HarmoFL run, or site_models/<site>.pt of a FedBN run")
    predict.add_argument("--images", type=Path, required=True,
                         help="folder of 2-D images (any size) or of NIfTI volumes (.nii, .nii.gz), not both")
    predict.add_argument("--out", type=Path, required=True, help="folder for the masks and predictions.csv")
    predict.add_argument("--gamma", type=float, default=None,
                         help="selector threshold (default: the bundle's); super models only")
    predict.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    predict.add_argument("--batch-size", type=positive_int, default=8,
                         help="images (or volume slices) per forward pass (>= 1)")
    predict.add_argument("--overwrite", action="store_true",
                         help="replace the results of an earlier run in --out: the masks its predictions.csv "
                              "lists are removed first")
    predict.add_argument("--modality", type=int, default=None,
                         help="channel of 4-D NIfTI volumes to segment (x, y, z, modality; the Decathlon's "
                              "prostate: 0 = T2, 1 = ADC); required for 4-D volumes, unused by 3-D ones")
    predict.add_argument("--route-by", choices=list(ROUTE_BY), default=None,
                         help="super models: 'case' routes all slices of a NIfTI volume once, 'image' each slice "
                              "alone (default: the bundle's route-by); 2-D images have no case: image only")
    config = commands.add_parser("check-config", help="check a run's settings before flwr run starts anything")
    config.add_argument("--run-config", default="", help="overrides as for flwr run --run-config, e.g. \"lr=0.01\"")
    config.add_argument("--app", type=Path, default=Path("."), help="the app's folder (its pyproject.toml)")
    config.add_argument("--simulation", action="store_true",
                        help="every site of a federation spec must name its data folder (nodes load it)")
    config.add_argument("--print-num-sites", action="store_true",
                        help="on success print only the number of sites (for scripts)")
    report = commands.add_parser("report", help="write report.html of a run folder (also of an unfinished run)")
    report.add_argument("run", type=Path, help="a run folder (runs/<time>-<strategy>-<dataset>) or its checkpoint.pt")
    report.add_argument("--baseline", type=Path, default=None,
                        help="run folder of a baseline (a centralized run, say): its validation Dice is drawn dashed")
    return parser


def run_report(args: argparse.Namespace) -> int:
    """``fedsm report``: 0 with the report's path printed, 1 when the folder is not a run folder."""
    from fedsm_core.report.run_report import write_report

    try:
        path = write_report(args.run, args.baseline)
    except (FileNotFoundError, ValueError) as error:
        print(f"{error}", file=sys.stderr)
        return 1
    print(f"report: wrote {path}")
    return 0


def run_check_config(args: argparse.Namespace) -> int:
    """``fedsm check-config``: 0 when the settings can work, 1 with one line per problem."""
    from fedsm_core.command_line.preflight import app_defaults, check_run, parse_run_config_overrides

    try:
        values = {**app_defaults(args.app), **parse_run_config_overrides(args.run_config)}
    except ValueError as error:
        print(f"check-config: {error}", file=sys.stderr)
        return 1
    result = check_run(values, require_paths=args.simulation)
    if not result.ok:
        print("check-config: the run's settings cannot work:", file=sys.stderr)
        for problem in result.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    if args.print_num_sites:
        print(len(result.site_names))
    else:
        print(f"check-config: OK: {len(result.site_names)} sites {list(result.site_names)}, "
              f"strategy {values.get('strategy', 'fedsm')}, dataset {values.get('dataset', 'synthetic-fundus')}")
    return 0


def run_predict(args: argparse.Namespace) -> int:
    """``fedsm predict``: masks (or mask volumes) and a CSV; 1 if the model file or any input could not be used."""
    from fedsm_core.device import select_device
    from fedsm_core.inference.predict import predict_folder

    try:
        table, failures = predict_folder(args.model, args.images, args.out, args.gamma,
                                         select_device(args.device), args.batch_size, args.overwrite,
                                         args.modality, args.route_by)
    except (DataError, ValueError, OSError) as error:
        print(f"predict: {error}", file=sys.stderr)
        return 1
    for failure in failures:
        print(f"predict: skipped: {failure}", file=sys.stderr)
    written = sum(1 for _ in table.open()) - 1
    print(f"predict: wrote {written} mask(s) and {table}"
          + (f"; {len(failures)} image(s) unreadable" if failures else ""))
    return 1 if failures else 0


def run_check_data(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``fedsm check-data``: print the reports; 1 if any site has errors."""
    if args.federation is None and args.dataset is None and (args.source is None or args.root is None):
        parser.error("check-data needs SOURCE and ROOT, --federation SPEC.toml or --dataset NAME")
    try:
        if args.dataset is not None:
            reports = check_generated_dataset(args.dataset, args.data_scale, args.data_seed)
        elif args.federation is not None:
            reports = check_federation(args.federation, args.data_seed)
        else:
            options: dict[str, object] = {"on-orphans": args.on_orphans}
            if args.mask_encoding:
                options["mask-encoding"] = args.mask_encoding
            if args.case_pattern:
                options["case-pattern"] = args.case_pattern
            reports = check_root(args.source, args.root, options, args.data_seed)
    except (DataError, ValueError) as error:
        print(f"check-data: {error}", file=sys.stderr)
        return 1
    print(format_reports(reports))
    return 0 if all(report.ok for report in reports) else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedsm`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "check-data":
        return run_check_data(args, parser)
    if args.command == "predict":
        return run_predict(args)
    if args.command == "check-config":
        return run_check_config(args)
    if args.command == "report":
        return run_report(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
