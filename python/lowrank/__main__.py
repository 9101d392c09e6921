"""Prints what this lowrank install found, to paste into a bug report: the package imported and
the library it loaded, UCX, the CUDA backend and driver, NCCL, torch and the LOWRANK_* variables
set. Exits 0, or 1 when lowrank's own library could not be loaded (the report is printed all the
same). With --shim-path: prints the path of the LD_PRELOAD shim instead, as in
  LD_PRELOAD=$(python -m lowrank --shim-path) torchrun ..."""
import argparse
import sys

from . import _paths, _report


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m lowrank", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim-path", action="store_true",
                    help="print the path of liblowrank_nccl.so (exit 1 if this install has none)")
    args = ap.parse_args(argv)
    if args.shim_path:
        path = _paths.shim_path()
        if not path:
            import os
            import lowrank
            source_copy = _paths.unbuilt_source_copy()
            print("lowrank: no liblowrank_nccl.so: " + source_copy if source_copy else
                  "lowrank: no liblowrank_nccl.so in the package imported "
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
