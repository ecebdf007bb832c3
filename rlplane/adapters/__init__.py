"""Adapters that report other frameworks' training runs to rlplane through ``rlplane.track``.

One module a framework, importing that framework at the top: ``rlplane.adapters.trl``
needs TRL (and so transformers and torch); nothing else in ``rlplane`` imports an adapter,
so a client-only install never pulls a framework in.
"""
