"""Metronome's release version, defined here alone.

``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``); ``metronome --version``,
``python -m runtime --version``, the ``node_started`` log line and ``/healthz`` show it.
Releases follow semantic versioning; CHANGELOG.md lists what each one changed.
"""

__version__ = "0.2.0"
