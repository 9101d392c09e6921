"""Gradient sets for the benchmarks: layer shapes of known models, synthetic gradients with a decaying
spectrum, and safetensors files (one per worker) that lowrank_allreduce_perf --gradients reads.

Used by studies/compare_pytorch/run.py and studies/netns/bench.sh; runnable on its own:
  /usr/bin/python3 studies/lib/gradsets.py SET OUTDIR [WORKERS]     SET: resnet50 | gpt2 | gpt2-blocks
writes OUTDIR/synth_worker<i>.safetensors (i < WORKERS, default 4).

Synthetic gradients, per tensor viewed as (shape[0], prod(shape[1:])) = n x m, worker i:
  G_i = s * (A + B_i + N_i)
  A   = sum_{j=1..r} (1/j) u_j v_j^T, r = min(n, m, 32), u, v Gaussian with unit expected norm,
        the same on every worker (the signal the workers agree on: a 1/j decaying spectrum);
  B_i = 0.5 * sum_{j=1..8} (1/j) u'_j v'_j^T, bases drawn per worker (what each worker sees alone);
  N_i = Gaussian noise of norm 0.1 * ||A|| (per worker);
  s   a per-tensor scale, log-uniform in [1e-4, 1e-2] per element (the same on every worker).
1-D tensors: s * (a + 0.5 b_i), a shared and b_i per worker, Gaussian.
Plain Gaussian gradients would give relerr near 1 for any rank k and show nothing: this spectrum
leaves a best rank-4 error of about 0.4 of the mean, like the real digits_cnn gradients (0.40).
"""
import json
import os
import struct
import sys

import numpy as np


def resnet50_shapes():
    """torchvision's resnet50 parameters in order: conv weights (no bias), BatchNorm weight and bias,
    fc weight and bias. 25,557,032 parameters."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    cin = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        cout = width * 4
        for b in range(blocks):
            shapes += [(width, cin, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (cout, width, 1, 1), (cout,), (cout,)]
            if b == 0:  # the projection shortcut
                shapes += [(cout, cin, 1, 1), (cout,), (cout,)]
            cin = cout
    shapes += [(1000, 2048), (1000,)]
    return shapes


def gpt2_block_shapes(d=768):
    """One GPT-2 transformer block, Hugging Face's layout (Conv1D weights are (in, out))."""
    return [(d,), (d,),                      # ln_1
            (d, 3 * d), (3 * d,),            # attn.c_attn
            (d, d), (d,),                    # attn.c_proj
            (d,), (d,),                      # ln_2
            (d, 4 * d), (4 * d,),            # mlp.c_fc
            (4 * d, d), (d,)]                # mlp.c_proj


def gpt2_shapes():
    """GPT-2 small: token and position embeddings, 12 blocks, final LayerNorm. 124,439,808 parameters
    (the LM head is tied to the token embedding)."""
    shapes = [(50257, 768), (1024, 768)]
    for _ in range(12):
        shapes += gpt2_block_shapes()
    return shapes + [(768,), (768,)]


def gpt2_blocks_shapes():
    """GPT-2 small without its embeddings (38.6 M): the 12 blocks and the final LayerNorm, 85.1 M."""
    return gpt2_shapes()[2:]


SETS = {"resnet50": resnet50_shapes, "gpt2": gpt2_shapes, "gpt2-blocks": gpt2_blocks_shapes}


def _lowrank(rng, n, m, r, weight):
    u = rng.standard_normal((n, r), dtype=np.float32) / np.float32(np.sqrt(n))
    v = rng.standard_normal((r, m), dtype=np.float32) / np.float32(np.sqrt(m))
    s = (weight / np.arange(1, r + 1, dtype=np.float32)).astype(np.float32)
    return (u * s) @ v


def synthetic(shapes, workers, seed=0):
    """Yields, per tensor, a list of `workers` float32 arrays (one per worker)."""
    for t, shape in enumerate(shapes):
        shared = np.random.default_rng([seed, t, 1 << 20])
        scale = np.float32(10.0 ** shared.uniform(-4, -2))
        if len(shape) < 2:
            a = shared.standard_normal(shape, dtype=np.float32)
            out = []
            for w in range(workers):
                rw = np.random.default_rng([seed, t, w])
                out.append(scale * (a + 0.5 * rw.standard_normal(shape, dtype=np.float32)))
            yield out
            continue
        n = shape[0]
        m = int(np.prod(shape[1:]))
        a = _lowrank(shared, n, m, min(n, m, 32), 1.0)
        noise_sd = np.float32(0.1 * np.linalg.norm(a) / np.sqrt(n * m))
        out = []
        for w in range(workers):
            rw = np.random.default_rng([seed, t, w])
            g = a + _lowrank(rw, n, m, min(n, m, 8), 0.5)
            g += noise_sd * rw.standard_normal((n, m), dtype=np.float32)
            g *= scale / np.float32(np.sqrt(np.mean(g * g)) + 1e-30)
            out.append(g.reshape(shape))
        yield out


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, float32 array). Little-endian F32, data in the order given."""
    header, off = {}, 0
    for name, a in tensors:
        nbytes = a.size * 4
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, a in tensors:
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
    os.replace(tmp, path)


def read_safetensors(path):
    """Returns [(name, float32 array)] in data-offset order (as lowrank_allreduce_perf reads them)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    items = sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                   key=lambda kv: kv[1]["data_offsets"][0])
    out = []
    for name, v in items:
        if v["dtype"] != "F32":
            raise ValueError(f"{path}: {name}: dtype {v['dtype']}, only F32 here")
        b, e = v["data_offsets"]
        out.append((name, np.frombuffer(data, dtype="<f4", count=(e - b) // 4, offset=b)
                    .reshape(v["shape"]).astype(np.float32)))
    return out


def make_set(name, outdir, workers=4, seed=0):
    """Writes outdir/synth_worker<i>.safetensors unless they already exist for this (name, seed,
    workers); returns the step prefix ("synth")."""
    os.makedirs(outdir, exist_ok=True)
    stamp = os.path.join(outdir, "STAMP")
    want = f"{name} seed={seed} workers={workers} spectrum=1/j-v1"
    if os.path.exists(stamp) and open(stamp).read().strip() == want:
        return "synth"
    shapes = SETS[name]()
    per_worker = [[] for _ in range(workers)]
    for t, arrays in enumerate(synthetic(shapes, workers, seed)):
        for w in range(workers):
            per_worker[w].append((f"t{t:03d}", arrays[w]))
    for w in range(workers):
        write_safetensors(os.path.join(outdir, f"synth_worker{w}.safetensors"), per_worker[w],
                          {"set": name, "worker": w, "seed": seed,
                           "data": "synthetic, 1/j decaying spectrum (studies/lib/gradsets.py)"})
    with open(stamp, "w") as f:
        f.write(want + "\n")
    return "synth"


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in SETS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(SETS)} OUTDIR [WORKERS]")
    make_set(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 4)
    print(f"{sys.argv[2]}: {sum(int(np.prod(s)) for s in SETS[sys.argv[1]]())} parameters")
