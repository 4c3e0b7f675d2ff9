"""ebb.indexer: producing windowed results and feeding them to the archive.

``synthetic`` generates realistic expiring records (sensor readings whose lifetime is their
polling period) for the demo and for tests.
"""
