"""Decoding core: every strategy of ALGORITHMS.md on one shared loop.

Shape glossary used in comments across the package: B batch, T sequence, S positions in this forward,
V vocab, K draft length, W beams, N tree nodes.
"""
from mtad.decoding import autoregressive, dyntree, mmtad, mtad, mtjd, specinfer, speculative  # noqa: F401  (register)
from mtad.decoding.config import DecoderConfig
from mtad.decoding.core import DECODERS, PromptTooLong, generate, register
from mtad.decoding.result import DecodeResult

__all__ = ["DECODERS", "DecodeResult", "DecoderConfig", "PromptTooLong", "generate", "register"]
