"""The links a simulated transfer crosses: each client's, its region's (a link its group of
clients shares, such as a site's uplink), and the servers'. Settings: `sim_client_links`,
`sim_regions` with `sim_region_bandwidth` and `sim_region_latency`, `sim_server_bandwidth`
(docs/simulator.md, "Links").

Contention. Each link has two directions (full duplex, as Ethernet and InfiniBand are),
each a resource busy while it carries bytes. A transfer takes, on every bandwidth-limited
link of its path at once, the earliest stretch at or after it is ready in which all of
them are free (a booked stretch is never moved), holds them for its bytes over the
slowest of them, and arrives after that plus the sum of the links' latencies (latency is
distance: it delays a transfer but occupies no link). Two transfers through one link so
take turns; TCP would share the link between them instead, which ends the pair at the
same time and the first of them later, so the turns keep the link's throughput and the
order of completions; what the model leaves out is a flow's ramp-up. A message without
a payload (a pull, a stop) carries headers only: its latency, never a wait.

Defaults keep the one-number model: a client's link carries its sends at `sim_bandwidth`
after `sim_latency`, and what the server sends is charged to the server (`SimTiming.served`)
as before, so with no setting given every time is the old `latency + bytes / bandwidth`.
With several servers each has its own link carrying its slice, and the simulated server,
standing for all of them, books one link with the slice's bytes.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from runconfig.links import parse_links, parse_regions
from runconfig.settings import ConfigError, RunConfig

UP, DOWN = 0, 1  # toward the server, toward the client
KEEP = 32  # stretches booked, a link on average, between two prunings of the clock's past


@dataclass
class Link:
    """One link: bytes/s each way (0: unlimited, never busy; `down` None: the same as
    `up`) and its latency. Its booked stretches, one list each way, sorted and apart."""

    up: float
    latency: float = 0.0
    down: float | None = None
    booked: tuple[list[tuple[float, float]], list[tuple[float, float]]] = field(default_factory=lambda: ([], []))

    def rate(self, way: int) -> float:
        return self.up if way == UP or self.down is None else self.down

    def next_free(self, way: int, start: float, length: float) -> float:
        """The earliest time from `start` with this way free for `length` after it."""
        stretches = self.booked[way]
        at = bisect_right(stretches, (start, float("inf"))) - 1
        at = max(at, 0)
        for begin, end in stretches[at:]:
            if end <= start:
                continue
            if begin >= start + length:
                break
            start = end
        return start

    def book(self, way: int, start: float, end: float) -> None:
        stretches = self.booked[way]
        stretches.insert(bisect_right(stretches, (start, end)), (start, end))

    def forget(self, before: float) -> None:
        """Drop stretches over before `before`: no transfer is ready before the clock."""
        for stretches in self.booked:
            keep = next((k for k, (_, end) in enumerate(stretches) if end > before), len(stretches))
            del stretches[:keep]


class Links:
    """Every client's path to the servers; `send` and `receive` book a transfer on it."""

    def __init__(self, clients: list[Link], regions: dict[int, Link], server: Link, servers: int):
        self.clients, self.regions, self.server, self.servers = clients, regions, server, servers
        self.all = [*clients, *{id(r): r for r in regions.values()}.values(), server]
        self.bookings = 0  # stretches booked since the last `forget` pruned

    @classmethod
    def for_run(cls, cfg: RunConfig, bandwidth: float, latency: float, clients: int) -> Links:
        """From the run's settings; `bandwidth` and `latency`: the run's one-number link."""
        given = parse_links(cfg.sim_client_links) if cfg.sim_client_links else []
        if len(given) not in (0, 1, clients):
            raise ConfigError(f"sim_client_links: lists {len(given)} links for {clients} clients (give one for all "
                              "or one for each)")
        links = [Link(*given[i if len(given) > 1 else 0]) for i in range(clients)] if given \
            else cls.uniform(bandwidth, latency, clients).clients
        regions: dict[int, Link] = {}
        for group in parse_regions(cfg.sim_regions) if cfg.sim_regions else []:
            if max(group) >= clients:
                raise ConfigError(f"sim_regions: names client {max(group)}, but the run has {clients} (0..{clients - 1})")
            region = Link(cfg.sim_region_bandwidth, cfg.sim_region_latency)
            regions.update(dict.fromkeys(group, region))
        return cls(links, regions, Link(cfg.sim_server_bandwidth), cfg.servers)

    @classmethod
    def uniform(cls, bandwidth: float, latency: float, clients: int) -> Links:
        """The one-number model: a client's link carries its sends at `bandwidth`; what the
        server sends is charged to the server (SimTiming.served), so it is unlimited here."""
        return cls([Link(bandwidth, latency, down=0.0) for _ in range(clients)], {}, Link(0.0), 1)

    def add(self, like: int) -> None:
        """A joiner's path, next in line: a link like client `like`'s, in its region."""
        model = self.clients[like]
        self.clients.append(Link(model.up, model.latency, model.down))
        self.all.append(self.clients[-1])
        if like in self.regions:
            self.regions[len(self.clients) - 1] = self.regions[like]

    def send(self, client: int, nbytes: float, ready: float) -> float:
        """Client `client` sends `nbytes` to the servers from `ready`: when they have it."""
        return self._cross(UP, client, nbytes, ready)

    def receive(self, client: int, nbytes: float, ready: float) -> float:
        """The servers send `nbytes` (all slices) to client `client` from `ready`: when it has them."""
        return self._cross(DOWN, client, nbytes, ready)

    def forget(self, before: float) -> None:
        """Drop what no transfer can meet any more, once the links took a few stretches
        each since the last time: pruning every link at every event cost the soak test two
        thirds of its time, and `next_free` bisects past old stretches anyway."""
        if self.bookings < KEEP * len(self.all):
            return
        self.bookings = 0
        for link in self.all:
            link.forget(before)

    def _cross(self, way: int, client: int, nbytes: float, ready: float) -> float:
        path = [(self.clients[client], nbytes), (self.server, nbytes / self.servers)]
        if client in self.regions:
            path.insert(1, (self.regions[client], nbytes))
        latency = sum(link.latency for link, _ in path)
        limited = [(link, nbytes / link.rate(way)) for link, nbytes in path if link.rate(way) > 0]
        if not nbytes or not limited:
            return ready + latency
        length = max(seconds for _, seconds in limited)
        start = ready
        while True:  # until one start suits every link: a move for one may collide on another
            moved = max(link.next_free(way, start, length) for link, _ in limited)
            if moved == start:
                break
            start = moved
        for link, _ in limited:
            link.book(way, start, start + length)
        self.bookings += len(limited)
        return start + (latency + length)
