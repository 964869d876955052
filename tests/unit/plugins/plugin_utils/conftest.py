"""Throwaway sshd servers for the session tests (tests/support/sshd.py), one per configuration, per session."""

from __future__ import annotations

import typing as t

import pytest

from tests.support.sshd import Sshd, sshd_usable, start_sshd, stop_sshd


def _server(tmp_path_factory, name: str, **options) -> t.Iterator[Sshd]:
    if not sshd_usable():
        pytest.skip("needs root and OpenSSH's sshd for a throwaway server")
    server = start_sshd(str(tmp_path_factory.mktemp(name)), **options)
    yield server
    stop_sshd(server)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory) -> t.Iterator[Sshd]:
    yield from _server(tmp_path_factory, "sshd", sftp=True)


@pytest.fixture(scope="session")
def sshd_nosftp(tmp_path_factory) -> t.Iterator[Sshd]:
    yield from _server(tmp_path_factory, "sshd_nosftp", sftp=False)


@pytest.fixture(scope="session")
def sshd_two_sessions(tmp_path_factory) -> t.Iterator[Sshd]:
    """An sshd that allows only two sessions per connection (MaxSessions 2)."""
    yield from _server(tmp_path_factory, "sshd_two", sftp=True, max_sessions=2)
