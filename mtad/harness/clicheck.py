"""Checks the command-line entry points run before any work, each failing with one line (a ``ValueError``)
that names the problem and the fix: config groups and keys that do not exist, output paths that cannot be
written, SIGTERM (``scancel``) taken like Ctrl-C.

- :func:`check_overrides`: every ``group=option`` names a file of ``conf/<group>/`` (every value of a
  comma sweep), and the config composes with the first value of each sweep (unknown keys, bad types).
- :func:`hydra_error_line`: a Hydra composition error as one line.
- :func:`mtad._util.io.writable_dir` / :func:`mtad._util.io.writable_file` (re-exported here): an output path
  of a long job is usable before the job starts (the missing parent folders are created; nothing is touched).
- :func:`terminate_like_interrupt`: SIGTERM raises :class:`Terminated`, a ``KeyboardInterrupt``, so the
  paths that clean up after Ctrl-C (the sandbox stopped, a partial run directory dropped, no half row) run.
- :mod:`mtad._util.cli` (re-exported here): the one-line :class:`ArgumentParser` and the argument types every
  command line shares (counts, finite numbers in a range, input files of a format, folders), so that a bad
  value is refused while the command line is parsed, before any model loads: one
  ``<program>: error: argument --x: ...`` line, exit status 2.
"""
from __future__ import annotations

import signal
from collections.abc import Sequence

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import OmegaConfBaseException

from mtad._util.cli import (  # noqa: F401 - the entry points' argument types
    ArgumentParser,
    check_or_exit,
    comma_list,
    count,
    existing_file,
    folder_with,
    json_file,
    nonnegative_int,
    pickle_file,
    positive_int,
    real,
    rows_file,
)
from mtad._util.io import writable_dir, writable_file  # noqa: F401 - the entry points' output checks
from mtad._util.paths import REPO_ROOT
from mtad.harness.config import experiment_name, register_configs

CONF = REPO_ROOT / "conf"
# flags of Hydra's command line after which the overrides cannot be checked against conf/ (another config)
OTHER_CONFIG = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``scancel``, ``kill``), handled where Ctrl-C is."""


def terminate_like_interrupt() -> None:
    """From now on SIGTERM raises :class:`Terminated` in the main thread (no-op outside it)."""
    def handler(signum, frame):  # noqa: ARG001 - signal's signature
        raise Terminated()

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


def options(group: str) -> list[str]:
    folder = CONF / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def hydra_error_line(err: BaseException) -> str:
    """One line for a Hydra/OmegaConf composition error: an unknown option of a group names the group's
    options; otherwise the first line of each message down the cause chain."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and "/" in err.missing_cfg_file:
        group, name = err.missing_cfg_file.rsplit("/", 1)
        if options(group):
            return (f"unknown {group} {name!r} ({group}={name}): conf/{group}/ has "
                    f"{', '.join(options(group))}")
    parts, seen = [], err
    while seen is not None and len(parts) < 3:
        text = " ".join(str(seen).split("\n")[0].split()).rstrip(".")
        if text and text not in parts and "$VALUE" not in text:
            parts.append(text)
        seen = seen.__cause__ or seen.__context__
    line = ": ".join(parts) or type(err).__name__
    if "Could not override" in line or "not in struct" in line:
        line += " (check the key's spelling: python -m mtad --cfg job lists every key)"
    return line


def _parsed(overrides: Sequence[str]):
    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as err:
        raise ValueError(hydra_error_line(err)) from None


def _values(o) -> list[str]:
    if o.is_sweep_override():
        try:
            return [str(v) for v in o.sweep_string_iterator()]
        except Exception:  # noqa: BLE001 - an interval sweep (a sweeper's): nothing to enumerate
            return []
    return [o.get_value_element_as_str()] if not o.is_delete() else []


def check_overrides(overrides: Sequence[str], compose: bool = True) -> None:
    """ValueError (one line) when an override names a group option or a key that does not exist.

    ``group=a,b`` checks ``a`` and ``b``; then the config is composed once with the first value of every
    sweep (``hydra.*`` overrides are Hydra's: left to it)."""
    parsed = _parsed(overrides)
    first = []
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra"):
            continue
        values = _values(o)
        if options(key):
            for value in values:
                if value not in ("null", "None") and value not in options(key):
                    raise ValueError(f"unknown {key} {value!r} ({key}={value}): conf/{key}/ has "
                                     f"{', '.join(options(key))}")
        if o.is_sweep_override():
            if not values:
                continue
            prefix = {"ADD": "+", "FORCE_ADD": "++"}.get(o.type.name, "")
            pkg = f"@{o.package}" if o.package else ""
            first.append(f"{prefix}{key}{pkg}={values[0]}")
        else:
            first.append(o.input_line)
    if compose:
        _compose(first)


def _compose(overrides: list[str]) -> None:
    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ValueError(hydra_error_line(err)) from None
    experiment_name(cfg)  # the results file's name: a plain, not over-long file name


def cli_overrides(argv: Sequence[str]) -> list[str] | None:
    """The ``key=value`` overrides of a ``python -m mtad`` command line; None when it names another config."""
    if any(a.split("=")[0] in OTHER_CONFIG for a in argv):
        return None
    return [a for a in argv if "=" in a and not a.startswith("-")]

