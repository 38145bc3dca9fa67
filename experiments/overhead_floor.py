"""The floor of ``make bench-core``'s overhead share: speculative decoding written as a bare loop on the same tiny
random models, with the decoders' own filter, draw and accept rule but none of the harness (no sessions, rows,
statistics or checks: one DynamicCache per model, token lists, one prompt).

    .venv/bin/python experiments/overhead_floor.py

Prints the loop's CPU-time share outside model forwards, then ``python -m mtad.measure.overhead --decoders
speculative`` on the same models, so the two shares come from one process on one machine state. The difference is
what the harness adds; the floor is what the sampling arithmetic itself costs beside forwards this small.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mtad, not an installed one

from mtad._util.cli import ArgumentParser  # noqa: E402
from mtad.decoding.accept import speculative_accept  # noqa: E402
from mtad.decoding.filter import draw, filter_probs, filter_top  # noqa: E402
from mtad.measure import overhead  # noqa: E402

GAMMA, T, TOP_K, TOP_P = 4, 1.0, 10, 0.9


class Loop:
    """A bare speculative loop on one prompt; ``model_s`` sums the CPU seconds inside model calls."""

    def __init__(self, target, draft):
        self.target, self.draft, self.model_s = target, draft, 0.0

    def call(self, model, ids: list[int], cache) -> torch.Tensor:
        c = time.process_time()
        out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=len(ids))
        self.model_s += time.process_time() - c
        return out.logits[0].float()  # (len(ids), V)

    def decode(self, prompt: list[int], n: int, rng: torch.Generator) -> list[int]:
        toks = list(prompt)
        caches = {"t": (DynamicCache(config=self.target.config), []), "d": (DynamicCache(config=self.draft.config), [])}

        def pending(key: str) -> list[int]:  # roll the cache back to the committed text; the tokens it lacks
            cache, held = caches[key]
            k, m = 0, min(len(held), len(toks) - 1)
            while k < m and held[k] == toks[k]:
                k += 1
            if len(held) > k:
                cache.crop(-(len(held) - k))
                del held[k:]
            return toks[k:]

        while len(toks) - len(prompt) < n:
            ids, xs, qs = pending("d"), [], []
            for _ in range(GAMMA):
                law = filter_top(self.call(self.draft, ids, caches["d"][0])[-1:], T, TOP_K, TOP_P)
                caches["d"][1].extend(ids)
                qs.append(law.dense())
                xs.append(int(law.draw(rng)))
                ids = [xs[-1]]
            ids = pending("t") + xs
            p = filter_probs(self.call(self.target, ids, caches["t"][0])[-GAMMA - 1:], T, TOP_K, TOP_P)
            caches["t"][1].extend(ids)
            k, nxt = speculative_accept(p, torch.cat(qs), torch.tensor(xs), torch.rand(GAMMA, generator=rng))
            toks += xs[:k] + draw(nxt[None], rng)[0].tolist()
        return toks


def main(argv=None) -> None:
    ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)  # no options: --help, or a stray one refused
    torch.set_num_threads(1)
    args = overhead.parse(["--decoders", "speculative"])
    pair = overhead.build_pair(args)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(args.vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.prompts)]
    loop = Loop(pair.target, pair.draft)
    with torch.inference_mode():
        loop.decode(prompts[0], 8, torch.Generator().manual_seed(99))  # warm-up
        loop.model_s, c = 0.0, time.process_time()
        for i, p in enumerate(prompts):
            loop.decode(p, args.new, torch.Generator().manual_seed(i))
        total = time.process_time() - c
    print(f"bare loop: CPU {total:.3f} s, inside model calls {loop.model_s:.3f} s, "
          f"share outside forwards {1 - loop.model_s / total:.1%}")
    overhead.main(["--decoders", "speculative"])


if __name__ == "__main__":
    main()
