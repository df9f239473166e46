"""Composition and runtime: the poller definition (source, store and handler put together),
loading an app, and the local schedule (`afdb run`)."""
