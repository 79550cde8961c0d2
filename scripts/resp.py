"""Just enough RESP (Redis's protocol) for the scripts and benches that talk to Redis
without a client library: a command encoded, and a client that sends commands and reads
their replies, one at a time or pipelined. Standard library only.
"""

import socket


def resp(*args):
    """One command, encoded: each argument as bytes, or as its text."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RespClient:
    """One connection to a Redis on 127.0.0.1."""

    def __init__(self, port, timeout=None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.file = self.sock.makefile("rb")

    def call(self, *args):
        self.sock.sendall(resp(*args))
        return self.read()

    def read(self):
        """The next reply: text, None, or a list of them; an error reply raises."""
        line = self.file.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b":"):
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2].decode()
        if kind == b"*":
            return [self.read() for _ in range(int(rest))]
        raise RuntimeError(f"unexpected Redis reply {line!r}")

    def pipelined(self, commands, depth=32):
        """Sends encoded `commands` `depth` at a time, skipping their replies."""
        for start in range(0, len(commands), depth):
            chunk = commands[start:start + depth]
            self.sock.sendall(b"".join(chunk))
            for _ in chunk:
                self.read()

    def close(self):
        self.sock.close()
