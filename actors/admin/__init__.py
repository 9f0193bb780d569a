"""Tools for operators: the ``metronome`` console script and the Python client that signs
each API request.

May import: ``actors.api`` (signing), ``actors.store`` (migrations), ``actors.domain``.
"""
