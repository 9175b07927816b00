"""pyproject.toml's build backend: setuptools' own, writing its intermediate files outside the sources.

setuptools builds a wheel (``pip wheel .``, ``pip install .``, ``pip install -e .``) through ``build/`` and
``vitlarge.egg-info/`` beside the sources and leaves both there. Each hook here runs setuptools' with a build base
and an egg-info folder in a temporary folder, removed afterwards, set through distutils' extra configuration file
(``DIST_EXTRA_CONFIG``, setuptools >= 65.5): the checkout stays as it was. An in-tree backend that re-exports
``setuptools.build_meta`` is setuptools' documented way to adjust it ("Dynamic build dependencies and other
build_meta tweaks"); building an sdist is setuptools' own, unchanged.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 (the hooks this module does not wrap: setuptools')


@contextlib.contextmanager
def _outside_the_sources() -> Iterator[None]:
    with tempfile.TemporaryDirectory(prefix="vitlarge-build-") as tmp:
        extra = os.path.join(tmp, "setup.cfg")
        with open(extra, "w") as f:
            f.write(f"[build]\nbuild_base = {os.path.join(tmp, 'build')}\n[egg_info]\negg_base = {tmp}\n")
        before = os.environ.get("DIST_EXTRA_CONFIG")
        os.environ["DIST_EXTRA_CONFIG"] = extra
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("DIST_EXTRA_CONFIG", None)
            else:
                os.environ["DIST_EXTRA_CONFIG"] = before


def get_requires_for_build_wheel(config_settings=None):
    with _outside_the_sources():
        return _setuptools.get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    with _outside_the_sources():
        return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with _outside_the_sources():
        return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings=None):
    with _outside_the_sources():
        return _setuptools.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    with _outside_the_sources():
        return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    with _outside_the_sources():
        return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
