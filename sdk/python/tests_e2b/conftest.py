"""The official E2B SDK against a Warren daemon's E2B door.

test/e2e/e2b_test.go starts a private daemon with --e2b-addr and runs this
suite with E2B_API_URL and E2B_SANDBOX_URL pointing at it, E2B_API_KEY one
of its keys and WARREN_E2B_TEMPLATE the Warren image to create from.
"""

import os

import pytest
from e2b import Sandbox


@pytest.fixture(scope="session")
def template():
    t = os.environ.get("WARREN_E2B_TEMPLATE")
    if not t:
        pytest.fail("WARREN_E2B_TEMPLATE is not set: run through test/e2e (TestE2BSDK)")
    return t


@pytest.fixture
def sbx(template):
    s = Sandbox.create(template, timeout=300, metadata={"suite": "e2b-sdk"})
    yield s
    s.kill()
