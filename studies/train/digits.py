"""scikit-learn's handwritten digits (perf/data/digits/) and the small CNN of perf/data/README.md.

Stdlib + numpy + torch only (torch 1.13 or 2.x); importable, or copy this one file elsewhere and pass
load_digits(path=...). Self-test, and with --train a short single-process training run:
  /usr/bin/python3 -m studies.train.digits [--train [EPOCHS]]
"""
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "perf",
                            "data", "digits", "digits.csv.gz")
NUM_IMAGES = 1797
NUM_PARAMETERS = 767818
NUM_PARAMETER_TENSORS = 18


def load_digits(path=None):
    """Read digits.csv.gz (rows of 64 pixels 0..16, then the label 0..9).

    Returns (images, labels): images float32 (1797, 1, 16, 16) in [0, 1], each 8x8 image upsampled
    to 16x16 by nearest neighbour (every pixel becomes a 2x2 block); labels int64 (1797,).
    path defaults to the checkout's perf/data/digits/digits.csv.gz."""
    if path is None:
        path = os.path.normpath(DEFAULT_PATH)
        if not os.path.exists(path):
            raise FileNotFoundError("%s not found: this module was copied out of the repository; "
                                    "pass load_digits(path=...) to digits.csv.gz" % path)
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
    if table.shape[1] != 65:
        raise ValueError("%s: %d columns per row, expected 65 (64 pixels and a label)"
                         % (path, table.shape[1]))
    images = (table[:, :64].astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    images = np.ascontiguousarray(images.repeat(2, axis=2).repeat(2, axis=3))
    labels = np.ascontiguousarray(table[:, 64])
    return images, labels


def train_test_split(images, labels, test_fraction=0.2, seed=0):
    """Fixed split: a permutation from np.random.default_rng(seed); its first
    round(n * test_fraction) indices are the test set. Returns (xtr, ytr, xte, yte), same dtypes and
    trailing shapes as the inputs (1438 train and 359 test images with the defaults)."""
    n = len(images)
    if len(labels) != n:
        raise ValueError("%d images but %d labels" % (n, len(labels)))
    perm = np.random.default_rng(seed).permutation(n)
    ntest = int(round(n * test_fraction))
    te, tr = perm[:ntest], perm[ntest:]
    return images[tr], labels[tr], images[te], labels[te]


def shard(x, y, rank, world):
    """This worker's shard: every world-th sample from rank on (x[rank::world], y[rank::world]);
    the shards of ranks 0..world-1 are disjoint and cover all samples."""
    if not 0 <= rank < world:
        raise ValueError("rank %d outside 0..%d" % (rank, world - 1))
    return x[rank::world], y[rank::world]


class DigitsCNN(nn.Module):
    """Input float32 (N, 1, 16, 16), output logits (N, 10).

    conv3x3 1->32, BN, ReLU; conv3x3 32->64, BN, ReLU; maxpool 2 (16x16 -> 8x8);
    conv3x3 64->128, BN, ReLU; conv3x3 128->128, ReLU; maxpool 2 (8x8 -> 4x4);
    flatten 128*4*4 = 2048; linear 2048->256, ReLU; linear 256->10.
    767,818 parameters in 18 tensors, named as in perf/data/digits_cnn/*.safetensors
    (c1..c4, b1..b3, f1, f2)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 3, padding=1)
        self.b1 = nn.BatchNorm2d(32)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.b2 = nn.BatchNorm2d(64)
        self.c3 = nn.Conv2d(64, 128, 3, padding=1)
        self.b3 = nn.BatchNorm2d(128)
        self.c4 = nn.Conv2d(128, 128, 3, padding=1)
        self.f1 = nn.Linear(128 * 4 * 4, 256)
        self.f2 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.relu(self.b1(self.c1(x)))
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        x = F.relu(self.b3(self.c3(x)))
        x = F.max_pool2d(F.relu(self.c4(x)), 2)
        x = F.relu(self.f1(torch.flatten(x, 1)))
        return self.f2(x)


def _as_tensor(a, device):
    if isinstance(a, np.ndarray):
        a = torch.from_numpy(a)
    return a.to(device)


def evaluate(model, x, y, batch=512):
    """Mean cross-entropy and accuracy of model on x (float32 (N, 1, 16, 16)) and y (int64 (N,)),
    numpy arrays or tensors, in eval mode without gradients, in batches on the model's device.
    Returns (loss, accuracy) as Python floats; the model's train/eval mode is restored after."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total_loss, correct, n = 0.0, 0, len(y)
    try:
        with torch.no_grad():
            for i in range(0, n, batch):
                xb = _as_tensor(x[i:i + batch], device)
                yb = _as_tensor(y[i:i + batch], device)
                logits = model(xb)
                total_loss += F.cross_entropy(logits, yb, reduction="sum").item()
                correct += (logits.argmax(1) == yb).sum().item()
    finally:
        model.train(was_training)
    return total_loss / n, correct / n


def _self_test():
    model = DigitsCNN()
    params = list(model.parameters())
    count = sum(p.numel() for p in params)
    print("parameters: %d in %d tensors (expected %d in %d)"
          % (count, len(params), NUM_PARAMETERS, NUM_PARAMETER_TENSORS))
    assert count == NUM_PARAMETERS and len(params) == NUM_PARAMETER_TENSORS
    images, labels = load_digits()
    assert images.shape == (NUM_IMAGES, 1, 16, 16) and images.dtype == np.float32
    assert labels.shape == (NUM_IMAGES,) and labels.dtype == np.int64
    assert images.min() == 0.0 and images.max() == 1.0 and set(labels.tolist()) == set(range(10))
    assert np.array_equal(images[:, :, ::2, ::2], images[:, :, 1::2, 1::2])
    xtr, ytr, xte, yte = train_test_split(images, labels)
    assert len(xtr) + len(xte) == NUM_IMAGES
    xtr2, _, _, _ = train_test_split(images, labels)
    assert np.array_equal(xtr, xtr2)
    parts = [shard(xtr, ytr, r, 4) for r in range(4)]
    assert sum(len(p[1]) for p in parts) == len(ytr)
    out = model(torch.from_numpy(xte[:5]))
    assert out.shape == (5, 10)
    print("data: images %s %s, labels %s %s; split %d train / %d test; shards of 4: %s"
          % (images.shape, images.dtype, labels.shape, labels.dtype, len(ytr), len(yte),
             [len(p[1]) for p in parts]))
    print("self-test OK (torch %s, numpy %s)" % (torch.__version__, np.__version__))
    return xtr, ytr, xte, yte


def _train(xtr, ytr, xte, yte, epochs):
    """Single process: SGD lr 0.05 momentum 0.9, batch 32, reshuffled each epoch, CPU."""
    torch.manual_seed(0)
    model = DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(1)
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
    start = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        order = torch.from_numpy(rng.permutation(len(yt)))
        for i in range(0, len(order), 32):
            idx = order[i:i + 32]
            loss = F.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        loss, acc = evaluate(model, xte, yte)
        print("epoch %d: test loss %.4f, test accuracy %.4f (%d/%d), %.1f s"
              % (epoch + 1, loss, acc, round(acc * len(yte)), len(yte), time.perf_counter() - start))
    return acc


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0)
    data = _self_test()
    if args and args[0] == "--train":
        _train(*data, epochs=int(args[1]) if len(args) > 1 else 3)
