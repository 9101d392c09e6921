"""python -m lowrank [--shim-path]: the environment report (lowrank/_report.py; exit 1 when lowrank's
library could not be loaded), or the path of the LD_PRELOAD shim:
LD_PRELOAD=$(python -m lowrank --shim-path) torchrun ..."""
import argparse
import sys

from . import _paths, _report


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m lowrank", description=__doc__.splitlines()[0])
    ap.add_argument("--shim-path", action="store_true",
                    help="print the path of liblowrank_nccl.so (exit 1 if this install has none)")
    args = ap.parse_args(argv)
    if args.shim_path:
        path = _paths.shim_path()
        if not path:
            import os
            import lowrank
            print("lowrank: no liblowrank_nccl.so in the package imported "
                  f"({os.path.dirname(lowrank.__file__)}: none in lowrank/lib) nor in a build of its "
                  "checkout (built where nccl.h was not found, or with -Dnccl_shim=disabled?)",
                  file=sys.stderr)
            return 1
        print(path)
        return 0
    lines, loaded = _report.report_status()
    print("\n".join(lines))
    if not loaded:  # the report is for bug reports; a script checking an install needs the status
        print("lowrank: the library could not be loaded (see \"lowrank: failed\" above)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
