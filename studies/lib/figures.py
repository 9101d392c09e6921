"""matplotlib for the studies' plot scripts, or a clear exit where it is missing."""
import sys


def pyplot(script):
    """matplotlib.pyplot on the Agg backend (files, no display). Exits naming `script` and how to
    install matplotlib when it is missing: a plot script has nothing to do without it."""
    try:
        import matplotlib
    except ImportError:
        sys.exit(f"{script} needs matplotlib: apt-get install python3-matplotlib, or pip install "
                 f"matplotlib in this Python ({sys.executable})")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
