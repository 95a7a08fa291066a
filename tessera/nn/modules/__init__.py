"""The layers of ``tessera.nn``, one family per module."""
