"""SHARDCAST weight broadcast: trainer (origin) → relays → inference nodes, signed and verified.

`origin.Origin` publishes each step; `relay.Relay` mirrors and re-serves; `client.Downloader`
fetches and verifies (`follow.follow` keeps an inference node on the newest step); `manifest`
signs and checks what is served, `payload` packs, hashes and unpacks it, `store` lays it out on
disk and serves it. The wire layout is the `shardcast` package's, so its relays and clients
interoperate. Importers name the submodule they use: this package re-exports nothing, so no
submodule's import of a sibling runs a module that imports it back.
"""
