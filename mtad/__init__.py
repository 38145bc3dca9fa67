"""mtad: multi-token joint decoding (MTAD/MMTAD/MTJD) and its baselines, with a measuring harness.

Python API without Hydra::

    import torch, mtad
    pair = mtad.load_pair(mtad.ModelConfig(name="smollm2", kind="smollm2"))
    result = mtad.generate(pair, prompt_ids, {"name": "mtad", "gamma": 4, "tau": 0.5}, torch.Generator().manual_seed(0))

The package is cut into layers that import one way (docs/DESIGN.md).
"""
from mtad._util.version import __version__
from mtad.decoding import DECODERS, DecoderConfig, DecodeResult, PromptTooLong, generate
from mtad.models.load import ModelConfig, load_pair
from mtad.models.pair import ModelPair

__all__ = ["DECODERS", "DecodeResult", "DecoderConfig", "ModelConfig", "ModelPair", "PromptTooLong", "generate",
           "load_pair", "__version__"]
