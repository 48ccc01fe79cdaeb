"""Host pytest plugin of the hardware stage: a UB host stands where the QEMU cluster would.

Loaded together with :mod:`obmm.testbed.suite.pytest_qemu` (``-p obmm.testbed.suite.pytest_qemu -p
obmm.testbed.hw.pytest_plugin``) by :mod:`obmm.testbed.hw.stage`, which passes the host in the
environment (``OBMM_HW_CONFIG_JSON``, ``OBMM_HW_HOST_INDEX``, ``OBMM_HW_RESULTS``,
``OBMM_HW_SHIP_DEPS_TAR``, ``OBMM_HW_RUN_ID``).  The ``*.guestsuite`` items then run on that host.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from obmm import envvars
from obmm.testbed.hw import stage as hwstage
from obmm.testbed.hw.config import HwConfig
from obmm.testbed.suite.pytest_qemu import SESSION_KEY


def pytest_configure(config: pytest.Config) -> None:
    text = envvars.HW_CONFIG_JSON.raw()
    if not text:
        raise pytest.UsageError(
            f"obmm.testbed.hw.pytest_plugin needs ${envvars.HW_CONFIG_JSON.name}: run it through "
            "`python -m obmm.testbed.hw.stage` (make hw-test)"
        )
    ship = envvars.HW_SHIP_DEPS_TAR.raw()
    session = hwstage.HwSession(
        HwConfig.from_json(text),
        envvars.HW_HOST_INDEX.get() or 0,
        results=Path(envvars.HW_RESULTS.raw() or "results/hw"),
        ship_tar=Path(ship) if ship else None,
        run_id=envvars.HW_RUN_ID.raw() or "",
    )
    # HwSession is a SuiteSession (obmm.testbed.suite.guest_suite), like the QEMU GuestSession.
    config.stash[SESSION_KEY] = session
