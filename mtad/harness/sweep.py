"""``python -m mtad.harness.sweep --profile cpu|quick|paper`` (``make reproduce-table``): run a preset's grid,
then render ``<results_dir>/tables/<experiment>.md`` and ``.tex`` (:mod:`mtad.report.render`).

The grid is the preset's ``hydra.sweeper.params`` (the same grid ``python -m mtad -m experiment=<name>``
runs), expanded the way Hydra's basic sweeper does it (overrides given here replace a swept key), and run
in this process through Hydra's compose API, with a progress bar over the runs: the runs that differ only in
the decoder through :func:`mtad.harness.runner.run_interleaved` (prompt by prompt, paired timings; same rows
and hashes), the others through :func:`mtad.harness.runner.run` (``--no-interleave``: every run alone).
An interrupted sweep resumes: the runner skips every configuration whose hash already has a row, so a second
invocation only renders the tables. A run that fails is reported and the sweep goes on (the exit status is
1 when any run failed), unless the first three runs fail with one message (a missing draft or data set):
then every run would, and the sweep stops with that message (exit status 2).

Profiles: ``quick`` (tiny random pair, minutes; tests and CI: the ``quick`` grid and the reviewers' controls
``quick_controls``), ``cpu`` (the embedded SmolLM2 pair: the claims' comparisons, sampling / speculative / mtad
and the lossless rivals block verification and n-gram speculative decoding (VERIFIERS.md) on two tasks with
30 prompts each: 22 minutes for the ten runs with the bf16 pair on one core of the 2-core box, about an hour in
fp32), ``cpu_feature``, ``cpu_bf16``, ``cpu_bf16_feature``
(the same ``cpu_table`` cells on the pair with the feature draft, in bfloat16, or both: the preset's
``experiment/pair@pair`` choice, :data:`PROFILES`), ``cpu_full`` (every decoder on four tasks, 30
prompts: about four hours), ``paper`` (the paper's pairs; GPUs). ``--experiment tau|gamma|beam_width|
temperature`` runs an ablation or control preset instead, with the extra runs its table needs
(:data:`EXTRA_RUNS`). Before rendering, a cost profile of the pair on this machine
(:mod:`mtad.measure.costmodel`) is measured into ``<results_dir>/profiles/`` unless one exists
(``--no-cost-profile`` skips it), so the tables can show the predicted ms/token. Runs launched
elsewhere (``python -m mtad -m experiment=<name> hydra/launcher=slurm``) have the same config hashes, so
``--render-only`` tabulates them and a later invocation here only fills the gaps. Trailing ``key=value``
arguments are Hydra overrides for every run (``results_dir=...``, ``task.n_prompts=4``, ``name=...``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from mtad._util.paths import REPO_ROOT
from mtad.harness.clicheck import hydra_error_line
from mtad.harness.config import experiment_name, register_configs
from mtad.harness.profile import profile_command
from mtad.harness.runner import run, run_interleaved
from mtad.harness.store import existing_hashes, load_frame
from mtad.measure.costmodel import find_profiles
from mtad.report.render import write_tables

log = logging.getLogger("mtad.harness.sweep")

# A profile runs presets, each a preset name and the overrides that pick its variant: cpu_table's pair
# (conf/experiment/pair/<model>.yaml sets the model and the name of the rows and tables).
_PAIR = "experiment/pair@pair"
PROFILES = {"quick": (("quick",), ("quick_controls",)), "cpu": (("cpu_table",),),
            "cpu_feature": (("cpu_table", f"{_PAIR}=smollm2_feature"),),
            "cpu_bf16": (("cpu_table", f"{_PAIR}=smollm2_bf16"),),
            "cpu_bf16_feature": (("cpu_table", f"{_PAIR}=smollm2_bf16_feature"),),
            "cpu_full": (("cpu_full",),),
            "cpu_qa": (("cpu_qa",), ("cpu_qa_nq",)), "paper": (("paper_table",),)}
# Extra runs a preset's table needs but its grid cannot express (a Hydra grid is a Cartesian product), each
# a list of overrides (sweeps allowed): the speed-up baseline of the ablations that sweep only MTAD settings,
# and the reviewers' controls beside the temperature sweep (MTAD at several tau, speculative with a fixed
# per-token threshold at the same tau, sampling at several top-p, the lossless speculative baseline).
_TAUS = "0.1,0.3,0.5,0.7,0.9"
EXTRA_RUNS = {
    "tau": [["decoder=speculative"]],
    "beam_width": [["decoder=speculative"]],
    "temperature": [["decoder=sampling", "decoder.top_p=0.7,1.0"], ["decoder=mtad", f"decoder.tau={_TAUS}"],
                    ["decoder=speculative_threshold", f"decoder.tau={_TAUS}"], ["decoder=speculative"]],
    "quick_controls": [["decoder=sampling", "decoder.top_p=0.7,1.0"], ["decoder=mtad", "decoder.tau=0.1,0.5,0.9"],
                       ["decoder=speculative_threshold", "decoder.tau=0.1,0.5,0.9"], ["decoder=speculative"]],
    # greedy; the temperature frontier on capitals: sampling cooler, MTAD at a lower and a higher tau
    "cpu_qa": [["decoder=greedy"], ["decoder=sampling", "decoder.temperature=0.3,0.6", "task=capitals"],
               ["decoder=mtad", "decoder.tau=0.1,0.8", "task=capitals"]],
    "cpu_qa_nq": [["decoder=greedy"]],
}


@dataclass
class Summary:
    experiment: str
    results_file: Path
    ran: int = 0
    skipped: int = 0
    failed: list = field(default_factory=list)  # (overrides, message)
    tables: tuple = ()


def conf_dir() -> Path:
    return REPO_ROOT / "conf"


def grid(experiment: str, overrides: Sequence[str] = ()) -> list[list[str]]:
    """Every run of the preset as a list of overrides (``experiment=<name>`` first), baselines last."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    register_configs()
    _check_preset(experiment)
    parser = OverridesParser.create()
    user = [o for o in overrides if not _is_experiment(o)]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}", *_single(parser, user)],
                      return_hydra_config=True)
    params = dict(cfg.hydra.sweeper.params or {})
    swept = [f"{k}={v}" for k, v in params.items()]
    jobs = _product(parser, swept + user)
    # Baselines keep every setting but the swept decoder ones (e.g. decoder.tau) and the decoder itself.
    drop = {k for k in params if k.lstrip("+~").startswith("decoder")}
    for extra in EXTRA_RUNS.get(experiment, []):
        drop_all = drop | {_key(parser, e) for e in extra}
        kept = [o for o in swept + user if _key(parser, o) not in drop_all]
        jobs += _product(parser, kept + extra)
    seen, unique = set(), []
    for job in jobs:
        job = [f"experiment={experiment}", *job]
        if tuple(job) not in seen:
            seen.add(tuple(job))
            unique.append(job)
    return unique


def _product(parser, overrides: Sequence[str]) -> list[list[str]]:
    """The Cartesian product of the sweep overrides, later keys replacing earlier ones (Hydra's basic sweeper)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    if not overrides:
        return [[]]
    return BasicSweeper.split_arguments(parser.parse_overrides(list(overrides)), None)[0]


def _key(parser, override: str) -> str:
    return parser.parse_override(override).get_key_element()


def _single(parser, overrides: Sequence[str]) -> list[str]:
    """The first value of every sweep override (enough to compose the preset and read its settings)."""
    return _product(parser, overrides)[0] if overrides else []


def _is_experiment(override: str) -> bool:
    """``experiment=X`` selects the preset; this module sets it itself."""
    return override.split("=", 1)[0].lstrip("+~") == "experiment"


def _check_preset(experiment: str) -> None:
    path = conf_dir() / "experiment" / f"{experiment}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml"))
        raise ValueError(f"no experiment preset {experiment!r}: choose one of {names} (conf/experiment/)")


def compose_job(job: Sequence[str]):
    """The composed config of one job's overrides; a misspelt group option or key is a one-line ValueError."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return compose("config", overrides=list(job))
    except (HydraException, OmegaConfBaseException) as err:
        raise ValueError(hydra_error_line(err)) from None


def reproduce(experiment: str, overrides: Sequence[str] = (), tables_dir: str | Path | None = None,
              run_grid: bool = True, progress: bool = True, cost_profile: bool = True,
              profile_reps: int = 10, interleave: bool = True) -> Summary:
    """Run the preset's grid (resuming), measure the pair's cost profile if this machine has none
    (``cost_profile``), then write the tables. Returns what happened. With ``interleave`` the runs that differ
    only in the decoder (one pair, one task) decode prompt by prompt in rotating order on one loaded pair
    (:func:`mtad.harness.runner.run_interleaved`): drift of the machine falls on every decoder alike, so the
    table's speed ratios are paired; the rows and their hashes are those of separate runs."""
    jobs = grid(experiment, overrides)
    composed: dict[tuple, object] = {}

    def compose(job: Sequence[str]):  # each job composed once (Hydra takes ~0.3 s a config), grouped and run
        if tuple(job) not in composed:
            composed[tuple(job)] = compose_job(job)
        return composed[tuple(job)]

    first = compose(jobs[0])
    name = experiment_name(first)  # `name=X` among the overrides renames the results file and the tables
    results_file = Path(first.results_dir) / f"{name}.jsonl"
    summary = Summary(experiment=name, results_file=results_file)
    if run_grid:
        bar = _bar(len(jobs), summary.experiment, progress)
        for group in (interleave_groups(jobs, compose) if interleave else [[job] for job in jobs]):
            bar.set_postfix_str(" | ".join(_label(job, overrides) for job in group), refresh=True)
            check_disk(results_file.parent, summary)
            _run_group(group, summary, results_file, compose)
            bar.update(len(group))
            _stop_if_hopeless(summary)
        bar.close()
    if not results_file.exists():
        raise FileNotFoundError(f"{results_file} holds no rows: every run failed ({len(summary.failed)}); "
                                "see the errors above")

    frame = load_frame(results_file)
    if cost_profile and run_grid:
        ensure_cost_profile(jobs[0], frame, Path(first.results_dir) / "profiles", profile_reps)
    out = Path(tables_dir) if tables_dir is not None else Path(first.results_dir) / "tables"
    summary.tables = write_tables(frame, out, summary.experiment, search=[results_file.parent])
    return summary


def ensure_cost_profile(job: Sequence[str], frame, out_dir: Path, reps: int = 10) -> Path | None:
    """Measure the cost profile of the job's pair on this machine into ``out_dir`` unless a profile there
    (or under the repository's results/profiles) already matches a row with forward counts."""
    if not any(c.startswith("metrics.forward_calls.") for c in frame.columns):
        return None  # rows from before forward counts were recorded: nothing to predict
    profiles = find_profiles([out_dir, REPO_ROOT / "results" / "profiles"])
    rows = frame[[c for c in ("device_name", "model.name", "num_threads") if c in frame.columns]].drop_duplicates()
    if all(any(p.matches(r.get("device_name"), r.get("model.name"), r.get("num_threads")) for p in profiles)
           for _, r in rows.iterrows()):
        return None
    log.info("measuring the cost profile of this machine and pair (python -m mtad.harness.profile profile ...)")
    return profile_command([o for o in job], out_dir, reps)


ABORT_AFTER = 3  # identical failures, with nothing done yet, that stop the sweep
MIN_FREE_MB = 200  # free disk space a sweep job needs for its records (MTAD_MIN_FREE_MB overrides)


def free_mb(path: Path) -> float:
    """Free space (MiB) on the file system that holds ``path`` (or its nearest existing parent)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free / 2**20


def check_disk(results_dir: Path, summary: Summary) -> None:
    """Before each job: a ValueError (one line, the sweep stops; rows already written stay and a rerun
    resumes) when the disk of ``results_dir`` has less than ``MTAD_MIN_FREE_MB`` (default 200) MiB free."""
    need = float(os.environ.get("MTAD_MIN_FREE_MB", MIN_FREE_MB))
    free = free_mb(results_dir)
    if free < need:
        raise ValueError(f"only {free:.0f} MiB free on the disk of {results_dir} (a run needs {need:.0f}; "
                         f"MTAD_MIN_FREE_MB sets it): free some space and rerun; the {summary.ran} runs done "
                         f"this time are kept and the rerun skips them")


def _stop_if_hopeless(summary: Summary) -> None:
    """Stop when the first runs all failed the same way (a missing draft, missing data): every other run
    would fail too. Nothing is lost; the next invocation resumes."""
    msgs = {msg for _, msg in summary.failed}
    if summary.ran == 0 and summary.skipped == 0 and len(summary.failed) >= ABORT_AFTER and len(msgs) == 1:
        raise ValueError(f"the first {len(summary.failed)} runs all failed with {msgs.pop()}; "
                         "fix that and rerun (runs already recorded are kept and skipped)")


def interleave_groups(jobs: Sequence[Sequence[str]], compose=compose_job) -> list[list[Sequence[str]]]:
    """The jobs grouped by their resolved config without the decoder (one pair, one task and prompt set, one
    seed), in grid order: each group can be decoded interleaved. ``compose``: a job's composed config."""
    groups: dict[str, list] = {}
    for job in jobs:
        plain = OmegaConf.to_container(compose(job), resolve=True)
        plain.pop("decoder", None)
        plain.pop("hydra", None)
        groups.setdefault(json.dumps(plain, sort_keys=True, default=str), []).append(job)
    return list(groups.values())


def _run_group(group: Sequence[Sequence[str]], summary: Summary, results_file: Path, compose=compose_job) -> None:
    """Run one group interleaved (a single job alone); when the group fails, each job runs alone, so a bad
    config is reported as its own failure and the others still get their rows."""
    if len(group) == 1:
        return _run_one(run, group[0], summary, compose)
    before = len(existing_hashes(results_file))
    try:
        run_interleaved([compose(job) for job in group])
    except (ValueError, FileNotFoundError, OSError, RuntimeError, ImportError) as err:
        log.warning("interleaved runs of %d configs failed (%s: %s); running each alone",
                    len(group), type(err).__name__, err)
        for job in group:
            _run_one(run, job, summary, compose)
            _stop_if_hopeless(summary)
        return
    ran = len(existing_hashes(results_file)) - before
    summary.ran += ran
    summary.skipped += len(group) - ran


def _run_one(run, job: Sequence[str], summary: Summary, compose=compose_job) -> None:
    try:
        row = run(compose(job))
    except (ValueError, FileNotFoundError, OSError, RuntimeError, ImportError) as err:
        log.error("run %s failed: %s: %s", " ".join(job), type(err).__name__, err)
        summary.failed.append((list(job), f"{type(err).__name__}: {err}"))
        return
    if row is None:
        summary.skipped += 1
    else:
        summary.ran += 1


def _label(job: Sequence[str], common: Sequence[str] = ()) -> str:
    """The overrides that tell this run from the others of the grid."""
    return " ".join(o for o in job if not _is_experiment(o) and o not in common)


class _NoBar:
    def set_postfix_str(self, *a, **k) -> None:
        pass

    def update(self, *a) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int, name: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=name, unit="run", file=sys.stderr, dynamic_ncols=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mtad.harness.sweep", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", choices=sorted(PROFILES), default="cpu",
                   help="quick: tiny pair, minutes; cpu: embedded SmolLM2 pair, ~1 h on 2 cores; cpu_feature: the "
                        "same with the feature draft; cpu_bf16: the same in bfloat16; cpu_bf16_feature: bf16 with "
                        "the feature draft; cpu_full: ~4 h; paper: GPUs")
    p.add_argument("--experiment", default=None,
                   help="run this conf/experiment preset instead of the profile's (e.g. tau, gamma, beam_width)")
    p.add_argument("--tables-dir", default=None, help="where the .md/.tex go (default: <results_dir>/tables)")
    p.add_argument("--render-only", action="store_true", help="do not run anything; render the existing rows")
    p.add_argument("--list", action="store_true", help="print the runs of the grid and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-interleave", action="store_true",
                   help="run the grid's runs one after another (default: the runs of one pair and task that "
                        "differ only in the decoder decode prompt by prompt in rotating order)")
    p.add_argument("--no-cost-profile", action="store_true",
                   help="do not measure a cost profile when this machine has none (no predicted ms/token)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. results_dir=out task.n_prompts=4")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # the energy source is in every row; logging it once per prompt is noise
    logging.getLogger("mtad.measure.energy").setLevel(logging.WARNING)
    presets = ((args.experiment,),) if args.experiment else PROFILES[args.profile]
    runs = [(experiment, [*variant, *args.overrides]) for experiment, *variant in presets]
    done = []
    try:
        if args.list:
            for experiment, overrides in runs:
                for job in grid(experiment, overrides):
                    print(" ".join(job))
            return 0
        from tqdm.contrib.logging import logging_redirect_tqdm

        with logging_redirect_tqdm():
            for experiment, overrides in runs:
                done.append(reproduce(experiment, overrides, args.tables_dir, run_grid=not args.render_only,
                                      progress=not args.no_progress, cost_profile=not args.no_cost_profile,
                                      interleave=not args.no_interleave))
    except (ValueError, OSError) as err:  # OSError: a results folder that cannot be written, a full disk
        print(f"mtad.harness.sweep: error: {err}", file=sys.stderr)
        return 2
    for s in done:
        print(f"{s.experiment}: {s.ran} runs done, {s.skipped} already had a row, {len(s.failed)} failed; "
              f"rows in {s.results_file}; tables {' and '.join(str(t) for t in s.tables)}")
        for job, msg in s.failed:
            print(f"  failed: {' '.join(job)}: {msg}", file=sys.stderr)
    return 1 if any(s.failed for s in done) else 0


if __name__ == "__main__":
    sys.exit(main())
