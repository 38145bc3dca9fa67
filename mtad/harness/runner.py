"""The one runner for every decoder (STYLE.md; Spec-Bench's shared driver).

``run(cfg)``: validate everything, check that the results file and the run directory can be written,
read the task data (its content goes into the config hash), skip if this config already has a row, load
the models once, decode ``warmup`` prompts untimed, then for each prompt decode (timed, energy window
around it), then score (untimed: perplexity under the raw target, task score). Finally write
``samples.jsonl`` into the run directory and append one row to ``${results_dir}/${experiment}.jsonl`` —
atomically, so an interrupted run leaves no partial row, and only if no row of the same config was
appended meanwhile (checked again under the lock). If the append fails, the row goes to ``row.json`` in
the run directory (:func:`save_row`). Prompts that do not fit (task ``max_prompt_tokens`` or the model's
context) are skipped with the reason recorded (``task.on_long_prompt=error`` makes them fail instead).
The phases are the methods of :class:`Job`; ``run_interleaved(cfgs)`` runs several decoders' jobs on one
loaded pair prompt by prompt (the main job, :mod:`mtad.harness.compare`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import sys
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from mtad.decoding import DecoderConfig, PromptTooLong, generate
from mtad.decoding.core import check, check_keys, context_limit
from mtad.decoding.propose import PROPOSERS
from mtad.harness.config import check_run, experiment_name
from mtad.harness.progress import PromptBar
from mtad.harness.rows import ResultRow, config_hash, machine_load, timing_info, to_json_line
from mtad.harness.rundir import check_results_file, check_writable
from mtad.harness.store import append_row, existing_hashes, load_results, write_jsonl_atomic
from mtad.harness.tracking import TrackingConfig, make_tracker
from mtad.measure.energy import EnergyMeter, combine_readings
from mtad.measure.metrics import diversity, perplexity, run_metrics, sequence_logprobs
from mtad.models.load import ModelConfig, load_pair, resolve_alias, resolve_local
from mtad.tasks.base import Prompt, TaskConfig, get_task

log = logging.getLogger(__name__)


def run(cfg: DictConfig | dict, run_dir: str | Path | None = None) -> dict | None:
    """Run one experiment; returns the result row (dict), or None when it already exists."""
    job = Job.prepare(cfg, run_dir)
    if job is None:
        return None
    job.start(load_pair(job.mcfg))
    for group in job.groups():
        job.decode(group)
    return job.finish()


def run_interleaved(cfgs: list[DictConfig | dict], on_prompt=None) -> list[dict | None]:
    """Run several configs of one pair and task on one loaded pair, prompt by prompt: prompt i is decoded by
    every config in turn, the order rotated by one each prompt, so that slow drift of the machine (thermal,
    other load) falls on every config alike and timing ratios are paired. Each config still gets its own
    row, run directory and resume check; ``on_prompt(i, n)`` is called after each prompt. Returns the rows
    in ``cfgs`` order; a config that already had a row is not decoded again and its stored row is returned."""
    jobs = [Job.prepare(c, keep_done=True) for c in cfgs]
    live = [j for j in jobs if not j.done]
    if not live:
        return [j.stored_row() for j in jobs]
    first = live[0]
    # A draft-free proposer (decoder.proposer=ngram) runs on the same target with the draft left out
    # (Job.prepare drops it from its model config): it gets the loaded pair without its draft.
    drafted = next((j for j in live if not j.draft_free), first)
    for j in live:
        same = (j.mcfg == drafted.mcfg if not j.draft_free
                else _target_only(j.mcfg) == _target_only(drafted.mcfg))
        if not same or [s.id for s in j.samples] != [s.id for s in first.samples]:
            raise ValueError("run_interleaved needs one pair and one prompt set: the configs differ in "
                             "model or task (compare decoders only)")
    pair = load_pair(drafted.mcfg)
    for j in live:
        j.start(pair.without_draft() if j.draft_free else pair)
        j.interleaved = len(live) > 1
    if len({j.tcfg.batch_size for j in live}) > 1:
        raise ValueError("run_interleaved needs one task.batch_size for every config")
    groups = [j.groups() for j in live]
    n, done = len(first.samples), 0
    for i in range(len(groups[0])):  # a group is task.batch_size prompts decoded together (1 by default)
        for k in range(len(live)):
            m = (i + k) % len(live)
            live[m].decode(groups[m][i])
        done += len(groups[0][i])
        if on_prompt is not None:
            on_prompt(done, n)
    return [j.stored_row() if j.done else j.finish() for j in jobs]


def _target_only(mcfg: ModelConfig) -> ModelConfig:
    return replace(mcfg, draft=None, draft_head="full")


class Job:
    interleaved = False  # decoded prompt by prompt with other configs (run_interleaved): timings are paired
    """One config's run between :meth:`prepare` (checks, data, resume) and :meth:`finish` (row, samples)."""

    def __init__(self, resolved: dict, dec: DecoderConfig, mcfg: ModelConfig, tcfg: TaskConfig, task, samples,
                 results_file: Path, run_dir: Path, track: TrackingConfig, key: str = "", done: bool = False):
        self.key, self.done = key, done  # done: the results file already holds this config's row
        self.resolved, self.dec, self.mcfg, self.tcfg, self.task = resolved, dec, mcfg, tcfg, task
        self.samples, self.results_file, self.run_dir, self.track = samples, results_file, run_dir, track
        self.rows, self.decodes, self.logps, self.scores, self.readings = [], [], [], [], []
        self.skips: Counter = Counter()
        self.batch_s: list[float] = []

    @property
    def draft_free(self) -> bool:
        """The proposer drafts without a model (prompt lookup): the pair's draft is neither loaded nor hashed."""
        return not PROPOSERS[self.dec.proposer].model

    @classmethod
    def prepare(cls, cfg: DictConfig | dict, run_dir: str | Path | None = None,
                keep_done: bool = False) -> "Job | None":
        """Validate everything, check that the outputs can be written and read the data, before any model
        is loaded. When the results file already holds this config's row (and not ``force``): None, or with
        ``keep_done`` a Job marked ``done`` whose :meth:`stored_row` reads that row."""
        resolved = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True)
        check_run(resolved)  # name, seed, warmup, num_threads (the groups: their frozen classes, next)
        dec = DecoderConfig.from_any(resolved["decoder"])
        check_keys(dec)  # a key this decoder does not read would be recorded and hashed as if it had run
        mcfg = ModelConfig(**resolved["model"]) if not isinstance(resolved["model"], ModelConfig) else resolved["model"]
        mcfg, why = resolve_alias(mcfg)  # model=smollm2: the best embedded pair for this machine
        if why:
            log.info("%s", why)
            resolved = {**resolved, "model": asdict(mcfg)}  # hashed and recorded as the pair it stands for
        if not PROPOSERS[dec.proposer].model:  # a draft-free proposer: the draft is neither loaded nor fingerprinted
            mcfg = replace(mcfg, draft=None, draft_head="full")
        tcfg = TaskConfig.from_any(resolved["task"])
        track = TrackingConfig.from_any(resolved.get("tracking"))
        results_file = Path(resolved.get("results_dir", "results")) / f"{experiment_name(resolved)}.jsonl"
        check_results_file(results_file)  # unwritable output fails here, before any work (mtad.harness.rundir)
        task = get_task(tcfg)
        samples = task.samples()  # bad data fails here, before any model is loaded
        # a retrained local draft or an edited data file is a new config; task.source=auto is recorded and hashed
        # as the route it took (local | hub), so rows from before `auto` existed (source: local) stay done
        task_dict = resolved["task"] if isinstance(resolved["task"], dict) else tcfg.to_dict()
        resolved = {**resolved, "task": {**task_dict, "source": task.resolved_source()},
                    "weights": weights_fingerprint(mcfg), "data": task.data_fingerprint()}
        key = config_hash(resolved)
        done = not resolved.get("force") and key in existing_hashes(results_file)
        if done:
            log.info("skipping: %s already holds a row for config %s (force=true reruns it)", results_file, key[:12])
            if not keep_done:
                return None
        run_dir = Path(run_dir or _hydra_run_dir() or results_file.parent / "runs" / key[:12])
        if not done:
            check_writable(run_dir, "run directory", "hydra.run.dir (or run_dir)")
        return cls(resolved, dec, mcfg, tcfg, task, samples, results_file, run_dir, track, key, done)

    def stored_row(self) -> dict:
        """The latest row of this config in the results file."""
        for row in reversed(load_results(self.results_file)):
            if row.get("config_hash") == self.key:
                return row
        raise FileNotFoundError(f"{self.results_file} holds no row for config {self.key[:12]}")

    def start(self, pair) -> None:
        """Take the loaded pair, open the run directory and tracker, decode the warm-up prompts."""
        if self.resolved.get("num_threads"):
            torch.set_num_threads(int(self.resolved["num_threads"]))
        self.pair = pair
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tracker = make_tracker(self.track, self.run_dir)
        self.tracker.start(self.resolved, name=f"{self.dec.name}-{self.tcfg.name}-{self.mcfg.name}")
        self.rng = torch.Generator(device=pair.device).manual_seed(int(self.resolved.get("seed", 0)))
        self.load_start = machine_load()
        self.warmup(self.samples[: int(self.resolved.get("warmup", 0))])
        self.meter = EnergyMeter(_gpu_indices(pair))
        self.bar = PromptBar(len(self.samples), f"{self.dec.name} {self.tcfg.name}",
                             bool(self.resolved.get("progress", True)))

    def groups(self) -> list[list]:
        """The samples in groups of ``task.batch_size``, decoded together."""
        size = self.tcfg.batch_size
        return [self.samples[i:i + size] for i in range(0, len(self.samples), size)]

    def decode(self, group: list) -> None:
        """Every turn of a group of samples, decoded together (one timed energy window per batch), then
        each one's scores."""
        history: dict[str, list[str]] = {s.id: [] for s in group}
        live = list(group)
        want_ppl = bool(self.resolved.get("perplexity", True))
        for turn in range(max(_turns(self.task, s) for s in group)):
            todo = [s for s in live if turn < _turns(self.task, s)]
            for sample, row in zip(todo, self.batch(todo, turn, history, want_ppl)):
                self.rows.append(row)
                if row.get("skip_reason"):
                    self.skips[row.get("skip_kind") or row["skip_reason"]] += 1
                    live.remove(sample)
                    continue
                history[sample.id].append(row["completion"])
                self.decodes.append(row.pop("_result"))
                if row.get("_energy") is not None:
                    self.readings.append(row.pop("_energy"))
                row.pop("_energy", None)
                if row.get("_logp") is not None:
                    self.logps.append(row.pop("_logp"))
                row.pop("_logp", None)
                if row["scores"]:
                    self.scores.append(row["scores"])
        for _ in group:
            self.bar.step(self.decodes)

    def finish(self) -> dict | None:
        """Build the row, write samples.jsonl and append the row; None when a concurrent run appended it."""
        self.bar.close()
        resolved, run_dir, results_file = self.resolved, self.run_dir, self.results_file
        row = dataclasses.replace(self.row(), timing=timing_info(self.load_start, self.interleaved))
        samples_error = _save_samples(run_dir, self.rows) if resolved.get("save_samples", True) else None
        if not save_row(results_file, row, run_dir, unless_done=not resolved.get("force")):
            self.tracker.finish(row.to_dict(), result_file=None)
            return None
        with contextlib.suppress(OSError):
            OmegaConf.save(OmegaConf.create(resolved), run_dir / "resolved_config.yaml")
        self.tracker.log_samples(self.rows)
        self.tracker.finish(row.to_dict(), result_file=results_file)
        log.info("wrote a row to %s: %s", results_file, _summary(row.metrics))
        if samples_error is not None:
            raise ResultsNotAppended(f"the row was appended to {results_file}, but {run_dir / 'samples.jsonl'} "
                                     f"could not be written ({samples_error}): the per-prompt samples are lost")
        return row.to_dict()


    def warmup(self, samples) -> None:
        """Untimed decodes so that kernels, allocators and caches are warm (in batches of ``task.batch_size``);
        nothing is recorded."""
        task, pair = self.task, self.pair
        prompts = [p.ids for p in (_encode(task, s, pair.tokenizer, 0, (), self.mcfg.chat_template) for s in samples)
                   if p.ids]
        size = task.cfg.batch_size
        for start in range(0, len(prompts), size):
            group = prompts[start:start + size]
            try:
                generate(pair, group, self.dec, torch.Generator(device=self.rng.device).manual_seed(12345))
            except PromptTooLong:
                pass

    def batch(self, samples, turn, history, want_ppl) -> list[dict]:
        """Encode ``samples`` at ``turn``, decode the prompts that fit together (one timed energy window), score
        each. One record per sample, in order. With ``task.batch_size`` > 1 a record also names its batch, the
        batch's size and wall time (``time_s`` is the record's equal share of it) and ``batch_s`` gets the
        batch's wall time."""
        task, pair, dec = self.task, self.pair, self.dec
        records, todo = [], []
        for sample in samples:
            prompt = _encode(task, sample, pair.tokenizer, turn, history[sample.id], self.mcfg.chat_template)
            base = {"id": sample.id, "turn": turn, "meta": sample.meta, "prompt": prompt.text,
                    "prompt_tokens": len(prompt.ids), "prompt_truncated": prompt.truncated}
            if prompt.skip_reason:
                base.update(prompt_tokens=prompt.n_tokens, skip_reason=prompt.skip_reason, skip_kind=prompt.skip_kind)
            else:
                try:
                    check(pair, prompt.ids, dec)
                    todo.append((len(records), sample, prompt))
                except PromptTooLong as err:
                    if task.cfg.on_long_prompt == "error":
                        raise
                    base.update(skip_reason=f"prompt does not fit the model context: {err}", skip_kind=CONTEXT_SKIP)
            records.append(base)
        if not todo:
            return records
        batched = task.cfg.batch_size > 1
        self.meter.start()
        results = generate(pair, [p.ids for _, _, p in todo], dec, self.rng)  # a batch of one is one prompt
        energy = self.meter.stop()
        wall = sum(r.wall_time_s for r in results)
        if batched:
            self.batch_s.append(wall)
        for j, ((i, sample, prompt), result) in enumerate(zip(todo, results)):
            record = _scored(pair, task, sample, prompt, result, want_ppl)
            record.update(energy_j=energy.joules / len(todo) if energy.joules is not None else None,
                          _energy=energy if j == 0 else None)  # the batch's window, counted once
            if batched:
                record.update(batch=len(self.batch_s) - 1, batch_size=len(todo), batch_time_s=wall)
            records[i].update(record)
        return records

    def row(self) -> ResultRow:
        """The run's row from its decodes, scores and energy readings."""
        resolved, task, rows = self.resolved, self.task, self.rows
        if not self.decodes:
            raise ValueError(nothing_decoded(rows, self.skips, context_limit(self.pair.target),
                                             self.dec.max_new_tokens))
        # per_position_acceptance: gamma positions, or as many as a decode proposed (specinfer drafts len(k_config)
        # deep and does not read gamma)
        depth = max([self.dec.gamma, *(len(r.position_proposals) for r in self.decodes)])
        metrics = run_metrics(self.decodes, gamma=depth, energy=combine_readings(self.readings))
        if self.batch_s:  # task.batch_size > 1: per batch wall times (total_decode_s is their sum)
            metrics.update(n_batches=len(self.batch_s), batch_s=list(self.batch_s))
        metrics.update(perplexity(self.logps) if self.logps else {})
        metrics.update(diversity([r["output_ids"] for r in rows if "output_ids" in r]))  # over output token ids
        if task.metric:
            metrics["score"] = {k: v for k, v in task.aggregate(self.scores).items()}
            metrics["score_name"] = task.metric
        metrics.update(task.row_info())
        return ResultRow.build(
            resolved, experiment=experiment_name(resolved), metrics=metrics, decoder=asdict(self.dec),
            model={**asdict(self.mcfg), "info": self.pair.info},
            task={**self.tcfg.to_dict(), "source": resolved["task"]["source"], "selected_ids": [s["id"] for s in rows]},
            seed=int(resolved.get("seed", 0)), n_prompts=len(self.decodes),
            skip_reasons={**task.skip_counts(), **dict(self.skips)}, run_dir=self.run_dir,
            devices=_devices(self.pair))

class ResultsNotAppended(OSError):
    """The results file (or samples.jsonl) could not be written at the end of a finished run; the message
    says where the row went instead."""


def _save_samples(run_dir: Path, rows: list[dict]) -> str | None:
    """Write samples.jsonl; on a write error (disk full) log it and return the reason, so that the row,
    which holds the run's figures, is still appended."""
    try:
        write_jsonl_atomic(run_dir / "samples.jsonl", rows)
    except OSError as err:
        log.error("could not write %s (%s); appending the row anyway", run_dir / "samples.jsonl", err)
        return err.strerror or str(err)
    return None


def save_row(results_file: Path, row: ResultRow, run_dir: Path, unless_done: bool = True) -> bool:
    """Append ``row``; False when ``unless_done`` and a row of the same config was appended meanwhile (two
    identical sweeps at once: the check is repeated under the results lock, this row is discarded).

    When the append fails (disk full, permissions changed), the row is saved as ``row.json`` in the run
    directory, or failing that written to stderr as one JSON line, and :class:`ResultsNotAppended` says
    where; the results file is untouched (appends are atomic)."""
    try:
        appended = append_row(results_file, row, unless_hash=row.config_hash if unless_done else None)
    except OSError as err:
        why = err.strerror or str(err)
        saved = run_dir / "row.json"
        try:
            write_jsonl_atomic(saved, [row.to_dict()])
            where = f"saved to {saved}; append it with `python -m mtad.harness.store append {saved} {results_file}`"
        except OSError:
            sys.stderr.write(to_json_line(row))
            where = f"written to stderr as one JSON line (and {saved} could not be written either)"
        raise ResultsNotAppended(f"could not append the row to {results_file} ({why}); the row was {where}") from err
    if not appended:
        log.warning("%s already holds a row for config %s, appended by a concurrent run while this one "
                    "decoded: this run's row is discarded (its samples stay in %s)", results_file,
                    row.config_hash[:12], run_dir)
    return appended


def weights_fingerprint(mcfg: ModelConfig) -> dict:
    """The weight files of local target/draft directories: name + sha256 for files under 256 MB (a
    committed draft hashes the same in every clone), name + size + mtime for larger ones (cheap for 70B
    checkpoints). Hub ids are identified by their id alone."""
    out = {}
    for role in ("target", "draft"):
        spec = getattr(mcfg, role)
        path = resolve_local(spec) if spec else None
        if path is not None:
            files = sorted(f for f in path.iterdir() if f.suffix in (".safetensors", ".bin", ".gguf", ".pt"))
            out[role] = [f"{f.name}:{_file_id(f)}" for f in files]
    return out


def _file_id(f: Path) -> str:
    st = f.stat()
    if st.st_size < 256 << 20:
        return hashlib.sha256(f.read_bytes()).hexdigest()[:16]
    return f"{st.st_size}:{int(st.st_mtime)}"


def _turns(task, sample) -> int:
    return min(task.cfg.turns, len(sample.turns))


def _encode(task, sample, tokenizer, turn, history, chat) -> Prompt:
    """``task.encode``, except that a row the template or the tokenizer cannot take (e.g. a lone surrogate that
    got past loading) becomes a skipped prompt with its reason, as a too-long one does: one row's content
    never ends a run. (A ValueError, e.g. no chat template or ``task.on_long_prompt=error``, is about the run,
    not the row, and still ends it.)"""
    try:
        return task.encode(sample, tokenizer, turn, history, chat)
    except (TypeError, UnicodeError) as err:  # what tokenizers raise on text they cannot encode
        log.warning("prompt %s turn %d skipped: it cannot be rendered or tokenized (%s: %s)", sample.id, turn,
                    type(err).__name__, err)
        return Prompt("", [], f"cannot be rendered or tokenized: {type(err).__name__}: {err}"[:500],
                      skip_kind=f"prompts that cannot be rendered or tokenized ({type(err).__name__})")




def _scored(pair, task, sample, prompt, result, want_ppl) -> dict:
    text = pair.tokenizer.decode(result.tokens, skip_special_tokens=True)
    logp = sequence_logprobs(pair.target, prompt.ids, result.tokens) if want_ppl and result.tokens else None
    answer = task.postprocess(sample, text)
    scores = task.score(sample, text) if task.metric else {}
    return {"completion": text, "answer": answer, "output_ids": result.tokens,
            "n_tokens": result.num_tokens, "stop_reason": result.stop_reason, "time_s": result.wall_time_s,
            "cpu_s": result.cpu_time_s,
            "target_forwards": result.target_forwards, "draft_forwards": result.draft_forwards,
            "accepted": result.accepted, "proposed": result.proposed,
            "mean_logprob": float(logp.mean()) if logp is not None else None,
            "perplexity": float(torch.exp(-logp.mean())) if logp is not None else None,
            "scores": scores, "_result": result, "_logp": logp}



CONTEXT_SKIP = "prompts do not fit the model context"


def nothing_decoded(rows: list[dict], skips: Counter, context: int | None = None,
                    max_new_tokens: int | None = None) -> str:
    """One line: how many prompts were skipped, why, the range of their lengths, and what to change. A prompt
    that does not fit the target's ``context`` with ``max_new_tokens`` fits once truncated to ``context -
    max_new_tokens`` tokens (``task.on_long_prompt=truncate`` cuts to ``task.max_prompt_tokens``, never to the
    model's context)."""
    if not rows:
        return "no prompt was decoded: the task selected no samples; check task.n_prompts and task.categories"
    parts = []
    for kind, n in skips.most_common():
        lengths = [r["prompt_tokens"] for r in rows if r.get("skip_kind", r.get("skip_reason")) == kind] or [0]
        parts.append(f"{n} {kind} ({min(lengths)}-{max(lengths)} tokens)")
    fixes = []
    if any("max_prompt_tokens" in k for k in skips):
        fixes.append("raise task.max_prompt_tokens or set task.on_long_prompt=truncate")
    if CONTEXT_SKIP in skips:
        longest = max(r["prompt_tokens"] for r in rows if r.get("skip_kind") == CONTEXT_SKIP)
        fixes.append(context_fix(context, max_new_tokens, longest))
    if not fixes:
        fixes.append("fix those rows of the data file (each is logged above with its reason)"
                     if all("cannot be rendered" in k for k in skips) else "use shorter prompts")
    total = sum(skips.values())
    return f"no prompt was decoded: all {total} selected prompts were skipped: {'; '.join(parts)}; {'; '.join(fixes)}"


def context_fix(context: int | None, max_new_tokens: int | None, longest: int) -> str:
    """What makes prompts of up to ``longest`` tokens fit a target's context of ``context`` tokens with
    ``max_new_tokens`` to generate: only the options that do."""
    longer = "or use a model with a longer context"
    if not context or not max_new_tokens:
        return f"cut the prompts with task.max_prompt_tokens and task.on_long_prompt=truncate, {longer}"
    room = context - max_new_tokens
    if room < 1:
        return (f"decoder.max_new_tokens={max_new_tokens} alone fills the target's context of {context} tokens: "
                f"lower decoder.max_new_tokens, {longer}")
    lower = (f", decoder.max_new_tokens={context - longest} or less" if longest < context else "")
    return (f"set task.max_prompt_tokens={room} task.on_long_prompt=truncate (keeps each prompt's last {room} "
            f"tokens: the target's context of {context} minus decoder.max_new_tokens={max_new_tokens}){lower}, "
            f"{longer}")


def _devices(pair) -> list:
    return sorted({p.device for m in (pair.target, pair.draft) if m is not None for p in m.parameters()}, key=str)


def _gpu_indices(pair) -> list[int]:
    return sorted({d.index or 0 for d in _devices(pair) if d.type == "cuda"})


def _hydra_run_dir() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.output_dir
    except Exception:  # not under Hydra (Python API, tests)
        return None


def _summary(m: dict) -> str:
    keys = ("total_tokens", "ms_per_token", "block_efficiency", "acceptance_rate", "ppl_mean_logprob", "score")
    return ", ".join(f"{k}={m.get(k)!r}" if not isinstance(m.get(k), float) else f"{k}={m[k]:.4g}" for k in keys)


