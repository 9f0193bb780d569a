"""Tools for operators: the ``metronome`` console script and the Python client that signs
each API request.

What it may import is checked: the contracts in ``pyproject.toml`` (``[tool.importlinter]``,
run by ``lint-imports``).
"""
