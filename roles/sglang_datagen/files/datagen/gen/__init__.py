"""The generate stage's internals (private to ``datagen.generate``).

``settings``: config section -> :class:`GenerateSettings`; ``journal``: the durable
append-only output, torn-tail repair and the resume index; ``progress``: the
progress file other processes read; ``client``: the asyncio/aiohttp engine;
``fleet``: behind a router, every configured worker routed to the whole run.
"""
