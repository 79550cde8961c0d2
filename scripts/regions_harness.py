"""Several regions on this machine, for `make demo REGIONS=3` (scripts/regions-demo.py)
and `make bench-regions` (bench/regions.py): per region a Redis and the shim's binary
(`--region NAME`), and for each ordered pair of regions a delay proxy
(bench/delay_proxy.rs) through which one region's shim reaches the other's Redis
(`--peer-region NAME=redis://127.0.0.1:<proxy port>`), adding a one-way delay each way.
A partition kills the proxies to and from a region; healing starts them again on the
same ports. The layout of redis-shim/tests/support/regions.rs, from Python's standard
library only.

Every process is started here from the main thread and stopped by its pid when the
`Regions` ends (a `with` block), at exit, on SIGTERM/SIGINT/SIGHUP, and by the kernel
should this process die without cleaning up (PR_SET_PDEATHSIG). Everything listens on
127.0.0.1.
"""

import ctypes
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from regions_client import ADMIN_TOKEN, get
from resp import RespClient

ROOT = Path(__file__).resolve().parent.parent
SHIM_BIN = Path(os.environ.get("SHIM_BIN", ROOT / "target" / "shim" / "redis-shim"))
PROXY_SOURCE = ROOT / "bench" / "delay_proxy.rs"
PROXY_BIN = ROOT / "target" / "delay-proxy" / "delay-proxy"
NAMES = ("a", "b", "c", "d", "e")
# The shim's own Redis: a loaded 2-core machine running 3 Redis, 3 shims and 6 proxies
# beside the client can stall a reply past the default 50 ms; a timeout there would be
# this machine's noise, not the rung's behaviour. The peer flags keep their defaults.
SHIM_FLAGS = ("--redis-timeout-ms", "1000", "--shutdown-timeout-ms", "1000", "--admin-token", ADMIN_TOKEN)


def fail(message):
    raise SystemExit(f"regions: {message}")


# --------------------------------------------------------------------------- processes

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Processes:
    """The children started here, each stopped by its own pid."""

    def __init__(self):
        self.children = []
        self.lock = threading.Lock()

    def start(self, args, log, env=None):
        if threading.current_thread() is not threading.main_thread():
            # PR_SET_PDEATHSIG fires when the thread that forked ends, not the process.
            raise RuntimeError("children are started from the main thread")
        out = open(log, "ab")
        child = subprocess.Popen([str(arg) for arg in args], stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                 preexec_fn=_die_with_parent)
        out.close()
        with self.lock:
            self.children.append(child)
        return child

    def stop(self, child, grace=5.0):
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        with self.lock:
            if child in self.children:
                self.children.remove(child)

    def stop_all(self):
        with self.lock:
            children = list(reversed(self.children))
        for child in children:
            if child.poll() is None:
                child.terminate()
        deadline = time.time() + 5
        for child in children:
            try:
                child.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        with self.lock:
            self.children.clear()


_handed_out = set()


def free_port():
    """A port nothing listens on, never the same twice in this process."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def wait_until(what, predicate, timeout, process=None, log=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process is not None and process.poll() is not None:
            fail(f"{what} exited (status {process.returncode}); see {log}")
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.02)
    fail(f"{what} not ready after {timeout} s; see {log}")


def accepts(port):
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def build_proxy():
    """bench/delay_proxy.rs with plain rustc, once (again when the source is newer)."""
    if PROXY_BIN.exists() and PROXY_BIN.stat().st_mtime >= PROXY_SOURCE.stat().st_mtime:
        return PROXY_BIN
    PROXY_BIN.parent.mkdir(parents=True, exist_ok=True)
    built = subprocess.run(["rustc", "--edition", "2021", "-O", "-o", str(PROXY_BIN), str(PROXY_SOURCE)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        fail(f"bench/delay_proxy.rs does not build:\n{built.stderr}")
    return PROXY_BIN


# --------------------------------------------------------------------------- Redis

# Commands this harness sends itself, left out of the calls counted.
_OURS = {"info", "ping", "flushall", "config", "client", "hello"}


class Redis:
    def __init__(self, procs, run_dir, name):
        self.port = free_port()
        self.log = run_dir / f"redis-{name}.log"
        self.process = procs.start(["redis-server", "--port", self.port, "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "no", "--dir", run_dir], self.log)
        wait_until(f"Redis of region {name}", lambda: self._ping(), 10, self.process, self.log)
        self.client = RespClient(self.port, timeout=5)

    def _ping(self):
        client = RespClient(self.port, timeout=5)
        try:
            return client.call("PING") == "PONG"
        finally:
            client.close()

    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def work(self):
        """Counters so far: `cpu` (seconds, user + system), `calls` (commands, scripts'
        own commands included, not counting this harness's), and per command `usec:NAME`
        (microseconds executing it, as INFO commandstats says)."""
        cpu = self.client.call("INFO", "cpu")
        user = float(re.search(r"used_cpu_user:([\d.]+)", cpu).group(1))
        system = float(re.search(r"used_cpu_sys:([\d.]+)", cpu).group(1))
        counters = {"cpu": user + system, "calls": 0}
        stats = self.client.call("INFO", "commandstats")
        for m in re.finditer(r"cmdstat_([^:]+):calls=(\d+),usec=(\d+)", stats):
            name = m.group(1).split("|")[0]
            if name not in _OURS:
                counters["calls"] += int(m.group(2))
                counters[f"usec:{name}"] = counters.get(f"usec:{name}", 0) + int(m.group(3))
        return counters


# --------------------------------------------------------------------------- regions

class Link:
    """One direction's link to a region's Redis: a delay proxy on a port of its own."""

    def __init__(self, procs, run_dir, upstream, delay_us, name):
        self.procs, self.upstream, self.delay_us = procs, upstream, delay_us
        self.port = free_port()
        self.log = run_dir / f"proxy-{name}.log"
        self.process = None
        self.heal()

    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def cut(self):
        """Kills the proxy: its connections reset, new ones are refused."""
        if self.process is not None:
            self.process.kill()
            self.procs.stop(self.process)
            self.process = None

    def heal(self):
        """Starts the proxy on its port again, once it accepts."""
        if self.process is not None:
            return
        self.process = self.procs.start([build_proxy(), f"127.0.0.1:{self.port}", f"127.0.0.1:{self.upstream}",
                                         self.delay_us], self.log)
        wait_until("a delay proxy", lambda: accepts(self.port), 10, self.process, self.log)


class Region:
    def __init__(self, name, redis):
        self.name, self.redis = name, redis
        self.links = {}  # peer name -> Link to that peer's Redis
        self.shim = None
        self.port = None
        self.log = None


class Regions:
    """`count` regions named a, b, c, ... whose links delay each byte by `delay_us` one
    way (0: the proxy without delay). A context manager: everything stops at its end."""

    def __init__(self, count, delay_us, run_dir, extra_flags=()):
        if not 2 <= count <= len(NAMES):
            fail(f"between 2 and {len(NAMES)} regions, not {count}")
        if not SHIM_BIN.exists():
            fail(f"no shim at {SHIM_BIN}: run `make shim`")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.delay_us = delay_us
        self.extra_flags = list(extra_flags)
        self.procs = Processes()
        _register(self)
        try:
            build_proxy()
            self.regions = [Region(NAMES[i], Redis(self.procs, self.run_dir, NAMES[i])) for i in range(count)]
            for region in self.regions:
                for peer in self.regions:
                    if peer is not region:
                        region.links[peer.name] = Link(self.procs, self.run_dir, peer.redis.port, delay_us,
                                                       f"{region.name}-to-{peer.name}")
            for region in self.regions:
                self._start_shim(region)
        except BaseException:
            self.stop()
            raise

    def _start_shim(self, region):
        region.log = self.run_dir / f"shim-{region.name}.log"
        region.log.write_text("")
        args = [SHIM_BIN, "--listen", "127.0.0.1:0", "--redis-url", region.redis.url(), *SHIM_FLAGS,
                "--region", region.name]
        for peer, link in region.links.items():
            args += ["--peer-region", f"{peer}={link.url()}"]
        args += self.extra_flags
        region.shim = self.procs.start(args, region.log, env=dict(os.environ, RUST_LOG="info"))

        def listening():
            for line in region.log.read_text(errors="replace").splitlines():
                if "redis-shim listening" in line:
                    m = re.search(r'listen(?:=|":")127\.0\.0\.1:(\d+)', line)
                    if m:
                        region.port = int(m.group(1))
                        return True
            return False

        wait_until(f"the shim of region {region.name}", listening, 15, region.shim, region.log)
        wait_until(f"the shim of region {region.name} ready", lambda: get(region.port, "/readyz")[0] == 200, 15,
                   region.shim, region.log)

    def __len__(self):
        return len(self.regions)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def port(self, index):
        return self.regions[index].port

    def cut_off(self, index):
        """Cuts every link to and from region `index`."""
        for link in self._links_of(index):
            link.cut()

    def heal(self, index):
        for link in self._links_of(index):
            link.heal()

    def _links_of(self, index):
        name = self.regions[index].name
        for region in self.regions:
            for peer, link in region.links.items():
                if region.name == name or peer == name:
                    yield link

    def work(self):
        """Every region's Redis: its `Redis.work` counters summed."""
        total = {}
        for region in self.regions:
            for name, value in region.redis.work().items():
                total[name] = total.get(name, 0) + value
        return total

    def stop(self):
        for region in getattr(self, "regions", []):
            try:
                region.redis.client.close()
            except (OSError, AttributeError):
                pass
        self.procs.stop_all()
        _live.discard(self)


_live = set()
_handlers_installed = False


def _stop_everything(*_):
    for regions in list(_live):
        regions.stop()


def _on_signal(number, _frame):
    # The client threads still running fail once their shims are gone: no tracebacks.
    threading.excepthook = lambda _args: None
    _stop_everything()
    raise SystemExit(128 + number)


def _register(regions):
    global _handlers_installed
    _live.add(regions)
    if not _handlers_installed:
        import atexit
        atexit.register(_stop_everything)
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, _on_signal)
        _handlers_installed = True


# The shim's API, for the scripts that import this module alone.
from regions_client import *  # noqa: E402,F401,F403
