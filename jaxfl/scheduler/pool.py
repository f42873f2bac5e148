"""A fixed number of clients in flight, a new one sampled when one returns (plain Python + numpy).

FedBuff's and FedAsync's papers run millions of clients with a few hundred to a thousand training
at once: the server keeps ``concurrency`` clients in flight and, whenever one reports, samples a
replacement uniformly from the clients that are idle (the one that just reported included).
:class:`IdlePool` does that in O(1) per draw, whatever the number of clients, so a 10^6-client
timeline costs no more per event than a 10-client one.

>>> pool = IdlePool(num_clients=5, seed=0)
>>> first = [pool.take() for _ in range(3)]
>>> len(set(first)), pool.idle
(3, 2)
>>> pool.give_back(first[0]); pool.idle
3
"""
from __future__ import annotations

import array

import numpy as np

from jaxfl.scheduler.simulation import local_steps_of

SELECTION_STREAM = 0x5E1EC7  # SeedSequence([seed, SELECTION_STREAM, salt]) draws the clients
# Uniforms drawn per call to the generator: Generator.random(n) yields exactly the next n values
# that n calls of random() would, at a fraction of the per-call cost.
UNIFORM_BLOCK = 256
DEFAULT_CONCURRENCY = 1000  # FedBuff's paper: 1,000 clients in flight (of millions)


def default_concurrency(num_clients: int, requested: int | None = None) -> int:
    """Clients in flight for an asynchronous run: ``requested``, else ``min(num_clients, 1000)``.

    At up to 1,000 clients every client is in flight (each re-dispatched as it reports, as the
    FedCompass authors' framework does); beyond, the FedBuff paper's 1,000.

    >>> default_concurrency(10), default_concurrency(10**6), default_concurrency(10**6, 100)
    (10, 1000, 100)
    """
    if requested is not None:
        if not 1 <= requested <= num_clients:
            raise ValueError(f"concurrency={requested} is not allowed: between 1 and the number of "
                             f"clients ({num_clients})")
        return int(requested)
    return min(num_clients, DEFAULT_CONCURRENCY)


class IdlePool:
    """The idle clients, from which :meth:`take` draws uniformly without replacement.

    The pool is an array of client ids whose first ``idle`` entries are idle, with each client's
    position in it, so taking (swap with the last idle entry) and giving back are O(1).
    Draws come from ``SeedSequence([seed, SELECTION_STREAM, salt])`` only. Both arrays are
    ``array.array`` of int64: as compact as numpy's, and a tenth of its cost per scalar access.

    >>> pool = IdlePool(3, seed=1)
    >>> sorted(pool.take() for _ in range(3)), pool.idle
    ([0, 1, 2], 0)
    """

    def __init__(self, num_clients: int, seed: int, salt: int = 0):
        if num_clients < 1:
            raise ValueError(f"num_clients={num_clients} is not allowed: at least 1")
        self.clients = _int64_range(num_clients)
        self.position = self.clients[:]  # a copy: one range built, not two (tens of ms at 10^6 clients)
        self.idle = num_clients
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, SELECTION_STREAM, salt]))
        self._uniforms: list[float] = []  # drawn ahead from _rng, used from the end

    def take(self) -> int:
        """Draw one idle client uniformly and mark it busy."""
        if self.idle == 0:
            raise ValueError("no idle client to take: every client is in flight")
        uniforms = self._uniforms
        if not uniforms:
            uniforms[:] = self._rng.random(UNIFORM_BLOCK).tolist()[::-1]
        # random() * n rather than integers(n): a tenth of the cost per scalar draw, with a bias
        # below 2^-40 at a million clients.
        index = int(uniforms.pop() * self.idle)
        clients, position = self.clients, self.position
        last = self.idle - 1
        client = clients[index]
        moved = clients[last]
        clients[index], clients[last] = moved, client
        position[moved], position[client] = index, last
        self.idle = last
        return client

    def give_back(self, client: int) -> None:
        """Mark a busy client idle again."""
        clients, position, idle = self.clients, self.position, self.idle
        at = position[client]
        if at < idle:
            raise ValueError(f"client {client} is already idle")
        first_busy = clients[idle]
        clients[at], clients[idle] = first_busy, client
        position[first_busy], position[client] = at, idle
        self.idle = idle + 1

    def exchange(self, client: int) -> int:
        """:meth:`give_back` ``client``, then :meth:`take` one (the same draw), in one call.

        >>> pool = IdlePool(3, seed=0)
        >>> busy = pool.take()
        >>> pool.exchange(busy) in (0, 1, 2), pool.idle
        (True, 2)
        """
        self.give_back(client)
        return self.take()

    def __setstate__(self, state: dict) -> None:
        """Pools pickled before the arrays were ``array.array`` (numpy) and before the drawn-ahead
        uniforms existed restore into the current layout, drawing on from their generator's state."""
        state.setdefault("_uniforms", [])
        for name in ("clients", "position"):
            if isinstance(state[name], np.ndarray):
                state[name] = array.array("q", state[name].astype(np.int64).tobytes())
        self.__dict__.update(state)


def _int64_range(size: int) -> array.array:
    """``array.array('q', range(size))``, built through numpy (ten times faster at 10^6)."""
    values = array.array("q")
    values.frombytes(memoryview(np.arange(size, dtype=np.int64)).cast("B"))  # no intermediate bytes
    return values


class InFlightLimit:
    """Mixin for an asynchronous policy: ``concurrency`` clients in flight, a replacement drawn
    from the idle ones each time a client is answered (FedBuff, Nguyen et al. 2022, §3; FedAsync).

    With ``concurrency`` equal to the number of clients every client trains from the start and is
    re-dispatched itself when answered, with no draw at all. The policy sets ``concurrency``,
    ``seed`` and ``local_steps``, calls :meth:`start_in_flight` from ``start`` and
    ``sim.reply(client)`` when it answers a client.

    A client that crashes (faults) is replaced at once by one drawn from the idle clients
    (:meth:`on_crash`), so ``concurrency`` clients stay in flight while any client is idle; the
    crashed client is never given back to the pool, so it is never drawn again.
    """

    concurrency: int | None = None
    seed: int = 0
    pool: IdlePool | None = None

    def start_in_flight(self, sim) -> None:
        self.concurrency = default_concurrency(sim.num_clients, self.concurrency)
        if self.concurrency >= sim.num_clients:
            for client in range(sim.num_clients):
                sim.dispatch(client, local_steps_of(self.local_steps, client))
            return
        self.pool = IdlePool(sim.num_clients, self.seed)
        for _ in range(self.concurrency):
            client = self.pool.take()
            sim.dispatch(client, local_steps_of(self.local_steps, client))

    def on_reply(self, sim, client: int, payload) -> None:
        if self.pool is not None:
            client = self.pool.exchange(client)
        sim.dispatch(client, local_steps_of(self.local_steps, client))

    def on_crash(self, sim, record) -> None:
        """Refill the crashed client's slot with a client drawn from the idle ones (none: every
        client is in flight or crashed, and the run goes on with fewer). The crashed client stays
        out of the pool: busy in its books for good, it is never drawn again. Without a pool (every
        client in flight from the start) no client is idle and nothing is dispatched.

        >>> from types import SimpleNamespace
        >>> policy = InFlightLimit()
        >>> policy.local_steps, policy.pool = 5, IdlePool(3, seed=0)
        >>> crashed = policy.pool.take()
        >>> sent = []
        >>> policy.on_crash(SimpleNamespace(dispatch=lambda client, steps: sent.append(client)), None)
        >>> sent[0] != crashed, policy.pool.idle
        (True, 1)
        """
        pool = self.pool
        if pool is None or pool.idle == 0:
            return
        client = pool.take()
        sim.dispatch(client, local_steps_of(self.local_steps, client))


class IdleClients:
    """The idle clients of ``range(num_clients)`` in id order, with the k-th one found in O(log n).

    FedASMU and PORT draw replacements as ``rng.choice(sorted(idle), count, replace=False)``: an
    index into the sorted idle clients. A Fenwick tree of idle counts (one per client) answers
    "which client is the k-th idle one" and marks a client busy or idle in O(log n), so a draw no
    longer sorts and scans every idle client, and :meth:`sample` makes the very same random draws.
    Both columns are ``array.array`` with one entry per client, which checkpoints store outside
    state.pkl, only the entries that changed since the last one.

    >>> idle = IdleClients(6)
    >>> idle.remove(1); idle.remove(4)
    >>> len(idle), idle.in_order(), idle.nth(1), 4 in idle
    (4, [0, 2, 3, 5], 2, False)
    >>> rng, same = np.random.default_rng(0), np.random.default_rng(0)
    >>> idle.sample(rng, 2) == sorted(int(c) for c in same.choice([0, 2, 3, 5], size=2, replace=False))
    True
    """

    def __init__(self, num_clients: int, busy=()):
        if num_clients < 1:
            raise ValueError(f"num_clients={num_clients} is not allowed: at least 1")
        self.num_clients = num_clients
        member = np.ones(num_clients, np.int8)
        busy = np.asarray(list(busy), np.int64)
        member[busy] = 0
        # entry i (1-based) of a Fenwick tree holds the idle count of clients (i - lowbit(i), i]:
        # lowbit(i) itself when every client is idle (a run's start, a tenth of the general build)
        one_based = np.arange(1, num_clients + 1, dtype=np.int64)
        counts = one_based & -one_based
        if len(busy):
            before = np.concatenate([[0], np.cumsum(member, dtype=np.int64)])
            counts = before[one_based] - before[one_based - counts]
        self._tree = array.array("q")
        self._tree.frombytes(memoryview(counts).cast("B"))
        self._idle = array.array("b")
        self._idle.frombytes(memoryview(member).cast("B"))
        self._size = int(member.sum(dtype=np.int64))
        self._top = 1 << (num_clients.bit_length() - 1)  # the largest power of two <= num_clients

    def __len__(self) -> int:
        return self._size

    def __contains__(self, client: int) -> bool:
        return bool(self._idle[client])

    def add(self, client: int) -> None:
        """Mark a busy client idle."""
        if self._idle[client]:
            raise ValueError(f"client {client} is already idle")
        self._idle[client] = 1
        self._size += 1
        self._count(client, 1)

    def remove(self, client: int) -> None:
        """Mark an idle client busy."""
        if not self._idle[client]:
            raise ValueError(f"client {client} is not idle")
        self._idle[client] = 0
        self._size -= 1
        self._count(client, -1)

    def _count(self, client: int, change: int) -> None:
        tree, index, size = self._tree, client + 1, self.num_clients
        while index <= size:
            tree[index - 1] += change
            index += index & -index

    def nth(self, k: int) -> int:
        """The idle client with k idle clients of smaller id (0-based rank in id order)."""
        if not 0 <= k < self._size:
            raise IndexError(f"idle client {k} of {self._size}")
        tree, size, position, step = self._tree, self.num_clients, 0, self._top
        while step:  # descend: the longest prefix of clients holding at most k idle ones
            ahead = position + step
            if ahead <= size:
                count = tree[ahead - 1]
                if count <= k:
                    position = ahead
                    k -= count
            step >>= 1
        return position

    def in_order(self) -> list[int]:
        """Every idle client, in id order: by rank (log n each) when few are idle, else by one pass
        over the flags (n), whichever is cheaper."""
        if self._size * self.num_clients.bit_length() < self.num_clients:
            return [self.nth(k) for k in range(self._size)]
        return np.flatnonzero(np.frombuffer(self._idle, np.int8)).tolist()

    def sample(self, rng: np.random.Generator, count: int) -> list[int]:
        """``count`` idle clients drawn uniformly without replacement, in id order: the draws and the
        clients of ``rng.choice(sorted(idle), size=count, replace=False)`` (an integer population makes
        the same draws as a list of that length; its indices map to clients in the same order)."""
        ranks = rng.choice(self._size, size=count, replace=False)
        return [self.nth(int(k)) for k in sorted(ranks)]
