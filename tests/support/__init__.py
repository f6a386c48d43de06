"""What tests share, loaded as a pytest plugin (`pytest_plugins` in tests/conftest.py): the
fixtures (`fixtures`, `postgres`), and the one way to build a mesh of routers (`meshes`),
a clock tests move (`clock`), an event loop whose clock jumps to its next timer
(`virtualtime`), free loopback ports (`ports`), and waiting for a condition
with a timeout (`waits`), the CPU a guarded piece of work costs (`cost`), a mesh CA with
its certificates (`pki`), Ctrl-C for the commands a test starts (`ctrlc`). Test modules
import the helpers from here: ``from support import mesh, wait_for``."""

from .clock import Clock
from .cost import cpu_seconds
from .ctrlc import ctrl_c_reaches
from .meshes import (
    FAST,
    Collector,
    full,
    line,
    lo_discovery,
    mesh,
    neighbours,
    random_graph,
    ring,
    routing_by_interest,
    wait_shape,
)
from .ports import free_port_block, free_tcp_port, free_udp_port
from .virtualtime import VirtualTimeLoop, virtual_time
from .waits import next_event, next_turn, paced, patience, settle, wait_for, wait_until

__all__ = [
    "Clock",
    "Collector",
    "cpu_seconds",
    "ctrl_c_reaches",
    "FAST",
    "free_port_block",
    "free_tcp_port",
    "free_udp_port",
    "full",
    "line",
    "lo_discovery",
    "mesh",
    "neighbours",
    "next_event",
    "paced",
    "next_turn",
    "patience",
    "random_graph",
    "ring",
    "routing_by_interest",
    "VirtualTimeLoop",
    "virtual_time",
    "wait_for",
    "wait_shape",
    "settle",
    "wait_until",
]
