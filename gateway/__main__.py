"""``python -m gateway``: the console script's other name. It runs the shell (``app``) by name, so
the core's import graph never reaches the shell (the one line below is not an import)."""

import runpy

runpy.run_module("app", run_name="__main__", alter_sys=True)
