"""A small character-level transformer on a pinned excerpt of CPython's standard library sources
(perf/data/text/, PSF licence; files, hashes and licence in its README).

Stdlib + numpy + torch only (torch 1.13 or 2.x). Self-test, and with --train a short
single-process training run:
  /usr/bin/python3 -m studies.train.charlm [--train [EPOCHS]]

Data (fixed):
  - the files of CORPUS_FILES, read as bytes and checked against their sha256; every byte is ASCII,
    so a character is a byte and the vocabulary is the 128 ASCII codes;
  - split per file: the first 90% of each file's characters (floor) are training text, the last
    10% test text; the training parts are concatenated in CORPUS_FILES order, likewise the test
    parts (379,454 training and 42,166 test characters);
  - a window is CONTEXT + 1 = 65 consecutive characters: the model reads the first 64 and predicts
    the next character at each of the 64 positions;
  - an epoch (training) is windows_per_epoch windows in total (default 1024, i.e. 65,536 predicted
    characters), split evenly over the workers: each worker draws its windows' start positions
    uniformly from the training text with numpy's default_rng((seed, epoch, rank)), in batches;
  - test loss: mean cross-entropy (nats per character) over every position of the test text's
    non-overlapping windows (658 windows, 42,112 predicted characters), the same every time.

Model (CharTransformer, 120,704 parameters in 30 tensors): token embedding 128x64 and learned
position embedding 64x64; 2 pre-norm blocks of LayerNorm, causal multi-head self-attention
(4 heads of 16; one 64->192 projection for q, k, v and a 64->64 output projection), LayerNorm, MLP
64->256->64 with GELU; a final LayerNorm and a 64->128 output layer. Attention is written out (no
scaled_dot_product_attention, absent from torch 1.13), so both torch versions run the same math.
"""
import hashlib
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                         os.pardir, "perf", "data", "text"))
# (file, sha256): CPython 3.11.2's Lib/<name>.py as shipped by Debian 12 (libpython3.11-stdlib
# 3.11.2-6+deb12u6), bytes unchanged, renamed .py.txt.
CORPUS_FILES = [
    ("argparse.py.txt", "9cad2261a804a55d7aca32790c999cb11bb546ce13a1c93e584ae57d5f8ea2a1"),
    ("subprocess.py.txt", "79a359dcb411ca6c49da51a46e1bfc4fbcb6173d12e3f3ce6a5d99acfbdf3ba7"),
    ("dataclasses.py.txt", "2b43fbb6faa846bd01d682911953e02a9e43a764c85e687bce0c006d8e30ff9a"),
    ("pathlib.py.txt", "fbb77652e1c4046ce41b512c0d993b592e35a85d43ef2c2fb40cd8e150c59a63"),
    ("shutil.py.txt", "b9599d3ce4e706f1c89bfc422349537e17cb9b893fdf81c60e732caf2e4b80db"),
    ("textwrap.py.txt", "62867e40cdea6669b361f72af4d7daf0359f207c92cbeddfc7c7506397c1f31c"),
    ("configparser.py.txt", "d1529aa3309cdc969c1c4e8bfa0cc7d3fc6a72b134e3a6865ee8456cb4f23d7a"),
]
TEST_FRACTION = 0.1
VOCAB = 128
CONTEXT = 64
WINDOWS_PER_EPOCH = 1024
NUM_TRAIN_CHARS = 379454
NUM_TEST_CHARS = 42166
NUM_PARAMETERS = 120704
NUM_PARAMETER_TENSORS = 30


def load_corpus(path=None):
    """Returns (train, test): uint8 numpy arrays of ASCII codes, the fixed split described above.
    Raises ValueError if a file's sha256 differs from CORPUS_FILES or a byte is not ASCII."""
    path = path or DATA_DIR
    train, test = [], []
    for name, digest in CORPUS_FILES:
        with open(os.path.join(path, name), "rb") as f:
            data = f.read()
        got = hashlib.sha256(data).hexdigest()
        if got != digest:
            raise ValueError("%s: sha256 %s, expected %s (perf/data/text/README.md)"
                             % (name, got, digest))
        a = np.frombuffer(data, dtype=np.uint8)
        if a.max() >= VOCAB:
            raise ValueError("%s: a byte outside ASCII at offset %d" % (name, int(np.argmax(a >= VOCAB))))
        cut = int(len(a) * (1 - TEST_FRACTION))
        train.append(a[:cut])
        test.append(a[cut:])
    return np.concatenate(train), np.concatenate(test)


def sample_windows(text, count, seed, epoch, rank):
    """count windows of CONTEXT + 1 characters from text, start positions drawn uniformly by
    numpy's default_rng((seed, epoch, rank)). Returns int64 tensor (count, CONTEXT + 1)."""
    rng = np.random.default_rng((seed, epoch, rank))
    starts = rng.integers(0, len(text) - CONTEXT, size=count)
    idx = starts[:, None] + np.arange(CONTEXT + 1)[None, :]
    return torch.from_numpy(text[idx].astype(np.int64))


def test_windows(text):
    """Every non-overlapping window of CONTEXT + 1 characters of text (consecutive windows share
    one character: the last target of one is the first input of the next). int64 (W, CONTEXT+1)."""
    n = (len(text) - 1) // CONTEXT
    idx = np.arange(n)[:, None] * CONTEXT + np.arange(CONTEXT + 1)[None, :]
    return torch.from_numpy(text[idx].astype(np.int64))


class Block(nn.Module):
    def __init__(self, d_model, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, d_ff)
        self.ff2 = nn.Linear(d_ff, d_model)

    def forward(self, x, mask):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))  # (b, h, t, d/h)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


class CharTransformer(nn.Module):
    """Input int64 (N, T <= CONTEXT) of ASCII codes, output logits (N, T, VOCAB)."""

    def __init__(self, vocab=VOCAB, context=CONTEXT, d_model=64, heads=4, layers=2, d_ff=256):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList([Block(d_model, heads, d_ff) for _ in range(layers)])
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))[None]
        # True above the diagonal: position i may not attend to j > i. Made here rather than held
        # as a buffer: DDP broadcasts buffers, and gloo in torch 1.13 has no bool.
        mask = torch.ones(t, t, dtype=torch.bool, device=idx.device).triu(1)
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.ln(x))


def loss_of(model, windows):
    """Mean cross-entropy of predicting windows[:, 1:] from windows[:, :-1]."""
    logits = model(windows[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


def evaluate(model, windows, batch=128):
    """(summed cross-entropy, predicted characters) of model over windows (int64 (W, CONTEXT+1)),
    eval mode, no gradients; the model's mode is restored after. Divide to get the mean loss."""
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    try:
        with torch.no_grad():
            for i in range(0, len(windows), batch):
                w = windows[i:i + batch]
                logits = model(w[:, :-1])
                total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                         w[:, 1:].reshape(-1), reduction="sum").item()
                n += w[:, 1:].numel()
    finally:
        model.train(was_training)
    return total, n


def _self_test():
    train, test = load_corpus()
    print("corpus: %d train / %d test characters, %d test windows"
          % (len(train), len(test), len(test_windows(test))))
    assert (len(train), len(test)) == (NUM_TRAIN_CHARS, NUM_TEST_CHARS)
    w = sample_windows(train, 8, 0, 1, 0)
    assert w.shape == (8, CONTEXT + 1) and torch.equal(w, sample_windows(train, 8, 0, 1, 0))
    assert not torch.equal(w, sample_windows(train, 8, 0, 1, 1))
    tw = test_windows(test)
    assert torch.equal(tw[1, 0], tw[0, -1])
    model = CharTransformer()
    params = list(model.parameters())
    count = sum(p.numel() for p in params)
    print("parameters: %d in %d tensors (expected %d in %d)"
          % (count, len(params), NUM_PARAMETERS, NUM_PARAMETER_TENSORS))
    assert count == NUM_PARAMETERS and len(params) == NUM_PARAMETER_TENSORS
    # Causality: changing a later character leaves earlier positions' logits unchanged.
    a = w[:2, :-1].clone()
    b = a.clone()
    b[:, 40] = (b[:, 40] + 1) % VOCAB
    with torch.no_grad():
        la, lb = model(a), model(b)
    assert torch.allclose(la[:, :40], lb[:, :40]) and not torch.allclose(la[:, 40:], lb[:, 40:])
    print("self-test OK (torch %s, numpy %s); uniform loss would be %.3f"
          % (torch.__version__, np.__version__, math.log(VOCAB)))
    return train, test


def _train(train, test, epochs):
    """Single process: AdamW lr 3e-3, batch 32 windows, WINDOWS_PER_EPOCH windows an epoch."""
    torch.manual_seed(0)
    model = CharTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    tw = test_windows(test)
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        ws = sample_windows(train, WINDOWS_PER_EPOCH, 0, epoch, 0)
        for i in range(0, len(ws), 32):
            loss = loss_of(model, ws[i:i + 32])
            opt.zero_grad()
            loss.backward()
            opt.step()
        total, n = evaluate(model, tw)
        print("epoch %d: train loss %.4f, test loss %.4f, %.1f s"
              % (epoch, loss.item(), total / n, time.perf_counter() - start), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    args = sys.argv[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0)
    data = _self_test()
    if args and args[0] == "--train":
        _train(*data, epochs=int(args[1]) if len(args) > 1 else 3)
