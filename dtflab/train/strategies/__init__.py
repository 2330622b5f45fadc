"""The training strategies: one module each, named like the function a user calls
(``train.pipeline`` is ``strategies/pipeline.py``). Each builds its step and hands it to the
run machinery (``train.machinery``); nothing is imported here, so loading one strategy loads
only what it needs."""
