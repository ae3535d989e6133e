"""Shipped topologies: YAML files of real machines and clusters (package data of treecoll)."""
