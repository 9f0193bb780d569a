"""Metronome's release version, defined here alone.

``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``); ``metronome --version``,
``python -m runtime --version``, the ``node_started`` log line, ``/healthz`` and ``/readyz``
show it.
The image tag in ``deploy/k8s/*.yaml`` repeats it (``tests/test_version.py`` checks).
Releases follow semantic versioning; CHANGELOG.md lists what each one changed.
"""

__version__ = "0.2.0"
