"""Fixtures and hooks only; the helpers the tests share are in ``tests/support/``."""

from __future__ import annotations

import shutil
import tempfile

import pytest


@pytest.fixture
def ray_tmp():
    """A private, short Ray temp folder (Ray's socket paths must stay under 107 bytes)."""
    path = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)
