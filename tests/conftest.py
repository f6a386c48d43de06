"""Shared fixtures. Every router binds 127.0.0.1:0; discovery never leaves loopback."""

from __future__ import annotations

import os

# Before anything imports aa: discovery stays on loopback in every test (the rule).
os.environ["AA_DISCOVERY_INTERFACES"] = "lo"


from support import free_udp_port

# ... and on a beacon port of this test run's own: the `aa router` processes tests start find
# each other as they should, never a router someone runs on this machine (`make run`).
os.environ["AA_DISCOVERY_PORT"] = str(free_udp_port())


# The shared fixtures (a router, clients, a PostgreSQL server): tests/support/.
pytest_plugins = ["support.fixtures", "support.postgres"]

# In CI the property tests explore the same examples on every run (a new failing example is
# a finding for a developer's run, not a reason for a submission to flake).
if os.environ.get("CI"):
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None)
    settings.load_profile("ci")
