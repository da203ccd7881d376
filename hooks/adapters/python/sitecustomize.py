"""dpshim's entry into a Python rank process (see shim/start/python.c).

The shim put this directory first on PYTHONPATH. Here we put the user's PYTHONPATH back, take
this directory off sys.path, run the sitecustomize that would have run without us, and arrange
for the PyTorch adapter to load when (and only when) the script imports torch.
"""

import os
import sys


def _restore_environment(here):
    saved = os.environ.pop("DPSHIM_PYTHONPATH", None)
    if saved is not None:
        if saved.startswith("set:"):
            os.environ["PYTHONPATH"] = saved[4:]
        else:
            os.environ.pop("PYTHONPATH", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


def _chain_sitecustomize():
    """Runs the next sitecustomize on sys.path, as Python would have without us."""
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # as site.py does: report and go on
        print("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s" % (type(e).__name__, e),
              file=sys.stderr)


def _main():
    here = os.path.dirname(os.path.abspath(__file__))
    _restore_environment(here)
    sys.path.append(here)  # last: the adapter package only, never shadowing the user's modules
    try:
        import dpshim_pytorch
        dpshim_pytorch.install_import_hook()
    finally:
        sys.path.remove(here)
    _chain_sitecustomize()


_main()
