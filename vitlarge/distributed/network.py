"""Which network interface the process group uses (``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``).

On a node with several interfaces the one that routes to the rendezvous host (and, under Slurm, to
the job's other nodes) is chosen, unless the user set the variables.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import Mapping, MutableMapping

from vitlarge.distributed.launcher import DistEnv, slurm_hosts
from vitlarge.errors import UserError

SOCKET_IFNAME_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def _interface_of(local: str) -> str:
    """The name of the interface that holds the address ``local`` (IPv4 or IPv6); "" if none does."""
    ip = ipaddress.ip_address(local.split("%")[0])
    if ip.version == 6:
        try:  # /proc/net/if_inet6: address (32 hex digits), index, prefix, scope, flags, name
            with open("/proc/net/if_inet6") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) >= 6 and ipaddress.ip_address(int(fields[0], 16)) == ip:
                        return fields[5]
        except OSError:
            pass
        return "lo" if ip.is_loopback else ""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's IPv4 address
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(raw[20:24]) == local:
                return name
    return "lo" if ip.is_loopback else ""


def route_interface(host: str, port: int) -> tuple[str, str]:
    """The network interface (name, this node's address on it) through which this node reaches ``host``,
    as this node resolves the name (IPv4 or IPv6: ``AF_UNSPEC``). A UDP ``connect`` picks the route and
    sends nothing. Raises ``OSError`` when the name does not resolve or no route leads there."""
    family, _, _, _, addr = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        local = s.getsockname()[0]
    return _interface_of(local), local


def _is_loopback(local: str) -> bool:
    return ipaddress.ip_address(local.split("%")[0]).is_loopback


def _step_nodes(env: Mapping[str, str]) -> int:
    for key in ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return 1


def choose_interface(dist_env: DistEnv, env: Mapping[str, str]) -> tuple[str, str]:
    """(interface for gloo, why) for a Slurm task; ("", reason) to leave gloo's default.

    The interface that routes to the master as this node resolves its name. When that is loopback
    (Debian/Ubuntu's ``127.0.1.1 <hostname>`` line on the master's own node) and the step spans several
    nodes, gloo there would listen where no other node reaches it: the route to another host of the step
    is taken instead; if there is none, a ``UserError`` names the /etc/hosts entry. A name that does not
    resolve or route leaves the choice to gloo (TCPStore then reports the real problem)."""
    where = socket.gethostname()
    try:
        name, local = route_interface(dist_env.master_addr, dist_env.master_port)
    except OSError as e:
        return "", f"cannot resolve or route to the master {dist_env.master_addr} from {where} ({e})"
    if not _is_loopback(local) or _step_nodes(env) <= 1:
        return name, f"routes to the master {dist_env.master_addr}"
    me = {env.get("SLURMD_NODENAME", ""), where, where.split(".")[0]}
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    for host in (h for h in (slurm_hosts(nodelist) if nodelist else []) if h not in me):
        try:
            other, mine = route_interface(host, dist_env.master_port)
        except OSError:
            continue
        if other and not _is_loopback(mine):
            return other, f"routes to {host} (the master {dist_env.master_addr} resolves to loopback here)"
    resolved = socket.getaddrinfo(dist_env.master_addr, dist_env.master_port, socket.AF_UNSPEC, socket.SOCK_DGRAM)[0][
        4
    ][0]
    raise UserError(
        f"on {where} the master {dist_env.master_addr} resolves to the loopback address {resolved} (an /etc/hosts "
        f"entry such as '127.0.1.1 {dist_env.master_addr}'), and no other node of the step routes elsewhere: the "
        "other nodes could not reach gloo here; fix that /etc/hosts entry or set GLOO_SOCKET_IFNAME to the "
        "interface the nodes share",
        same_on_all_ranks=False,
    )


def bind_interface(dist_env: DistEnv, env: MutableMapping[str, str] | None = None) -> str:
    """Under Slurm (world > 1), points gloo at ``choose_interface`` unless the user set
    ``GLOO_SOCKET_IFNAME``; returns the interface gloo will use ("" when left to gloo, with a warning if
    no route was found). Without it gloo binds to the address this node's hostname resolves to, which on
    many clusters (and in network namespaces) is loopback or a network the other nodes cannot reach.

    ``NCCL_SOCKET_IFNAME`` is left to NCCL: NCCL already skips
    ``lo`` and ``docker*`` and prefers ``ib*``; forcing the interface that routes to the master would move
    its bootstrap and socket fallback onto a management network on IB + Ethernet nodes, and a bare name
    is a prefix to NCCL (``eth0`` also matches ``eth0.100``). Users set it themselves (``=ib0``: exact)."""
    env = os.environ if env is None else env
    if dist_env.source != "slurm" or dist_env.world_size == 1 or env.get("GLOO_SOCKET_IFNAME"):
        return env.get("GLOO_SOCKET_IFNAME", "")
    name, why = choose_interface(dist_env, env)
    if name:
        env["GLOO_SOCKET_IFNAME"] = name
    else:
        logging.getLogger("vitlarge").warning(
            f"{why}: gloo's interface left to its default; set GLOO_SOCKET_IFNAME if the rendezvous fails"
        )
    return name
