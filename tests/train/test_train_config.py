"""The trainer's config: validation, the Hydra composition of conf/train/ (recipes), the reproduce command, the
model cards' one-line commands against the committed drafts' configs, and the ``python -m mtad.train`` entry."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, fields, replace

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, HydraException
from inprocess import run_module
from omegaconf import OmegaConf

from mtad._util.paths import REPO_ROOT
from mtad.train.config import (
    CONF_DIR,
    LOCAL_KEYS,
    TrainDraftConfig,
    recipe_config,
    recipes,
    register,
    reproduce_command,
)

register()


def _compose(overrides: list[str]) -> TrainDraftConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="draft", overrides=overrides))


def test_config_validation():
    with pytest.raises(ValueError, match="init_layers"):
        TrainDraftConfig(layers=3)
    with pytest.raises(ValueError, match="mix"):
        TrainDraftConfig(mix={"gsm8k_test": 1.0})
    with pytest.raises(ValueError, match="arch"):
        TrainDraftConfig(arch="eagle")
    with pytest.raises(ValueError, match="data=cache"):
        TrainDraftConfig(arch="feature")
    with pytest.raises(ValueError, match="text_shards"):
        TrainDraftConfig(text_shards=2)
    with pytest.raises(ValueError, match="gen_dtype"):
        TrainDraftConfig(gen_dtype="float16", data="cache", loss="ce_tv")


def test_the_default_is_the_feature_recipe_and_keys_override_it():
    cfg = _compose(["max_minutes=1", "out_dir="])
    assert isinstance(cfg, TrainDraftConfig) and cfg.recipe == "feature_cache"
    assert cfg.max_minutes == 1 and cfg.out_dir == "" and cfg.arch == "feature" and cfg.data == "cache"
    assert _compose(["recipe=token_cache"]).arch == "token"  # control: another recipe gives another draft
    with pytest.raises(ConfigCompositionException):
        _compose(["max_minuts=1"])
    with pytest.raises(HydraException, match="recipe/nope"):
        _compose(["recipe=nope"])


@pytest.mark.parametrize("name", recipes())
def test_every_recipe_composes_as_recipe_config_reads_it(name):
    cfg = _compose([f"recipe={name}"])
    assert cfg == recipe_config(name) and cfg.recipe == name  # each recipe names itself


def test_the_live_recipe_is_the_dataclass_defaults():
    assert recipe_config("live") == TrainDraftConfig()
    assert recipe_config("token_cache") != TrainDraftConfig()


def _card_command(draft: str) -> list[str]:
    """The overrides of the one-line command under the card's "## Reproduce" heading."""
    card = (REPO_ROOT / "models" / draft / "MODEL_CARD.md").read_text()
    section = card[card.index("## Reproduce"):]
    m = re.search(r'`make train-draft ARGS="([^"]*)"`', section)
    assert m, f"models/{draft}/MODEL_CARD.md: no `make train-draft ARGS=\"...\"` under ## Reproduce"
    return shlex.split(m.group(1))


def _differences(cfg: TrainDraftConfig, committed: dict) -> dict:
    """Keys where ``cfg`` differs from a committed draft.json config (keys added since: from the defaults)."""
    default = TrainDraftConfig()
    got = asdict(cfg)
    return {f.name: (got[f.name], committed.get(f.name, getattr(default, f.name))) for f in fields(cfg)
            if f.name not in LOCAL_KEYS and got[f.name] != committed.get(f.name, getattr(default, f.name))}


@pytest.mark.parametrize("draft", ["smollm2-draft", "smollm2-feature-draft"])
def test_each_cards_command_composes_the_committed_drafts_config(draft):
    """The card's `make train-draft ARGS="..."` composes to the config in the draft's own draft.json (the run
    that wrote the committed weights); control: the live recipe with the same overrides does not."""
    committed = json.loads((REPO_ROOT / "models" / draft / "draft.json").read_text())["config"]
    argv = _card_command(draft)
    assert _differences(_compose(argv), committed) == {}
    others = [a for a in argv if not a.startswith("recipe=")] + ["recipe=live"]
    assert _differences(_compose(others), committed)


def test_the_reproduce_command_composes_back_to_the_config():
    """``reproduce_command`` survives a POSIX shell and Hydra's grammar and gives back the run's settings, for
    the default recipe and another; control: JSON-quoted dict keys (what a card once printed) do not compose."""
    runs = [replace(recipe_config("feature_cache"), init_layers=[5, 9], lr=1e-4, data_seed=3, gen_dtype="float32",
                    onpolicy_mix={"gsm8k": 0.5, "code": 0.5, "alpaca": 0.0}),
            TrainDraftConfig(data="cache", loss="ce_tv", gen_dtype="bfloat16", head_bias=True,
                             init_from="models/smollm2-feature-draft")]
    for cfg in runs:
        command = reproduce_command(cfg)
        assert command.startswith(f"python -m mtad.train recipe={cfg.recipe} ")
        assert _compose(shlex.split(command)[3:]) == cfg
    assert reproduce_command(recipe_config("token_cache")) == "python -m mtad.train recipe=token_cache"
    with pytest.raises(HydraException):
        _compose(['onpolicy_mix={"gsm8k":0.5,"code":0.5}'])


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_entry_points_find_the_config(tmp_path):
    """``python -m mtad.train`` (and its old name ``mtad.train.trainer``) compose conf/train/ from any directory
    (``--cfg job`` prints the config and trains nothing); an unknown recipe fails, naming it."""
    out = _cli("mtad.train", "--cfg", "job", "max_minutes=1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "recipe: feature_cache" in out.stdout and "max_minutes: 1" in out.stdout
    # the old name and a bad recipe in this process (:mod:`inprocess`), from the same directory
    old = run_module("mtad.train.trainer", "--cfg", "job", "recipe=token_cache", cwd=tmp_path)
    assert old.returncode == 0 and "recipe: token_cache" in old.stdout, old.stderr
    bad = run_module("mtad.train", "--cfg", "job", "recipe=nope", cwd=tmp_path)
    assert bad.returncode != 0 and "recipe/nope" in bad.stderr
