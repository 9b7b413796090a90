"""The wire protocol's registry as package data: installed as ``smartcache.wire.spec``.

``proto/protocol.toml`` is the one registry; a wheel carries it (and
PROTOCOL.md) so that an installed client finds it with ``importlib.resources``
(service/smartcache/wire/registry.py).
"""
