"""The summary of ``make gpu-check``: the rows of its sweep, a table, and whether every decoder x task has one.

Rows are selected by the device and by the pair the sweep's ``model=`` resolved to: ``model=smollm2`` stands
for the best embedded pair of the machine (``smollm2_feature``, ``smollm2_bf16_feature``), and a row carries
that resolved name (:func:`mtad.models.load.resolve_alias`).

    python experiments/gpu_check_rows.py ROWS.jsonl cpu|cuda greedy,mtad gsm8k,mt_bench smollm2
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # this checkout's mtad, whatever the interpreter has installed


def resolved_name(model: str, device: str) -> str:
    """The name a row of ``model=<model> model.device=<device>`` carries."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from mtad.harness.config import register_configs
    from mtad.models.load import ModelConfig, resolve_alias

    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={model}", f"model.device={device}"])
    return resolve_alias(ModelConfig.from_any(OmegaConf.to_container(cfg.model, resolve=True)))[0].name


def select(rows: list[dict], device: str, name: str) -> list[dict]:
    return [r for r in rows if str(r["model"].get("device", "")).startswith(device) and r["model"]["name"] == name]


def table(rows: list[dict]) -> str:
    lines = [f"{'decoder':<12} {'task':<9} {'n':>3} {'ms/token':>9} {'tok/s':>7} {'BE':>5} {'acc':>5} {'J/token':>9}"
             f"  energy"]
    for r in sorted(rows, key=lambda r: (r["task"]["name"], r["decoder"]["name"])):
        m = r["metrics"]
        acc, jpt = m.get("acceptance_rate"), m.get("energy_j_per_token")
        lines.append(f"{r['decoder']['name']:<12} {r['task']['name']:<9} {r['n_prompts']:>3} "
                     f"{m['ms_per_token']:>9.2f} {m['tokens_per_s']:>7.1f} {m['block_efficiency']:>5.2f} "
                     f"{(f'{acc:.2f}' if acc is not None else '-'):>5} {(f'{jpt:.4f}' if jpt is not None else '-'):>9}"
                     f"  {m.get('energy_source')}  ({r.get('device_name')})")
    return "\n".join(lines)


def problems(rows: list[dict], device: str, decoders: list[str], tasks: list[str]) -> list[str]:
    want = {(d, t) for d in decoders for t in tasks}
    have = {(r["decoder"]["name"], r["task"]["name"]) for r in rows}
    out = [f"missing rows for {sorted(want - have)}"] if want - have else []
    if device == "cuda":
        no_nvml = sorted(r["decoder"]["name"] for r in rows if r["metrics"].get("energy_source") != "nvml")
        out += [f"rows without an NVML energy reading: {no_nvml}"] if no_nvml else []
    return out


def parse_args(argv: list[str]):
    from mtad.harness import clicheck

    ap = clicheck.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows", help="the sweep's results file (a missing file: every row is missing)")
    ap.add_argument("device", choices=("cpu", "cuda"))
    ap.add_argument("decoders", type=clicheck.comma_list(clicheck.options("decoder")), help="decoder,decoder,...")
    ap.add_argument("tasks", type=clicheck.comma_list(clicheck.options("task")), help="task,task,...")
    ap.add_argument("model", choices=clicheck.options("model"), metavar="model", help="the sweep's model=")
    args = ap.parse_args(argv)
    if Path(args.rows).is_dir():
        ap.error(f"{args.rows} is a folder: give the sweep's results file")
    return args


def main(argv: list[str]) -> int:
    from mtad.harness.store import load_results

    args = parse_args(argv)
    path, device, decoders, tasks, model = args.rows, args.device, args.decoders, args.tasks, args.model
    name = resolved_name(model, device)
    rows = select(load_results(path) if Path(path).exists() else [], device, name)
    print(table(rows))
    if name != model:
        print(f"model={model} ran as {name}")
    if model == "tiny":
        print("NOTE: these rows are model=tiny, not the embedded pair")
    found = problems(rows, device, decoders, tasks)
    if found:
        print(f"gpu-check: {'; '.join(found)} (rows of {name} on {device} in {path})", file=sys.stderr)
        return 1
    print(f"gpu-check: {len(rows)} {device} rows of {name} for every decoder x task in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
