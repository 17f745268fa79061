#!/usr/bin/env python3
"""A TCPStore server that speaks PyTorch 2.x's protocol, written from PyTorch 2.6's TCPStoreBackend sources
(torch/csrc/distributed/c10d/TCPStoreBackend.{hpp,cpp} and TCPStoreLibUvBackend.cpp), standard library only.
It is the stand-in for torchrun 2.x's agent store in //test/comm:rendezvous_test, independent of ddp's own server.

What it does as 2.6 does:
  - query bytes: VALIDATE=0, SET=1, COMPARE_SET=2, GET=3, ADD=4, CHECK=5, WAIT=6, GETNUMKEYS=7, DELETE_KEY=8,
    APPEND=9, MULTI_GET=10, MULTI_SET=11, CANCEL_WAIT=12, PING=13;
  - a new connection must start with VALIDATE and the magic 0x3C85F7CE (no reply). The classic server closes a
    connection that starts otherwise ("Miscellaneous client without VALIDATE query"); --libuv mimics the libuv
    server, which ignores such a first request and answers nothing;
  - strings and vectors: u64 length + bytes; integers: int64, little-endian; ADD stores decimal text;
  - WAIT answers STOP_WAITING (0) once every key exists; CANCEL_WAIT answers WAIT_CANCELED (1); PING echoes its
    4-byte nonce; GET of a missing key closes the connection (classic) or answers an empty value (--libuv).
Prints the port it listens on, then serves until killed.
"""
import argparse
import selectors
import socket
import struct

VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY = range(9)
APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT, PING = range(9, 14)
MAGIC = 0x3C85F7CE


class NeedMore(Exception):
    pass


class Client:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.validated = False
        self.waiting = []  # WAIT keys still missing


class Cursor:
    def __init__(self, buf):
        self.buf, self.at = buf, 0

    def take(self, n):
        if len(self.buf) - self.at < n:
            raise NeedMore()
        out = self.buf[self.at:self.at + n]
        self.at += n
        return out

    def u8(self):
        return self.take(1)[0]

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def i64(self):
        return struct.unpack("<q", self.take(8))[0]

    def bytes(self):
        return self.take(self.u64())


def vec(b):
    return struct.pack("<Q", len(b)) + b


class Server:
    def __init__(self, libuv):
        self.libuv = libuv
        self.data = {}
        self.sel = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.sel.register(self.listener, selectors.EVENT_READ, None)

    def close(self, c):
        self.sel.unregister(c.sock)
        c.sock.close()
        c.closed = True

    def wake(self):
        for key in list(self.sel.get_map().values()):
            c = key.data
            if c is None or not c.waiting:
                continue
            c.waiting = [k for k in c.waiting if k not in self.data]
            if not c.waiting:
                c.sock.sendall(b"\x00")  # STOP_WAITING

    def one(self, c):
        """Handles the first whole request in c.buf; False when more bytes are needed or c closed."""
        r = Cursor(c.buf)
        q = r.u8()
        if not c.validated:
            if q != VALIDATE:
                if self.libuv:  # ignores it; answers nothing
                    c.buf = b""
                    return False
                self.close(c)  # classic: "Miscellaneous client without VALIDATE query is detected"
                return False
            if r.u32() != MAGIC:
                self.close(c)
                return False
            c.validated = True
        elif c.waiting:
            if q != CANCEL_WAIT:
                return False
            c.waiting = []
            c.sock.sendall(b"\x01")  # WAIT_CANCELED
        elif q == SET:
            k, v = r.bytes(), r.bytes()
            self.data[k] = v
            self.wake()
        elif q == COMPARE_SET:
            k, expected, desired = r.bytes(), r.bytes(), r.bytes()
            if k not in self.data:
                if expected:
                    c.sock.sendall(vec(expected))
                else:
                    self.data[k] = desired
                    c.sock.sendall(vec(desired))
            else:
                if self.data[k] == expected:
                    self.data[k] = desired
                c.sock.sendall(vec(self.data[k]))
            self.wake()
        elif q == GET:
            k = r.bytes()
            if k not in self.data and not self.libuv:
                self.close(c)  # classic: std::map::at throws
                return False
            c.sock.sendall(vec(self.data.get(k, b"")))
        elif q == ADD:
            k, delta = r.bytes(), r.i64()
            v = int(self.data.get(k, b"0")) + delta
            self.data[k] = str(v).encode()
            c.sock.sendall(struct.pack("<q", v))
            self.wake()
        elif q in (CHECK, WAIT):
            keys = [r.bytes() for _ in range(r.u64())]
            missing = [k for k in keys if k not in self.data]
            if q == CHECK:
                c.sock.sendall(b"\x01" if missing else b"\x00")
            elif missing:
                c.waiting = missing
            else:
                c.sock.sendall(b"\x00")
        elif q == GETNUMKEYS:
            c.sock.sendall(struct.pack("<q", len(self.data)))
        elif q == DELETE_KEY:
            k = r.bytes()
            c.sock.sendall(struct.pack("<q", 1 if self.data.pop(k, None) is not None else 0))
        elif q == APPEND:
            k, v = r.bytes(), r.bytes()
            self.data[k] = self.data.get(k, b"") + v
            self.wake()
        elif q == MULTI_GET:
            keys = [r.bytes() for _ in range(r.u64())]
            c.sock.sendall(b"".join(vec(self.data.get(k, b"")) for k in keys))
        elif q == MULTI_SET:
            n = r.i64()
            for _ in range(n):
                k, v = r.bytes(), r.bytes()
                self.data[k] = v
            self.wake()
        elif q == CANCEL_WAIT:
            c.sock.sendall(b"\x01")
        elif q == PING:
            c.sock.sendall(struct.pack("<I", r.u32()))
        else:
            self.close(c)  # unknown query
            return False
        c.buf = c.buf[r.at:]
        return True

    def serve(self):
        while True:
            for key, _ in self.sel.select():
                if key.data is None:
                    s, _ = self.listener.accept()
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    c = Client(s)
                    c.closed = False
                    self.sel.register(s, selectors.EVENT_READ, c)
                    continue
                c = key.data
                try:
                    got = c.sock.recv(65536)
                except OSError:
                    got = b""
                if not got:
                    self.close(c)
                    continue
                c.buf += got
                try:
                    while c.buf and not c.closed and self.one(c):
                        pass
                except NeedMore:
                    pass
                except OSError:
                    if not c.closed:
                        self.close(c)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--libuv", action="store_true", help="ignore a first request that is not VALIDATE, as libuv does")
    args = ap.parse_args()
    server = Server(args.libuv)
    print(server.listener.getsockname()[1], flush=True)
    server.serve()


if __name__ == "__main__":
    main()
