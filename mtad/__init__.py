"""mtad: multi-token joint decoding (MTAD/MMTAD/MTJD) and its baselines, with a measuring harness.

Python API without Hydra::

    import torch, mtad
    result = mtad.generate(pair, prompt_ids, {"name": "mtad", "gamma": 4, "tau": 0.5}, torch.Generator().manual_seed(0))
"""
from mtad.decoding import DECODERS, DecoderConfig, DecodeResult, PromptTooLong, generate
from mtad.pair import ModelPair

__version__ = "0.1.0"
__all__ = ["DECODERS", "DecodeResult", "DecoderConfig", "ModelPair", "PromptTooLong", "generate", "__version__"]
