"""The shim's API as the regions' scripts use it (scripts/regions_harness.py re-exports
it): checks and their bodies, fresh keys, a keep-alive client, a burst at every region
at once, and the wait until every region sees every region's spending, read with
`counters show`'s admin endpoint, which charges nothing.
"""

import http.client
import json
import os
import socket
import threading
import time

HOUR_MS = 3_600_000
# Every region's shim takes it (scripts/regions_harness.py), so that `converge` reads a
# counter without charging it.
ADMIN_TOKEN = "regions-admin"


def check(key, rung, limit=100, period_ms=HOUR_MS, cost=1):
    """One fixed-window check of `key` counted as the rung says."""
    entry = {"key": key, "algorithm": "fixed_window", "limit": limit, "period_ms": period_ms, "regions": rung}
    if cost != 1:
        entry["cost"] = cost
    return entry


def body(*checks):
    return json.dumps({"checks": list(checks)})


_fresh = [0]


def fresh_key(name):
    """A key no earlier check of this run (or earlier run on the same Redis) used."""
    _fresh[0] += 1
    return f"{name}:{{{os.getpid()}-{int(time.time() * 1000)}-{_fresh[0]}}}"


class Client:
    """One keep-alive HTTP/1.1 connection to a shim."""

    def __init__(self, port, timeout=10):
        self.port, self.timeout = port, timeout
        self.connection = None

    def connect(self):
        if self.connection is None:
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            self.connection.connect()
            self.connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, path, data, headers=None):
        """(status, the answer parsed, or None when it is not JSON). A kept-alive
        connection the shim closed while idle is opened again once, the request not sent."""
        headers = {"content-type": "application/json", **(headers or {})}
        while True:
            reused = self.connection is not None
            self.connect()
            try:
                self.connection.request("POST", path, data, headers)
                response = self.connection.getresponse()
                raw = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if not reused:
                    raise
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, None

    def decide(self, data):
        """(admitted, remaining, status) of a one-check request."""
        status, answer = self.post("/v1/check", data)
        if status != 200 or not answer:
            return False, None, status
        return bool(answer.get("allowed")), answer["results"][0].get("remaining"), status

    def show(self, data):
        """`remaining` of a one-check request's counter, read without charging it (the
        admin endpoint `redis-shim counters show` calls), or None."""
        status, answer = self.post("/v1/admin/counters/show", data, {"x-ratelimit-token": ADMIN_TOKEN})
        if status != 200 or not answer:
            return None
        return answer["results"][0].get("remaining")

    def close(self):
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def get(port, path):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


def burst(regions, data, per_region):
    """`per_region` checks at every region at once, each on a connection of its own,
    released together: (admitted, answers that were not 200)."""
    clients = [Client(regions.port(index)) for index in range(len(regions)) for _ in range(per_region)]
    for client in clients:
        client.connect()
    start = threading.Barrier(len(clients))
    admitted = failed = 0
    lock = threading.Lock()

    def one(client):
        nonlocal admitted, failed
        start.wait()
        try:
            ok, _, status = client.decide(data)
        except OSError:
            ok, status = False, None
        with lock:
            admitted += ok
            failed += status != 200
        client.close()

    threads = [threading.Thread(target=one, args=(client,), daemon=True) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return admitted, failed


def converge(regions, key, rung, limit, spent, within, clients=None):
    """Seconds until every region reports `remaining` within 1 of `limit - spent`
    (None if not within `within` seconds), and the last `remaining` each reported."""
    expected = max(0, limit - spent)
    clients = clients or [Client(regions.port(i)) for i in range(len(regions))]
    data = body(check(key, rung, limit))
    started = time.perf_counter()
    seen = [None] * len(regions)
    while True:
        for index, client in enumerate(clients):
            try:
                seen[index] = client.show(data)
            except OSError:
                client.close()
                seen[index] = None
        if all(r is not None and abs(r - expected) <= 1 for r in seen):
            return time.perf_counter() - started, seen
        if time.perf_counter() - started > within:
            return None, seen
        time.sleep(0.005)
