"""Test helpers: a stand-in for DDP's GradBucket, and the compression rule of lowrank.h written
out independently of lowrank (the tests' oracle)."""


class SyntheticBucket:
    """What a DDP comm hook uses of a GradBucket: a flat buffer and views of it as gradients."""

    def __init__(self, index, buffer, shapes, last=True):
        self._index, self._buffer, self._last = index, buffer, last
        self._grads, off = [], 0
        for s in shapes:
            n = 1
            for d in s:
                n *= d
            self._grads.append(buffer[off:off + n].view(s))
            off += n

    def index(self):
        return self._index

    def buffer(self):
        return self._buffer

    def set_buffer(self, t):
        self._buffer.copy_(t)

    def gradients(self):
        return self._grads

    def parameters(self):
        return self._grads

    def is_last(self):
        return self._last


def compressible(shape, k, rate=2.0):
    """lowrank.h's rule: >= 2 dims, viewed as (shape[0], prod(rest)), (n + m) k' rate < n m
    with k' = min(k, n, m)."""
    if len(shape) < 2:
        return False
    n = shape[0]
    m = 1
    for d in shape[1:]:
        m *= d
    kk = min(k, n, m)
    return (n + m) * kk * rate < n * m
