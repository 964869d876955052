"""Listening sockets from /proc/net/tcp{,6}: the parser on captured text, the readers on real sockets."""

from __future__ import annotations

import os
import socket

from ansible_collections.gpuops.repurpose.plugins.module_utils._node.info import port_facts
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    Listener,
    parse_systemd_unit,
    parse_tcp_listeners,
    read_systemd_unit,
    read_tcp_listeners,
    socket_owners,
)

# captured from a node: a LISTEN socket on 127.0.0.1:31000, one on 0.0.0.0:22, an ESTABLISHED one (01)
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7918 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 51234 1 0 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1462 1 0 100 0 0 10 0
   2: 0100007F:7918 0100007F:A2C4 01 00000000:00000000 00:00000000 00000000     0        0 51240 1 0 20 4 30 10 -1
"""
# ::1 port 30000, and :: port 8080
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:7530 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0 100 0 0 10 0
   1: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 778 1 0 100 0 0 10 0
"""


def test_listen_sockets_are_parsed_with_readable_addresses():
    assert parse_tcp_listeners(TCP) == [Listener("127.0.0.1", 31000, 51234), Listener("0.0.0.0", 22, 1462)]
    assert parse_tcp_listeners(TCP6) == [Listener("::1", 30000, 777), Listener("::", 8080, 778)]


def test_the_systemd_unit_comes_from_the_cgroup_path():
    assert parse_systemd_unit("0::/system.slice/system-sglang\\x2ddatagen\\x2dworker.slice/"
                              "sglang-datagen-worker@3.service\n") == "sglang-datagen-worker@3.service"
    assert parse_systemd_unit("0::/user.slice/user-0.slice/session-4.scope\n") == "session-4.scope"
    assert parse_systemd_unit("0::/\n") == ""
    assert parse_systemd_unit("12:pids:/lxc/200/system.slice/ssh.service\n1:name=systemd:/\n") == "ssh.service"


def test_a_real_listener_is_found_with_this_process_as_its_owner():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        found = [item for item in read_tcp_listeners() if item.port == port]
        assert [(item.address, item.port) for item in found] == [("127.0.0.1", port)]
        assert socket_owners([found[0].inode]) == {found[0].inode: [os.getpid()]}
        facts = port_facts([port])
        assert facts == [{"address": "127.0.0.1", "port": port, "pids": [os.getpid()],
                          "commands": [open("/proc/self/comm").read().strip()],
                          "units": [read_systemd_unit(os.getpid())]}]
    # closed: nothing listens there any more
    assert port_facts([port]) == []
