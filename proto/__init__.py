"""The wire protocol's registry as package data: installed as ``smartcache_proto``.

``proto/protocol.toml`` is the one registry; a wheel carries it so that an
installed client (``service.client`` in a front server) finds it with
``importlib.resources``.
"""
