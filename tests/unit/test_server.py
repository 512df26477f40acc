"""The server's message handler, in one process. Bad messages (rejected, logged, harmless)
are in tests/reliability/test_messages.py."""
from __future__ import annotations

import pytest

from paramserver.protocol import Fail, Tag
from paramserver.server import ClientFailed


def test_fail_from_a_client_ends_the_job(served):
    with pytest.raises(ClientFailed, match="failed: boom"):
        served.transport.deliver(served, 1, Tag.FAIL, Fail("boom"))
