"""The replicas behind one server address, and which of them takes the next request.

A Kubernetes Service balances connections, not requests: a client that keeps its connection keeps its
pod, and replicas sit idle while others queue. A model's headless Service (`<model>-pods`) resolves to
the address of each Ready pod instead. A client given such a name keeps a `ReplicaSet` of those
addresses, looks the name up again every `REFRESH_S`, and sends each request to the replica it expects
to answer first (`pick`). A replica that leaves the answer (its pod stops, or is no longer Ready) gets no
new request; what is in flight on it finishes.

The rule, pure and apart from the look-ups: each replica's cost is this client's estimate of its latency
(a moving average of its answers) times one more than the requests this client has in flight on it; the
cheapest takes the request, but for a few requests sent anywhere to keep every estimate current. A
replica not tried yet costs nothing, so a new pod is tried at once (and until it has answered
`TRIAL_ANSWERS` times); an
estimate fades by half every `FORGET_HALF_LIFE_S` the replica goes unused, so that a replica that was
slow once (it was queueing when tried) is tried again later instead of being avoided for good; and a
pod that joins makes the client forget every estimate, since what it measured before the pod came
(replicas queueing, as before a scale-up) no longer holds. Clients that share a pod see each other in
their latencies and move apart; a client alone on a pod stays.

A name that resolves to one address is used as it is (the connection is made to the name, as without
a ReplicaSet), and so is an address, and a TLS URL (its certificate names the host, not the pods).
"""

from __future__ import annotations

import ipaddress
import random
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

REFRESH_S = 2.0
"""How often the name is looked up again: a pod that becomes Ready is tried within this of the answer
listing it (plus the cluster DNS's own delay), and one that stops gets no new request after it."""
LATENCY_WEIGHT = 0.1
"""The weight of the newest answer in a replica's latency estimate: low enough that one slow answer
(the node was busy) does not move a client, high enough that a pod shared with another client (every
answer a request's time slower) does within a few requests."""
FORGET_HALF_LIFE_S = 60.0
"""An unused replica's estimate halves every this many seconds."""
EXPLORE_SHARE = 0.02
"""The share of requests sent to a replica by chance, so that every estimate is brought up to date now
and then (a pod that was slow for a while is found fast again)."""
TRIAL_ANSWERS = 3
"""Answers a replica gives before its estimate counts: until then it is tried as one never tried, so that
one slow answer (a model's first call, a busy node) does not keep a pod from being used."""
UNREACHABLE_HOLD_S = 5.0
"""A replica that refused a connection gets no request for this long, unless no other is left."""

Resolve = Callable[[str, int], list[str]]


@dataclass
class Replica:
    """One address of the name, and what this client knows of it."""

    host: str
    in_flight: int = 0
    latency_s: float | None = None
    """A moving average of its answers' latency; None until one came back."""
    samples: int = 0
    """The answers in `latency_s`: the fastest of the first TRIAL_ANSWERS (a slow one among them is a
    model's first call or a busy moment more often than the pod's pace), a moving average after."""
    connected: bool = False
    """Whether an answer came back at all: the first carries the set-up of the connection, and is left
    out of the estimate."""
    answered_at: float = 0.0
    unreachable_until: float = 0.0

    def answered(self, latency_s: float, now: float) -> None:
        if not self.connected:
            self.connected = True
            return
        if self.latency_s is None:
            self.latency_s = latency_s
        elif self.samples < TRIAL_ANSWERS:
            self.latency_s = min(self.latency_s, latency_s)
        else:
            self.latency_s = (1 - LATENCY_WEIGHT) * self.latency_s + LATENCY_WEIGHT * latency_s
        self.samples += 1
        self.answered_at = now

    def forget(self) -> None:
        self.latency_s, self.samples = None, 0

    @property
    def trusted(self) -> bool:
        """Whether its estimate counts: it has given TRIAL_ANSWERS answers since it was last forgotten."""
        return self.latency_s is not None and self.samples >= TRIAL_ANSWERS

    def cost(self, now: float, lowest_estimate: float) -> float:
        """The expected wait: the faded estimate times one more than the requests in flight. A replica
        still on trial counts the lowest estimate for each request in flight on it (nothing for the
        first)."""
        if not self.trusted:
            return lowest_estimate * self.in_flight
        faded = self.latency_s * 0.5 ** ((now - self.answered_at) / FORGET_HALF_LIFE_S)
        return faded * (self.in_flight + 1)


def pick(replicas: Sequence[Replica], now: float, rng: random.Random) -> Replica:
    """The replica that takes the next request: the cheapest among those not held as unreachable (all
    of them when every one is), fewer in flight and then chance breaking ties; or, for EXPLORE_SHARE of
    the requests, any of them."""
    reachable = [replica for replica in replicas if replica.unreachable_until <= now] or list(replicas)
    if rng.random() < EXPLORE_SHARE:
        return rng.choice(reachable)
    lowest = min((replica.latency_s for replica in reachable if replica.trusted), default=0.0)
    return min(reachable, key=lambda replica: (replica.cost(now, lowest), replica.in_flight, rng.random()))


def resolve_addresses(host: str, port: int) -> list[str]:
    """The addresses of `host`, of the family of its first answer, each once and in answer order."""
    answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family = answers[0][0]
    addresses = [str(answer[4][0]) for answer in answers if answer[0] == family]
    return list(dict.fromkeys(addresses))


def balanced_host(host: str, ssl: bool) -> bool:
    """Whether requests to `host` may be spread over its addresses: a name, not an address, without TLS."""
    if ssl:
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


class ReplicaSet:
    """The replicas behind one name, looked up again in the background every `REFRESH_S` while requests
    are sent. Thread-safe: every client of the name in a process shares one (`shared`), so that each
    sees the requests the others have in flight, the threads of a FuturesModelClient included."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        resolve: Resolve | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        """`resolve` looks the name up (`resolve_addresses` when None, read at each look-up)."""
        self.host = host
        self._port = port
        self._resolve = resolve
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._replicas: dict[str, Replica] = {}
        self._resolved_at: float | None = None
        self._refreshing = False
        self.changes = 0
        """How often the replicas changed: a client closes connections to departed ones only then."""

    @property
    def resolved(self) -> bool:
        return self._resolved_at is not None

    def members(self) -> list[Replica]:
        with self._lock:
            return list(self._replicas.values())

    def hosts(self) -> set[str]:
        """The hosts to keep connections to."""
        with self._lock:
            return set(self._replicas)

    def acquire(self) -> Replica:
        """The replica for the next request, counted in flight until `release`. The first call looks the
        name up before it answers; later ones start a look-up in the background when one is due."""
        self._refresh_when_due()
        with self._lock:
            replica = pick(list(self._replicas.values()), self._clock(), self._rng)
            replica.in_flight += 1
            return replica

    def any_host(self) -> str:
        """A host to ask what every replica answers alike (readiness, the model's configuration): a
        reachable one, by chance."""
        self._refresh_when_due()
        with self._lock:
            now = self._clock()
            members = list(self._replicas.values())
            reachable = [member for member in members if member.unreachable_until <= now] or members
            return self._rng.choice(reachable).host

    def _refresh_when_due(self) -> None:
        """The first look-up now; a later one in the background once `REFRESH_S` has passed."""
        if self._resolved_at is None:
            self.refresh()
        elif self._clock() - self._resolved_at >= REFRESH_S:
            self._refresh_in_background()

    def release(self, replica: Replica, *, latency_s: float | None = None, unreachable: bool = False) -> None:
        """A request on `replica` ended: answered after `latency_s`, or failed (no latency), or refused
        its connection (`unreachable`: held back for `UNREACHABLE_HOLD_S`)."""
        with self._lock:
            replica.in_flight -= 1
            now = self._clock()
            if unreachable:
                replica.unreachable_until = now + UNREACHABLE_HOLD_S
            if latency_s is not None:
                replica.answered(latency_s, now)

    def others_reachable(self, replica: Replica) -> bool:
        """Whether a request refused by `replica` may be sent to another one."""
        now = self._clock()
        with self._lock:
            return any(
                other is not replica and other.unreachable_until <= now for other in self._replicas.values()
            )

    def refresh(self) -> None:
        """Look the name up and keep what it answers: a new address joins (and every estimate is
        forgotten), a gone one leaves (requests in flight on it still end through `release`). A failed
        look-up keeps the replicas as they were; a name that resolves to one address, or never resolved,
        stands for itself."""
        try:
            addresses = (self._resolve or resolve_addresses)(self.host, self._port)
        except OSError:
            addresses = None
        with self._lock:
            self._resolved_at = self._clock()
            self._refreshing = False
            if addresses is None and self._replicas:
                return
            hosts = addresses if addresses and len(addresses) > 1 else [self.host]
            if self._replicas and not set(hosts) <= self._replicas.keys():
                for replica in self._replicas.values():
                    replica.forget()
            if set(hosts) != self._replicas.keys():
                self.changes += 1
            self._replicas = {host: self._replicas.get(host) or Replica(host) for host in hosts}

    def _refresh_in_background(self) -> None:
        with self._lock:
            if self._refreshing:
                return
            self._refreshing = True
        threading.Thread(target=self.refresh, name=f"resolve-{self.host}", daemon=True).start()


_SHARED: weakref.WeakValueDictionary[tuple[str, int], ReplicaSet] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def shared(host: str, port: int) -> ReplicaSet:
    """The process's ReplicaSet for `host` and `port`, kept while a client holds it."""
    with _SHARED_LOCK:
        replicas = _SHARED.get((host, port))
        if replicas is None:
            replicas = _SHARED[(host, port)] = ReplicaSet(host, port)
        return replicas
