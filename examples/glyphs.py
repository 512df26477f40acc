"""A second image task for the scaling study: 62 classes of printed characters, generated.

    asgd train --backend sim --clients 8 --data examples/glyphs.py:make_data      the small CNN

The 62 classes of EMNIST's ByClass split (Cohen et al. 2017: digits, upper and lower
case letters), 28x28 grey images rendered with Pillow from the 16 DejaVu and STIX
TrueType faces that matplotlib installs (nothing is downloaded), each at a random face,
size (12-22 pixels), rotation, shift and stroke, over noise; a fifth of the training
labels replaced by a class drawn at random (the test labels are true).

Why this task: it was chosen for its gradient noise, from two causes that real data
have and Fashion-MNIST has little of. Many classes with fine distinctions: 62, some told
apart by size alone or not at all once the size is random (o O 0, l I 1, c C, s S, x X,
z Z ...), as in ByClass itself. And wrong labels: 20% symmetric noise is the lightest
standard setting of the noisy-label literature (Han et al. 2018, Co-teaching) and about
what one human annotator gives CIFAR-10 (CIFAR-10N, Wei et al. 2022: 17%). Both keep
per-sample gradients disagreeing after the easy part is learnt, so the gradient noise
scale (McCandlish et al. 2018), and with it the batch beyond which averaging more buys
little, is about twice Fashion-MNIST's at the same point of training or more
(docs/results/notes.md, The second task, says the measurement). Nothing was fitted to an
asynchronous run.

The images are a function of `SEED` alone (the same on every rank of an installation:
numpy's generator, Pillow's rasteriser, torch's resampling); 60,000 train and 10,000 test, Fashion-MNIST's sizes, so the
study's batch, budgets and model carry over. Made once per process and kept.
"""
from __future__ import annotations

import functools
import string
from pathlib import Path

import matplotlib
import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch.nn import functional as F
from torch.utils.data import TensorDataset

CHARACTERS = string.digits + string.ascii_uppercase + string.ascii_lowercase  # ByClass's 62
FACES = tuple(f"DejaVu{family}{style}.ttf" for family in ("Sans", "Serif", "SansMono")
              for style in ("", "-Bold", "-Oblique" if family != "Serif" else "-Italic",
                            "-BoldOblique" if family != "Serif" else "-BoldItalic")) + \
    ("STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf")
SIDE = 28
SIZES = (12, 22)      # the glyph's font size in pixels, drawn uniformly: case by size is lost
ROTATION = 15         # degrees either way
SHIFT = 3             # pixels either way, from the centre
BASE, CANVAS = 48, 96  # each glyph is drawn once at BASE pixels on a CANVAS square, then resampled
NOISE = 40            # the background's grey levels, uniform in [0, NOISE)
LABEL_NOISE = 0.2     # of the training labels, replaced by a class drawn uniformly (the test's are true)
SEED = 0
TRAIN, TEST = 60_000, 10_000


class Glyphs(TensorDataset):
    classes = list(CHARACTERS)  # the class count asgd passes to the model


def make_data() -> tuple[Glyphs, Glyphs]:
    """(train, test): images normalised to mean 0, std 1 over the training set."""
    x, y = images(TRAIN + TEST, SEED)
    pixels = torch.from_numpy(x.astype(np.float32)[:, None] / 255.0)
    mean, std = pixels[:TRAIN].mean(), pixels[:TRAIN].std()
    pixels = (pixels - mean) / std
    labels = torch.from_numpy(y.astype(np.int64))
    return Glyphs(pixels[:TRAIN], noisy(labels[:TRAIN], LABEL_NOISE, SEED)), Glyphs(pixels[TRAIN:], labels[TRAIN:])


def noisy(labels: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    """`labels` with each one replaced, with probability `fraction`, by a class drawn
    uniformly from all 62 (so the label is wrong with probability fraction x 61/62)."""
    rng = np.random.default_rng([seed, 1])
    chosen = torch.from_numpy(rng.random(len(labels)) < fraction)
    drawn = torch.from_numpy(rng.integers(0, len(CHARACTERS), len(labels)))
    return torch.where(chosen, drawn, labels)


@functools.lru_cache(maxsize=2)
def images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n uint8 images (n, 28, 28) and their labels, from `seed` alone (kept: a sweep's
    points, forked from one process, make them once). Each face's characters are drawn
    once, large; a sample is one of them scaled, rotated and shifted (one bilinear
    resampling, torch's grid_sample) and laid over the noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(CHARACTERS), n)
    faces, strokes = rng.integers(0, len(FACES), n), rng.integers(0, 2, n)  # 1: the bolder pen (2 pixels at BASE)
    scales = rng.uniform(*SIZES, n) / BASE
    angles = np.radians(rng.uniform(-ROTATION, ROTATION, n))
    shifts = rng.uniform(-SHIFT, SHIFT, (n, 2))
    noise = rng.integers(0, NOISE, (n, SIDE, SIDE))
    bank = _bank()
    index = torch.from_numpy((faces * 2 + strokes) * len(CHARACTERS) + labels)
    cos, sin = torch.from_numpy(np.cos(angles)), torch.from_numpy(np.sin(angles))
    ratio = torch.from_numpy((SIDE / CANVAS) / scales)
    # output -> input, in grid_sample's [-1, 1] coordinates: undo the shift, the rotation and the scale
    theta = torch.stack([torch.stack([cos, sin], 1), torch.stack([-sin, cos], 1)], 1) * ratio[:, None, None]
    offset = -(theta @ torch.from_numpy(shifts / (SIDE / 2))[:, :, None])
    theta = torch.cat([theta, offset], 2).float()
    out = np.empty((n, SIDE, SIDE), np.uint8)
    for lo in range(0, n, 4096):
        hi = min(n, lo + 4096)
        grid = F.affine_grid(theta[lo:hi], [hi - lo, 1, SIDE, SIDE], align_corners=False)
        ink = F.grid_sample(bank[index[lo:hi], None], grid, align_corners=False)[:, 0]
        out[lo:hi] = np.maximum(ink.round().clamp(0, 255).to(torch.uint8).numpy(), noise[lo:hi])
    return out, labels


@functools.lru_cache(maxsize=1)
def _bank() -> torch.Tensor:
    """Every (face, stroke, character) drawn white on black at BASE pixels, centred on a
    CANVAS-square image: (faces x 2 x 62, CANVAS, CANVAS) float32 grey levels."""
    glyphs = []
    for face in FACES:
        font = ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / face), BASE)
        for stroke in (0, 2):
            for character in CHARACTERS:
                canvas = Image.new("L", (CANVAS, CANVAS))
                ImageDraw.Draw(canvas).text((CANVAS / 2, CANVAS / 2), character, fill=255, font=font, anchor="mm",
                                            stroke_width=stroke, stroke_fill=255)
                glyphs.append(np.asarray(canvas, np.float32))
    return torch.from_numpy(np.stack(glyphs))
