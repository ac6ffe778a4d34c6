"""redis-server for the tests: started on a free loopback port (never a
fixed one), in a directory of its own, stopped at the end.

`KVPAGE_TEST_BACKEND=redis` makes kvpserver.launch run every server of the
integration suite on one session-wide Redis (each server under a key prefix
of its own, so tests do not see each other's state).
"""
import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid

BACKEND = os.environ.get("KVPAGE_TEST_BACKEND", "local")
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def _die_with_parent():
    """preexec_fn: the redis-server gets SIGKILL when the test process dies,
    however it dies (PR_SET_PDEATHSIG), so that none is left behind. The
    signal comes when the *thread* that started it ends: start redis-servers
    from a thread that outlives them (the test's own)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port():
    """A loopback port nothing listens on now (the kernel's pick for port 0);
    kvpserver's servers use it too."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port, timeout=0.5):
    """True when a Redis on port answers PING (a raw RESP exchange: no
    client library needed)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class Redis:
    """One redis-server. args: extra configuration, e.g.
    ["--appendonly", "yes", "--appendfsync", "always"]."""

    def __init__(self, args=(), directory=None, die_with_parent=True):
        self.args = list(args)
        self.die_with_parent = die_with_parent
        self.dir = directory or tempfile.mkdtemp(prefix="kvpage-redis-")
        self._own_dir = directory is None
        self.proc = None
        self.port = None
        self.log = os.path.join(self.dir, "redis.log")

    def start(self, port=None, tries=5):
        """Starts it (on port, or a free one) and waits until it answers."""
        for _ in range(tries if port is None else 1):
            p = port or free_port()
            cmd = [REDIS_SERVER, "--port", str(p), "--bind", "127.0.0.1", "--save", "",
                   "--dir", self.dir, "--logfile", self.log, "--daemonize", "no",
                   "--protected-mode", "no"] + self.args
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent if self.die_with_parent else None)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.proc.poll() is None:
                if _ping(p):
                    self.port = p
                    return self
                time.sleep(0.02)
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
        raise RuntimeError(f"redis-server did not start; its log:\n{self.tail()}")

    def url(self, prefix=None, db=0):
        q = f"?prefix={prefix}" if prefix else ""
        return f"redis://127.0.0.1:{self.port}/{db}{q}"

    def cli(self, *args):
        """redis-cli against it; its output as text."""
        r = subprocess.run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(self.port)] + list(args),
                           capture_output=True, text=True, timeout=30)
        if r.returncode:
            raise RuntimeError(f"redis-cli {' '.join(args)}: {r.stderr or r.stdout}")
        return r.stdout.strip()

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self):
        self.stop(signal.SIGKILL)

    def restart(self):
        """Stops it and starts it again on the same port (and directory)."""
        self.stop()
        self.start(self.port)

    def close(self):
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def tail(self, limit=4000):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-limit:]
        except OSError:
            return ""


_SESSION = None


def session_redis():
    """The Redis shared by every server of a KVPAGE_TEST_BACKEND=redis run."""
    global _SESSION
    if _SESSION is None:
        # Maybe first asked for from a test's worker thread, which ends
        # long before the session: stopped at exit instead.
        _SESSION = Redis(die_with_parent=threading.current_thread() is threading.main_thread())
        _SESSION.start()
        atexit.register(_SESSION.close)
    return _SESSION


def fresh_location():
    """A location on the session's Redis that no server has used."""
    return session_redis().url(prefix="t" + uuid.uuid4().hex[:16])


class Cluster:
    """A Redis Cluster of `masters` masters, each with `replicas` replicas,
    on free loopback ports, created with redis-cli --cluster create.
    node_timeout (ms): how long a master may be unreachable before its
    replica takes over."""

    def __init__(self, masters=3, replicas=0, node_timeout=15000):
        self.dir = tempfile.mkdtemp(prefix="kvpage-redis-cluster-")
        self.replicas = replicas
        self.nodes = []
        for i in range(masters * (1 + replicas)):
            d = os.path.join(self.dir, f"n{i}")
            os.makedirs(d)
            self.nodes.append(Redis(["--cluster-enabled", "yes", "--cluster-config-file",
                                     os.path.join(d, "nodes.conf"), "--appendonly", "no",
                                     "--cluster-node-timeout", str(node_timeout)], d))

    def start(self):
        for n in self.nodes:
            n.start()
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run([REDIS_CLI, "--cluster", "create"] + addrs +
                       ["--cluster-replicas", str(self.replicas), "--cluster-yes"],
                       capture_output=True, text=True, timeout=60, check=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in n.cli("cluster", "info") for n in self.nodes):
                return self
            time.sleep(0.1)
        raise RuntimeError("the cluster did not reach cluster_state:ok")

    def masters(self):
        """The nodes that are masters now (ROLE)."""
        return [n for n in self.nodes if n.proc.poll() is None
                and n.cli("role").split("\n", 1)[0] == "master"]

    def url(self, prefix=None):
        q = f"?prefix={prefix}" if prefix else ""
        return "redis://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + q

    def close(self):
        for n in self.nodes:
            n.close()
        shutil.rmtree(self.dir, ignore_errors=True)


REDIS_SENTINEL = shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"


class Sentinels:
    """A master (AOF appendfsync always), `replicas` replicas of it and
    `count` Redis Sentinels watching it under the name `name`, all on free
    loopback ports. down_ms: how long the master may not answer before the
    sentinels fail it over (quorum 2)."""

    def __init__(self, name="kvp", replicas=1, count=3, down_ms=1000):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="kvpage-redis-sentinel-")
        self.down_ms = down_ms
        self.master = Redis(["--appendonly", "yes", "--appendfsync", "always"],
                            os.path.join(self.dir, "m"))
        self.replicas = [Redis(["--appendonly", "yes", "--appendfsync", "always"],
                               os.path.join(self.dir, f"r{i}")) for i in range(replicas)]
        self.sentinels = []
        self.count = count
        for n in [self.master] + self.replicas:
            os.makedirs(n.dir)

    def start(self):
        self.master.start()
        for r in self.replicas:
            r.args += ["--replicaof", "127.0.0.1", str(self.master.port)]
            r.start()
        for i in range(self.count):
            d = os.path.join(self.dir, f"s{i}")
            os.makedirs(d)
            self.sentinels.append(self._sentinel(d))
        deadline = time.monotonic() + 30
        while self.master_port() != self.master.port or not self.replicated():
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels or the replicas did not come up")
            time.sleep(0.05)
        return self

    def _sentinel(self, d):
        for _ in range(5):
            port = free_port()
            conf = os.path.join(d, "sentinel.conf")  # sentinels rewrite their file
            with open(conf, "w") as f:
                f.write(f"port {port}\nbind 127.0.0.1\ndir {d}\nprotected-mode no\n"
                        f"sentinel monitor {self.name} 127.0.0.1 {self.master.port} 2\n"
                        f"sentinel down-after-milliseconds {self.name} {self.down_ms}\n"
                        f"sentinel failover-timeout {self.name} 10000\n")
            proc = subprocess.Popen([REDIS_SENTINEL, conf, "--logfile",
                                     os.path.join(d, "sentinel.log")],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and proc.poll() is None:
                if _ping(port):
                    return (proc, port)
                time.sleep(0.02)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        raise RuntimeError("redis-sentinel did not start")

    def master_port(self):
        """The master's port as the first sentinel that answers says, or None."""
        for _, port in self.sentinels:
            r = subprocess.run([REDIS_CLI, "-p", str(port), "sentinel",
                                "get-master-addr-by-name", self.name],
                               capture_output=True, text=True, timeout=10)
            lines = r.stdout.split()
            if r.returncode == 0 and len(lines) == 2:
                return int(lines[1])
        return None

    def node(self, port):
        return next(n for n in [self.master] + self.replicas if n.port == port)

    def replicated(self):
        """True when the master at the sentinels' address has every
        replica connected and caught up."""
        port = self.master_port()
        if port is None:
            return False
        try:
            info = dict(line.split(":", 1) for line in
                        self.node(port).cli("info", "replication").splitlines() if ":" in line)
        except (RuntimeError, StopIteration):
            return False
        want = int(info.get("master_repl_offset", "-1"))
        got = [int(dict(kv.split("=") for kv in v.split(","))["offset"])
               for k, v in info.items() if k.startswith("slave") and "state=online" in v]
        if info.get("role") != "master" or len(got) != len(self.replicas) or \
                min(got, default=want) < want:
            return False
        # and it acknowledges (online is said before the replica has loaded)
        return not self.replicas or \
            self.node(port).cli("wait", str(len(self.replicas)), "100") == str(len(self.replicas))

    def url(self, query=""):
        return ("redis-sentinel://" + ",".join(f"127.0.0.1:{p}" for _, p in self.sentinels) +
                f"/{self.name}" + (f"?{query}" if query else ""))

    def close(self):
        for proc, _ in self.sentinels:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for n in [self.master] + self.replicas:
            n.close()
        shutil.rmtree(self.dir, ignore_errors=True)
