"""A sequence model under asgd: a small causal transformer that predicts the next character.

    .venv/bin/python examples/char_lm.py --backend sim --clients 4     the simulator
    mpiexec -n 3 .venv/bin/python examples/char_lm.py                  1 server + 2 clients
    .venv/bin/python examples/char_lm.py --steps 400 --clients 2       asgd starts mpiexec itself
    asgd export runs/<name> --out lm.safetensors                       tied weights saved once

The text is the docstrings of a fixed list of Python's own standard-library modules, read
with `inspect` from the interpreter that runs this (nothing is downloaded), as printable
ASCII: a fixed vocabulary of 96 characters. Items are windows of CONTEXT characters, the
target the same window one character on; the first 90 % of the text trains, the rest tests.
`make_code_data` is the same over the standard library's source (13 MB, not 0.14), for
runs long enough that the docstrings would be seen tens of times.

The model (2 layers, d_model 64, 4 heads, pre-norm, its output head tied to the token
embedding) gives logits (B, T, V) for inputs (B, T); `token_loss` is the mean
cross-entropy over every token; the metric, `perplexity`, sums the token losses and counts
the tokens over the whole test pass and takes exp of their mean once (docs/your-model.md).
Trained with AdamW, lr warmup and a cosine schedule through the Python API: under the
default rule the server takes AdamW's step on the clients' gathered gradients.
"""
from __future__ import annotations

import importlib
import inspect
import math
import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

CONTEXT = 64                      # characters a window sees
VOCAB = 96                        # newline and the 95 printable ASCII characters
MODULES = ("argparse", "collections", "functools", "inspect", "json", "pathlib", "re", "string",
           "textwrap", "unittest.case", "zipfile")  # always in a Python


def corpus() -> str:
    """Every docstring of MODULES (each module's, class's, function's and method's), in a
    fixed order; the same on every rank of a job, as each reads it from its interpreter."""
    parts = []
    for name in MODULES:
        module = importlib.import_module(name)
        parts.append(inspect.getdoc(module))
        for _, member in sorted(vars(module).items()):
            if getattr(member, "__module__", None) == module.__name__:  # not one imported from elsewhere
                parts += _docstrings(member)
    return "\n\n".join(part for part in parts if part)


def _docstrings(member: object) -> list[str | None]:
    """A member's docstring and, for a class, its methods'."""
    methods = [m for _, m in sorted(vars(member).items()) if inspect.isfunction(m)] if inspect.isclass(member) else []
    return [inspect.getdoc(m) for m in (member, *methods)]


def source_corpus() -> tuple[str, str]:
    """The standard library's own source (its tests left out), every tenth file, in path
    order, held out: about 13 MB of text where the docstrings are 0.14 MB. For runs that
    must measure optimization rather than memory: 8 clients x 480 minibatches of 32
    windows see each docstring window 60 times, and past a few epochs the validation
    loss rises with every method's progress (docs/rules.md); here they see each once."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in root.rglob("*.py")
                   if not {"test", "tests", "idle_test", "site-packages"} & set(f.relative_to(root).parts))
    texts = [f.read_text(errors="replace") for f in files]
    return "\n\n".join(texts[i] for i in range(len(texts)) if i % 10 != 9), "\n\n".join(texts[9::10])


def encode(text: str) -> torch.Tensor:
    """Newline -> 0, ' '..'~' -> 1..95; any other character is a space."""
    points = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()
    printable = (points >= 32) & (points <= 126)
    return torch.where(points == 10, 0, torch.where(printable, points - 31, 1))


def decode(codes: torch.Tensor) -> str:
    return "".join("\n" if int(c) == 0 else chr(int(c) + 31) for c in codes)


class Windows(Dataset):
    """(x, y): CONTEXT characters and the same one character on, windows CONTEXT apart."""

    def __init__(self, codes: torch.Tensor) -> None:
        self.codes = codes

    def __len__(self) -> int:
        return (len(self.codes) - 1) // CONTEXT

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.codes[i * CONTEXT:(i + 1) * CONTEXT + 1]
        return window[:-1], window[1:]


def make_data() -> tuple[Windows, Windows]:
    codes = encode(corpus())
    cut = int(len(codes) * 0.9)
    return Windows(codes[:cut]), Windows(codes[cut:])


def make_code_data() -> tuple[Windows, Windows]:
    """The same windows over `source_corpus()`: the language-model study's data."""
    train, test = source_corpus()
    return Windows(encode(train)), Windows(encode(test))


class Block(nn.Module):
    """Pre-norm causal self-attention and an MLP, each added to the residual stream."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, width = h.shape
        q, k, v = (part.view(b, t, self.heads, -1).transpose(1, 2)
                   for part in self.qkv(self.norm1(h)).split(width, dim=2))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(attended.transpose(1, 2).reshape(b, t, width))
        return h + self.mlp(self.norm2(h))


class CharTransformer(nn.Module):
    def __init__(self, width: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(CONTEXT, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: one tensor, two names in the state_dict
        for table in (self.embed, self.position):  # GPT-2's 0.02: N(0, 1) would start the tied logits far from
            nn.init.normal_(table.weight, std=0.02)  # uniform (a loss near 40, not ln 96 = 4.6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.position(torch.arange(x.shape[1], device=x.device))
        return self.head(self.norm(self.blocks(h)))  # (B, T, V) logits


def make_model(*, width: int = 64, layers: int = 2, heads: int = 4) -> CharTransformer:
    """asgd calls it with `model_args` alone (no shape, no class count: it takes neither)."""
    return CharTransformer(width, layers, heads)


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token of (B, T, V) logits against (B, T) targets."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def perplexity(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
    """The batch's summed token loss and its tokens: summed over the test pass, divided
    once, then `finish` (exp): the split's perplexity, the run's curve (lower is better)."""
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    return float(total), targets.numel()


perplexity.finish = math.exp


if __name__ == "__main__":
    from asgd import train

    result = train(make_model, make_data, loss=token_loss, metric=perplexity, optimizer="adamw", lr=3e-3, weight_decay=0.01, lr_warmup=3200, lr_schedule="cosine",
                   batch_size=32, steps=300, eval_samples=256)
    if result.summary is not None:  # the process that recorded the run (under mpiexec: rank 0)
        loss, ppl = result.final_test_loss, result.summary.get("final_test_metric")
        said = f"validation loss {loss:.3f}, perplexity {ppl:.2f}" if loss is not None else "not measured"
        print(f"{result.run_dir}: {result.status}; {said}")
    raise SystemExit(result)  # an int: the exit status
