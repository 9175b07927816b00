"""The end-to-end tier's session: the forkserver of `tests.helpers.forked` starts (and preloads) before the first
test, so its start-up is not charged to whichever test forks first (its timeout, its --durations line), and every
forked rank still running when the session ends is killed."""

import pytest

from tests.helpers import forked


@pytest.fixture(scope="session", autouse=True)
def forkserver():
    forked.context()
    yield
    forked.kill_live()
