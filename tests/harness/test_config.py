"""Every YAML under conf/ composes against its typed schema; typos and wrong types fail at compose time."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from mtad._util.paths import REPO_ROOT
from mtad.decoding import DecoderConfig
from mtad.harness.config import register_configs
from mtad.harness.tracking import TrackingConfig
from mtad.models.load import ModelConfig
from mtad.tasks.base import TaskConfig

CONF = REPO_ROOT / "conf"
register_configs()


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("group,cls", [("decoder", DecoderConfig), ("model", ModelConfig),
                                       ("task", TaskConfig), ("tracking", TrackingConfig)])
def test_every_group_option_composes_and_validates(group, cls):
    options = _options(group)
    assert options, f"no YAML in conf/{group}"
    for name in options:
        cfg = _compose([f"{group}={name}"])
        node = OmegaConf.to_container(cfg[group], resolve=False)
        if group == "tracking":
            node["group"] = None  # interpolates the experiment name
        obj = cls.from_any(node) if hasattr(cls, "from_any") else cls(**node)  # __post_init__ validation
        assert obj is not None


def test_every_experiment_preset_composes():
    for name in _options("experiment"):
        cfg = _compose([f"experiment={name}"])
        assert cfg.experiment, name
        DecoderConfig.from_any(cfg.decoder)


def test_misspelt_key_fails_at_compose_time_naming_it():
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["decoder=mtad", "decoder.gamam=3"])
    assert "gamam" in str(err.value) or "gamam" in str(err.value.__cause__)


def test_wrong_type_fails_at_compose_time_naming_the_key():
    with pytest.raises((ConfigCompositionException, ValidationError)) as err:
        _compose(["decoder.gamma=four"])
    assert "gamma" in str(err.value) + str(err.value.__cause__)


def test_unknown_group_option_lists_valid_ones():
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["decoder=nosuch"])
    assert "mtad" in str(err.value)  # Hydra lists the available options


def test_yaml_typo_inside_a_group_file_fails(tmp_path: Path):
    conf = tmp_path / "conf"
    import shutil

    shutil.copytree(CONF, conf)
    (conf / "decoder" / "typo.yaml").write_text("name: mtad\ngama: 4\n")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        with pytest.raises((ConfigCompositionException, ConfigKeyError)):
            compose(config_name="config", overrides=["decoder=typo"])


def test_model_options_load_the_same_through_hydra_and_lm_eval():
    """The smollm2 variants compose the base and option files (conf/model/smollm2_variant/); lm_eval's loader
    merges the same ``defaults`` without Hydra and must agree on every value it sets."""
    from mtad.harness.lm_eval_backend import _load_preset

    for name in _options("model"):
        flat = _load_preset(CONF / "model" / f"{name}.yaml")
        hydra = OmegaConf.to_container(_compose([f"model={name}"]).model)
        assert flat["name"] == name and {k: hydra[k] for k in flat} == flat, name
    bf16 = _compose(["model=smollm2_bf16_feature"]).model
    assert (bf16.dtype, bf16.draft_head, bf16.draft) == ("bfloat16", "reduced_int8", "models/smollm2-feature-draft")


def test_cpu_table_pair_picks_the_model_and_names_the_rows():
    names = sorted(p.stem for p in (CONF / "experiment" / "pair").glob("*.yaml"))
    assert names == ["smollm2", "smollm2_bf16", "smollm2_bf16_feature", "smollm2_feature"]
    for name in names:
        cfg = _compose(["experiment=cpu_table", f"experiment/pair@pair={name}"])
        model = "smollm2_token" if name == "smollm2" else name  # PROFILE=cpu: the fp32 token-draft pair
        assert cfg.model.name == model and cfg.experiment == "cpu_table" + name.removeprefix("smollm2"), name
    # negative control: the model alone does not rename the rows (nor did it before the pairs were one preset)
    assert _compose(["experiment=cpu_table", "model=smollm2_bf16"]).experiment == "cpu_table"


def test_model_smollm2_is_the_best_pair_for_the_machine():
    """model=smollm2 resolves to the explicit bf16 or fp32 feature pair, field for field (so its rows hash as
    that pair's); the old token pair keeps its own name and hashes under its old one."""
    from dataclasses import asdict

    from mtad.harness.rows import config_hash
    from mtad.models.load import ModelConfig, resolve_alias

    alias = ModelConfig(**OmegaConf.to_container(_compose(["model=smollm2", "model.device=cpu"]).model))
    for native, explicit in ((True, "smollm2_bf16_feature"), (False, "smollm2_feature")):
        got, why = resolve_alias(alias, bf16=native)
        want = ModelConfig(**OmegaConf.to_container(_compose([f"model={explicit}", "model.device=cpu"]).model))
        assert got == want and explicit in why, (native, why)
        assert config_hash({"model": asdict(got)}) == config_hash({"model": asdict(want)})
    # negative controls: an explicit pair is left alone; the two resolutions differ
    token = ModelConfig(**OmegaConf.to_container(_compose(["model=smollm2_token"]).model))
    assert resolve_alias(token) == (token, None) and token.draft == "models/smollm2-draft"
    assert resolve_alias(alias, bf16=True)[0] != resolve_alias(alias, bf16=False)[0]
    # the renamed pair hashes under its old name, and only it does
    old = {"model": {**asdict(token), "name": "smollm2"}}
    assert config_hash({"model": asdict(token)}) == config_hash(old)
    assert config_hash({"model": {**asdict(token), "name": "smollm2_feature"}}) != config_hash(old)
    with pytest.raises(ValueError, match="only for the embedded pair"):
        ModelConfig(name="x", kind="tiny", dtype="auto")
