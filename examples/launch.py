"""What the examples share: lowrank's import, the digits data and CNN, and how their worker
processes start (torchrun, or --spawn N here). Copy it with an example you take elsewhere (and set
DIGITS_PY to studies/train/digits.py of a checkout)."""
import importlib.util
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

try:
    import lowrank  # noqa: F401  (the examples import from it after this module)
except ImportError as e:
    raise SystemExit(f"{e}: install it (pip install .), or run in the checkout with PYTHONPATH=python "
                     "after scripts/build.sh")


def digits():
    """The checkout's studies/train/digits.py (data and CNN), loaded from its file (DIGITS_PY names
    another copy)."""
    spec = importlib.util.spec_from_file_location(
        "digits", os.environ.get("DIGITS_PY", os.path.join(HERE, "..", "studies", "train", "digits.py")))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def add_spawn_arg(ap):
    ap.add_argument("--spawn", type=int, metavar="N", help="start N worker processes on this host")


def spawn_or_check(ap, args, script):
    """With --spawn N: starts N copies of `script` (without --spawn) with torchrun's variables
    (MASTER_PORT from the environment, else torchrun's default 29500; lowrank's root takes port + 1)
    and exits with the worst exit code. Else exits with a hint where no launcher set
    torch.distributed's env:// variables (torch's own error would be a bare "environment variable
    RANK expected")."""
    if args.spawn is not None and args.spawn < 1:
        ap.error(f"--spawn N: N >= 1, got {args.spawn}")
    if args.spawn:
        argv = sys.argv[1:]
        i = next(i for i, a in enumerate(argv) if a.startswith("--spawn"))
        del argv[i:i + (1 if "=" in argv[i] else 2)]
        port = os.environ.get("MASTER_PORT", "29500")
        procs = [subprocess.Popen([sys.executable, script] + argv,
                                  env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.spawn),
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
                 for r in range(args.spawn)]
        sys.exit(max(abs(p.wait()) for p in procs))
    missing = [v for v in LAUNCHER_VARS if v not in os.environ]
    if missing:
        ap.error(f"{', '.join(missing)} not set: no launcher started this process. Run it with "
                 f"--spawn N (N processes on this host), under torchrun (torchrun --nproc_per_node "
                 f"N {sys.argv[0]}), or with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set in "
                 "each process")
