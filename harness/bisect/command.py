"""`harness bisect` from the command line: pick the cell shape, read --good/--bad, and run the search
over releases (swapping one package at a time first when both differ) or over a checkout's commits."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Mapping, Sequence

from harness.bisect.search import PACKAGES, BisectResult, Probe, SameVerdictError, Verdict, bisect, timed, write_json
from harness.errors import ConfigError
from harness.results.nightly_records import BisectRecord


def parse_side(text: str, package: str | None, flag: str) -> dict[str, str]:
    """`5.20.0` (of --package), or `torch=2.11.0,transformers=5.19.0` for a cell with both different."""
    if "=" not in text:
        if not package:
            raise ConfigError(f"{flag} {text!r}: say which package (--package), or write torch=V,transformers=V")
        return {package: text}
    pairs = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name, value = name.strip(), value.strip().lstrip("=")
        if name not in PACKAGES or not value:
            raise ConfigError(f"{flag} {text!r}: expected PACKAGE=VERSION pairs of {', '.join(PACKAGES)}")
        pairs[name] = value
    return pairs


def split_test_ids(arguments: Sequence[str]) -> tuple[list[str], list[str]]:
    """(test ids or files, the other pytest arguments): `tests/gpu/test_x.py::test_y[2]` is a test id,
    the value of an option such as `-k` is not."""
    ids: list[str] = []
    rest: list[str] = []
    takes_value = False
    for argument in arguments:
        if takes_value:
            rest.append(argument)
            takes_value = False
        elif argument in ("-k", "-m", "-p", "-o", "--deselect", "--ignore", "--rootdir", "-c"):
            rest.append(argument)
            takes_value = True
        elif not argument.startswith("-") and ("::" in argument or argument.endswith(".py")):
            ids.append(argument)
        else:
            rest.append(argument)
    return ids, rest


def choose_cell(cells: Sequence, source: str, patterns: list[str] | None):
    """One cell shape: every selected cell must agree on GPU type and count."""
    if not cells:
        raise ConfigError(f"{source}: no cell matches --cell {' '.join(patterns or [])}")
    shapes = sorted({(cell.gpu, cell.gpus) for cell in cells})
    if len(shapes) > 1:
        listed = ", ".join(f"{gpu} x{count}" for gpu, count in shapes)
        raise ConfigError(f"{source}: --cell selects {len(shapes)} cell shapes ({listed}); pick one with --cell")
    return cells[0]


def command(args) -> int:
    from harness.engines import Interrupted, interruptible
    from harness.plan.matrix import load_matrix, select
    from harness.run import plan as run_plan
    from harness.run.prepare import harness_import_path

    if args.pytest_args and args.pytest_args[0] == "--":
        args.pytest_args = args.pytest_args[1:]
    if args.runs < 1:
        raise ConfigError(f"--runs {args.runs}: expected a whole number >= 1")
    if args.package and args.package not in PACKAGES and not args.repo:
        raise ConfigError(f"--package {args.package!r}: expected one of {', '.join(PACKAGES)} (any name with --repo)")
    host = run_plan.detect_host()
    matrix = load_matrix(args.matrix) if args.matrix else run_plan.default_matrix(host)
    cell = choose_cell(select(matrix.cells, args.cell), str(matrix.path), args.cell)
    test_ids, args.pytest_args = split_test_ids(args.pytest_args)
    if test_ids:  # test ids replace the suite, or pytest would run the whole suite beside them
        cell = dataclasses.replace(cell, suite=tuple(test_ids))
    if (why := run_plan.unfit_reason(cell, host)) is not None:
        from harness.errors import HostMismatchError

        raise HostMismatchError(f"{cell.id}: {why}; bisect runs on the cell's own machine shape")
    if args.repo and not args.package:
        raise ConfigError("--repo needs --package: the distribution name the checkout builds")
    if not args.repo:
        good, bad = parse_side(args.good, args.package, "--good"), parse_side(args.bad, args.package, "--bad")
    try:
        with interruptible(), harness_import_path() as import_path:
            return _bisect_with(args, cell, host, matrix, import_path, good if not args.repo else None,
                                bad if not args.repo else None)
    except Interrupted as interrupted:  # the probe's cell folder says so; its installer and pytest are gone
        print(f"harness: {interrupted}; bisect stopped", file=sys.stderr, flush=True)
        return 128 + interrupted.signum


def _bisect_with(args, cell, host, matrix, import_path, good, bad) -> int:
    from harness.bisect.probes import CellProber
    from harness.envs.build import env_root
    from harness.run import plan as run_plan

    prober = CellProber(
        cell=cell,
        host=host,
        results_root=run_plan.results_folder(args.results, matrix.root),
        env_dir=env_root(args.env_dir),
        pytest_args=list(args.pytest_args),
        project=matrix.root,
        matrix_reference=matrix.reference,
        import_path=import_path,
        runs=args.runs,
        log=_say,
    )
    return _bisect(args, cell, prober, good, bad)


def _bisect(args, cell, prober, good, bad) -> int:
    from harness.plan import versions

    clock = timed()
    shape = f"{cell.gpu}-{cell.gpus}{'rank' if cell.is_cpu else 'gpu'}"
    try:
        if args.repo:
            from harness.bisect.commits import bisect_commits

            result = bisect_commits(cell, prober, args.package, args.repo, args.good, args.bad, shape=shape)
        else:
            result = bisect_releases(
                cell,
                prober,
                good,
                bad,
                pre=args.pre,
                shape=shape,
                between=lambda p, a, b, pre: versions.releases_between(p, a, b, pre=pre),
            )
    except ConfigError as error:
        if args.json:  # the nightly reads why a bisect said nothing, e.g. its bad end passed again
            same = error.verdict.value if isinstance(error, SameVerdictError) else None
            failing = list(error.failing_at_good) if isinstance(error, SameVerdictError) else []
            write_json(args.json, BisectRecord(cell=cell.id, pytest_args=list(args.pytest_args), error=str(error),
                                               exit_code=error.return_code, same_verdict=same,
                                               failing_at_good=failing))
        raise
    seconds = clock()
    if set_aside := result.set_aside_line():
        _say(set_aside)
    _say(result.line())
    _say(result.summary(seconds))
    if args.json:
        write_json(args.json, result.record(seconds, cell=cell.id, pytest_args=args.pytest_args))
    return result.exit_code


def bisect_releases(
    cell,
    prober: Callable[..., Probe],
    good: Mapping[str, str],
    bad: Mapping[str, str],
    *,
    pre: bool,
    shape: str,
    between: Callable[[str, str, str, bool], list[str]],
    emit: Callable[[Probe], None] | None = None,
) -> BisectResult:
    """Which package (when both differ) and which release of it; the other package pinned as the cell or
    the swap says."""
    emit = emit or (lambda probe: _say(probe.line()))
    pinned = {package: getattr(cell, package) for package in PACKAGES}
    good, bad = {**pinned, **good}, {**pinned, **bad}
    differing = [package for package in PACKAGES if good[package] != bad[package]]
    if not differing:
        raise ConfigError(f"--good and --bad name the same versions ({_label(good, PACKAGES)})")
    for package in differing:  # bad input (an unknown version) before anything runs
        between(package, good[package], bad[package], pre)
    cache: dict[tuple, Probe] = {}

    def probe(versions: Mapping[str, str], shown: Sequence[str]) -> Probe:
        key = tuple(sorted(versions.items()))
        if key not in cache:
            cache[key] = prober(versions, _label(versions, shown))
            emit(cache[key])
        return cache[key]

    culprit_note = None
    package = differing[0]
    base = good
    if len(differing) == 2:
        _say(f"bisect on {shape}: torch and transformers both differ; swapping one package at a time")
        good_probe, bad_probe = probe(good, PACKAGES), probe(bad, PACKAGES)
        if good_probe.verdict is bad_probe.verdict and good_probe.verdict in (Verdict.PASS, Verdict.FAIL):
            raise SameVerdictError(good_probe, bad_probe)
        for moved in PACKAGES:  # the good cell with one package moved to the bad cell's version
            mixed = {**good, moved: bad[moved]}
            mixed_probe = probe(mixed, PACKAGES)
            if mixed_probe.verdict in (Verdict.PASS, Verdict.FAIL):
                break
        else:
            prior = tuple(p for p in cache.values())
            return BisectResult(
                package="torch or transformers",
                kind="regression",
                versions=(),
                probes=prior,
                stopped="neither one-package swap could be tested",
            )
        if mixed_probe.verdict is bad_probe.verdict:
            package, base = moved, good  # moving this package alone reproduces the bad verdict
        else:
            package = next(p for p in PACKAGES if p != moved)
            base = mixed  # the other package, with the moved one at its bad version
        culprit_note = (
            f"{_label(mixed, PACKAGES)} gives {mixed_probe.verdict.value}: "
            f"{package} {good[package]} -> {bad[package]} changes the verdict"
        )
        _say(f"  -> {package} is the upstream that changes it ({culprit_note})")
    range_ = between(package, good[package], bad[package], pre)
    budget = math.ceil(math.log2(len(range_))) + 2
    _say(
        f"bisect {package} over {len(range_)} releases {range_[0]}..{range_[-1]} on {shape} "
        f"({_label({k: v for k, v in base.items() if k != package}, PACKAGES)}): at most {budget} probes"
    )
    result = bisect(
        package,
        range_,
        good=good[package],
        bad=bad[package],
        probe=lambda version: probe({**base, package: version}, (package,)),
        narrow=getattr(prober, "narrow", None),
    )
    earlier = tuple(p for p in cache.values() if p not in result.probes)
    return dataclasses.replace(result, probes=earlier + result.probes, culprit_note=culprit_note)


def _label(versions: Mapping[str, str], shown: Sequence[str]) -> str:
    return " + ".join(f"{package} {versions[package]}" for package in shown if package in versions)


def _say(line: str) -> None:
    print(line, flush=True)
